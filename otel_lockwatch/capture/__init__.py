"""What is patched, and what the patches run: lock proxies, the instrumented section and
semaphore methods, asyncio and multiprocessing locks, lock naming, and the optional C fast path.

Capture writes into ``record`` (statistics, held stacks, the lock-order graph, the outbox) and
never calls the OpenTelemetry SDK. Its modules, lowest first:

- ``_naming``: lock classes by creation site, which creators are never watched, ``name_lock``.
- ``_fast_path``: which lock path runs (the C extension ``_speedups`` or the pure-Python
  reference), and the contract between the two.
- ``_dropped``: whether a held lock is gone (nobody can release it), asked by the order check.
- ``_bookkeeping``: the one routine per step of a lock's life (the order check, the try, the
  timed wait, the hold, the release), shared by every wrapper below.
- ``_ordered``: ``ordered()``, several locks taken in one canonical order that the order check
  knows.
- ``_threading``, ``_sections``, ``_asyncio``, ``_mp_locks``: the wrappers of each kind of lock.
- ``_distributed``: what distributed locks share (key templates, contention from the first
  attempt, leases, release failures); ``_redis`` and ``_filelock``: their wrappers, patched only
  where redis-py or filelock is installed.
- ``_multiprocess``: child processes' manifests, the spawn / forkserver bootstrap, pool sizes.
- ``_patches``: the one table of patch targets, installed and removed as a whole.
"""
