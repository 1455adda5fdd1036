"""The outbox's records: one layout (``_outbox.RECORD_FIELDS``), whichever path queues them.

A hold at or above the metric floor and below the span threshold is queued by the C path itself
(``_speedups.c``'s ``hold_queued``: no Python on the releasing thread, which is on every waiter's
critical path) and by ``Outbox.put`` on the Python path; the emitter unpacks both alike.
"""

from __future__ import annotations

import threading

from otel_lockwatch.record._outbox import RECORD_FIELDS, Outbox

SPAN_MS = 60_000


def test_a_holds_record_is_the_one_outbox_put_makes(make_watched):
    w = make_watched(hold_metric_floor_ms=0, hold_span_threshold_ms=SPAN_MS)
    emitted: list[tuple] = []
    w.session.emitter.emit = lambda *record: emitted.append(record)  # what the emitter drains
    lock = threading.Lock()
    for _ in range(3):  # the first record starts the outbox (Python); then the path's own
        with lock:
            pass
    w.session.emitter.flush()
    holds = [record for record in emitted if record[0] == "lock.hold"]
    assert len(holds) == 3
    assert {record[1] for record in holds} == {lock._lockwatch_class}

    made = Outbox()
    made.accepting = made.started = True
    for record in holds:
        name, lock_class, start_ns, end_ns, context = record[:5]
        made.put(name, lock_class, start_ns, end_ns, context, None, SPAN_MS * 10**6, None, None)
    assert list(made.queue) == holds
    assert all(len(record) == len(RECORD_FIELDS) for record in holds)
    assert all(record[2] <= record[3] for record in holds)


def test_no_hold_is_queued_while_nothing_consumes_the_outbox(make_watched):
    w = make_watched(hold_metric_floor_ms=0, hold_span_threshold_ms=SPAN_MS)
    lock = threading.Lock()
    with lock:
        pass  # the outbox started
    w.session.emitter.flush()
    outbox = w.session.outbox
    outbox.accepting = False
    try:
        for _ in range(3):
            with lock:
                pass
        assert len(outbox.queue) == 0
    finally:
        outbox.accepting = True
