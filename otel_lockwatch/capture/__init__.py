"""What is patched, and what the patches run: lock proxies, the instrumented section and
semaphore methods, asyncio and multiprocessing locks, lock naming, and the optional C fast path.

Capture writes into ``record`` (statistics, held stacks, the lock-order graph, the outbox) and
never calls the OpenTelemetry SDK.
"""
