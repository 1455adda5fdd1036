"""Types of the optional C fast path (``_speedups.c``); see ``_fast_path``."""

from collections.abc import Callable
from typing import Any

class LockBase:
    _lw_lock: Any
    _lockwatch_class: Any
    # The hold's members are named at setup() by _bookkeeping.HOLD_FIELDS.
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def acquire_lock(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def __enter__(self) -> bool: ...
    def release(self) -> None: ...
    def release_lock(self) -> None: ...
    def __exit__(self, *args: Any) -> None: ...

class RLockBase(LockBase):
    _lw_depth: int

class SectionAcquire:
    __wrapped__: Callable[..., bool]
    def __init__(
        self, original: Callable[..., bool], python: Callable[..., bool], globals: Any = ...
    ) -> None: ...
    def __call__(self, *args: Any) -> bool: ...

class SectionRelease:
    __wrapped__: Callable[..., None]
    def __init__(
        self,
        original: Callable[..., None],
        python: Callable[..., None],
        globals: Any = ...,
        mirror: bool = ...,
    ) -> None: ...
    def __call__(self, *args: Any) -> None: ...

def claim() -> bool: ...
def setup(
    *,
    tls: Any,
    context: Callable[[], Any],
    failed: Callable[[BaseException], None],
    check_order: Callable[..., None],
    lock_wait: Callable[..., bool],
    record_hold: Callable[..., None],
    worker_state: tuple[type, tuple[str, ...]],
    stats: tuple[type, tuple[str, ...]],
    hold: tuple[type, tuple[str, ...]],
) -> None: ...
def setup_locks(
    *,
    python_acquire: Callable[..., bool],
    python_rlock_acquire: Callable[..., bool],
    skip_frames: tuple[dict[str, Any], ...],
) -> None: ...
def setup_sections(
    *,
    section_wait: Callable[..., bool],
    track: tuple[type, tuple[str, ...]],
    array: tuple[type, tuple[str, ...]],
) -> None: ...
def set_hold_metric_ns(ns: int, /) -> None: ...
def direct_slots() -> dict[str, bool]: ...
def now_ns() -> int: ...
