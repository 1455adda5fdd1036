"""CPython's own lock conformance suite (``test.lock_tests``) against the instrumented types.

Each class below reruns a stdlib suite with lockwatch instrumented for the whole class, and the
lock factories resolved at call time, so every lock a test creates is a watched one (a test
checks that, so the suite cannot pass by testing plain locks).
"""

from __future__ import annotations

import pickle
import threading
import unittest

import pytest

lock_tests = pytest.importorskip(
    "test.lock_tests", reason="CPython's test package is not installed"
)

from test.support import check_disallow_instantiation  # noqa: E402

from otel_lockwatch import LockwatchInstrumentor  # noqa: E402
from otel_lockwatch._session import RECORDER  # noqa: E402
from otel_lockwatch.capture._threading import LockProxy, RLockProxy  # noqa: E402


class _Instrumented(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        RECORDER.reset()
        cls._instrumentor = LockwatchInstrumentor()
        cls._instrumentor.instrument(manifest=False)

    @classmethod
    def tearDownClass(cls) -> None:
        cls._instrumentor.uninstrument()
        RECORDER.reset()
        super().tearDownClass()


class TestLock(_Instrumented, lock_tests.LockTests):
    locktype = staticmethod(lambda: threading.Lock())

    def test_is_instrumented(self) -> None:
        self.assertIs(type(self.locktype()), LockProxy)

    def test_proxy_type_disallows_instantiation(self) -> None:
        """Calling the proxy's type raises CPython's own error for the lock's type, naming it."""
        check_disallow_instantiation(self, type(self.locktype()))
        with pytest.raises(
            TypeError,
            match=r"^cannot create 'otel_lockwatch\.capture\._threading\.LockProxy' instances$",
        ):
            LockProxy(threading.Lock(), None)


class TestRLock(_Instrumented, lock_tests.RLockTests):
    locktype = staticmethod(lambda: threading.RLock())

    def test_is_instrumented(self) -> None:
        self.assertIs(type(self.locktype()), RLockProxy)

    def test_proxy_type_disallows_instantiation(self) -> None:
        """The RLock proxy's type refuses a bare call too, with the same message."""
        check_disallow_instantiation(self, type(self.locktype()))


class TestCondition(_Instrumented, lock_tests.ConditionTests):
    condtype = staticmethod(lambda *args, **kwargs: threading.Condition(*args, **kwargs))

    def test_is_instrumented(self) -> None:
        self.assertIs(type(self.condtype()._lock), RLockProxy)
        self.assertIs(type(self.condtype(threading.Lock())._lock), LockProxy)


class TestSemaphore(_Instrumented, lock_tests.SemaphoreTests):
    semtype = staticmethod(lambda *args, **kwargs: threading.Semaphore(*args, **kwargs))

    def test_is_instrumented(self) -> None:
        self.assertIn("_lockwatch_class", vars(self.semtype(2)))


class TestBoundedSemaphore(_Instrumented, lock_tests.BoundedSemaphoreTests):
    semtype = staticmethod(lambda *args, **kwargs: threading.BoundedSemaphore(*args, **kwargs))

    def test_is_instrumented(self) -> None:
        self.assertIn("_lockwatch_class", vars(self.semtype(2)))


class TestEvent(_Instrumented, lock_tests.EventTests):
    eventtype = staticmethod(lambda: threading.Event())


class TestBarrier(_Instrumented, lock_tests.BarrierTests):
    barriertype = staticmethod(lambda *args, **kwargs: threading.Barrier(*args, **kwargs))


class TestFactories(_Instrumented):
    """What the patched factories are, beyond the suites above."""

    def test_a_factory_kept_as_a_class_attribute_is_not_bound(self) -> None:
        """``threading.Lock`` / ``RLock`` are builtins or plain functions a class attribute does
        not bind (``make = threading.Lock``; ``self.make()``): neither does their replacement."""

        class Holder:
            make = threading.Lock
            make_reentrant = threading.RLock

        holder = Holder()
        self.assertIs(type(holder.make()), LockProxy)
        self.assertIs(type(holder.make_reentrant()), RLockProxy)

    def test_the_patched_factories_pickle_by_reference(self) -> None:
        """pickle saves ``threading.Lock`` / ``RLock`` / ``Condition.__init__`` by name, as it
        saves the originals (a spawn or forkserver ``Manager`` pickles its registry, which holds
        the factories), and loads them back as the very objects installed."""
        for patched in (threading.Lock, threading.RLock, threading.Condition.__init__):
            for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
                with self.subTest(patched=patched, protocol=protocol):
                    self.assertIs(pickle.loads(pickle.dumps(patched, protocol)), patched)

    def test_the_machinery_s_conditions_stay_plain_and_the_program_s_are_watched(self) -> None:
        """A ``Future`` (one per task of a pool) makes a Condition, which makes an RLock: the
        standard library's own, never watched (on the C path without a Python frame: the
        ``CreationGate``); a condition the program makes right after is watched as ever."""
        from concurrent.futures import Future

        for _ in range(3):  # the module's answer is cached after the first
            future_condition = Future()._condition
            self.assertNotIn("_lockwatch_class", vars(future_condition))
            self.assertIs(type(future_condition._lock), type(threading._CRLock()))
            mine = threading.Condition()
            self.assertIn("_lockwatch_class", vars(mine))
            self.assertIs(type(mine._lock), RLockProxy)
