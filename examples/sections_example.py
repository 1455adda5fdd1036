"""The section pattern: an event path and a periodic sweep publish the same entities.

Both paths load an entity's state, send it to a subscriber and record it. Without
serialization the sweep can load OLD, the event path publish NEW, and the sweep then send OLD:
the subscriber's view regresses. Holding the entity's section from load to send prevents it,
with no lock object per entity: ``StripedSections`` is a fixed array of locks indexed by FNV-1a
of the entity id.

- the event path must publish, so it queues: ``with sections.lock(entity, timeout=...)``;
- the sweep runs again soon, so it yields: ``with sections.try_lock(entity) as held``.

Run it: ``python examples/sections_example.py`` (about one second). With ``--bench`` it instead
measures the uncontended cost of a section against a raw ``threading.Lock`` (about 20 s).
"""

from __future__ import annotations

import random
import sys
import threading
import time
import timeit

from otel_lockwatch import SectionReentryError, StripedSections
from otel_lockwatch.sections._fnv import fnv1a_32, hash_key, key_bytes


class Subscriber:
    """Receives (entity, version) messages in order and counts regressions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: dict[str, int] = {}
        self.messages = 0
        self.regressions = 0

    def send(self, entity: str, version: int) -> None:
        with self._lock:
            self.messages += 1
            if version < self.last.get(entity, -1):
                self.regressions += 1
            else:
                self.last[entity] = version


class Emitter:
    def __init__(self, entities: list[str]) -> None:
        self.sections = StripedSections(256, name="emitter")
        self.store = dict.fromkeys(entities, 0)  # the entity's current version
        self._store_lock = threading.Lock()
        self.subscriber = Subscriber()
        self.swept = {"published": 0, "skipped": 0}

    def _load_send_record(self, entity: str) -> None:
        version = self.store[entity]  # load
        time.sleep(0)  # give the other path every chance to interleave here
        self.subscriber.send(entity, version)  # send, record

    def change(self, entity: str) -> None:
        """A state change: update the store, then publish on the event path."""
        with self._store_lock:
            self.store[entity] += 1
        with self.sections.lock(entity, timeout=1.0):  # must go out: queue (bounded)
            self._load_send_record(entity)

    def sweep(self) -> None:
        """The periodic path: publish every entity whose section is free, skip the others."""
        for entity in self.store:
            with self.sections.try_lock(entity) as held:
                if not held:  # deferrable: a later sweep re-reads fresher state
                    self.swept["skipped"] += 1
                    continue
                self._load_send_record(entity)
                self.swept["published"] += 1


def main() -> None:
    entities = [f"unit-{i}" for i in range(400)]  # more entities than sections: some collide
    emitter = Emitter(entities)
    stop = threading.Event()

    def events(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            emitter.change(rng.choice(entities[:40]))  # a hot subset gets most events

    def sweeper() -> None:
        while not stop.wait(0.01):  # every 10 ms
            emitter.sweep()

    threads = [threading.Thread(target=events, args=(n,)) for n in range(3)]
    threads.append(threading.Thread(target=sweeper))
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # let the workload run for a second
    stop.set()
    for thread in threads:
        thread.join()

    sections = emitter.sections
    print(f"entities: {len(entities)} in {sections!r}")
    print(
        f"'unit-7' -> section {sections.index('unit-7')}; "
        f"'unit-19' -> section {sections.index('unit-19')}"
    )
    print(f"state changes published: {sum(emitter.store.values())}")
    print(f"sweep: {emitter.swept['published']} published, {emitter.swept['skipped']} skipped")
    print(
        f"subscriber: {emitter.subscriber.messages} messages, "
        f"{emitter.subscriber.regressions} regressions"
    )
    converged = all(emitter.subscriber.last.get(e, 0) == v for e, v in emitter.store.items())
    print(f"every entity's view converged on its latest state: {converged}")

    with sections.lock("unit-7"):
        try:
            with sections.lock("unit-7", timeout=1.0):
                pass
        except SectionReentryError as exc:
            print(f"re-entering one's own section raises at once: {exc}")
        print(f"statistics while holding it: {sections.statistics()}")


def bench() -> None:
    """Uncontended costs, interleaved and best-of-many so that a busy machine skews them less."""
    s = StripedSections(256, name="bench")
    raw = threading.Lock()
    key = "unit-123"
    s.index(key)  # warm the hash cache
    cases = {
        "raw threading.Lock acquire()+release()": "raw.acquire(); raw.release()",
        "with raw threading.Lock": "with raw: pass",
        "s.acquire(k) + s.release(k)": "s.acquire(key); s.release(key)",
        "with s.lock(k)": "with s.lock(key): pass",
        "with s.try_lock(k)": "with s.try_lock(key): pass",
        "s.index(k), cached": "s.index(key)",
        "hash_key(k), cached": "hash_key(key)",
        "fnv1a_32(key_bytes(k)), uncached": "fnv1a_32(key_bytes(key))",
    }
    names = {
        "s": s,
        "raw": raw,
        "key": key,
        "hash_key": hash_key,
        "fnv1a_32": fnv1a_32,
        "key_bytes": key_bytes,
    }
    timers = {name: timeit.Timer(stmt, globals=names) for name, stmt in cases.items()}
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(40):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(20_000) / 20_000 * 1e9)
    base = best["raw threading.Lock acquire()+release()"]
    print(f"key {key!r}; Python {sys.version.split()[0]}")
    for name, ns in best.items():
        print(f"{name:40s} {ns:7.0f} ns  {ns / base:5.1f}x a raw Lock pair")


if __name__ == "__main__":
    bench() if "--bench" in sys.argv[1:] else main()
