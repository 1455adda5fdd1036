"""What goes out through OpenTelemetry: the emitter that drains the outbox into ``lock.wait`` /
``lock.hold`` spans and histogram values, the observable counters, the span processor that
counts spans started under a held lock, and the exit writer of the manifest.
"""
