"""The fleet queue rule (hostlock/fleet/queue.py blockers()), on keys as etcd returns them: who holds, who
waits, and behind whom. The same rule decides acquire() and status(), so both are checked here at once."""

from __future__ import annotations

import base64

import pytest

from hostlock.fleet.queue import Entry, blockers, in_order


def kv(rev: int, mode: str | None = "exclusive", slots: int = 1) -> dict:
    """A key of lock `x` created at `rev`: a hostlock record with mode/slots, or (mode None) etcdctl's empty value."""
    value = b"" if mode is None else b"HL1|pid=1|host=h|mode=%s|slots=%d|at=1.0\n" % (mode.encode(), slots)
    return {"key": base64.b64encode(b"hostlock/x/%x" % rev).decode(), "create_revision": str(rev),
            "value": base64.b64encode(value).decode() if value else None, "lease": str(rev)}


def holding(kvs: list) -> list:
    entries = in_order(kvs)
    return [e.rev for i, e in enumerate(entries) if not blockers(entries, i)]


@pytest.mark.parametrize("queue,holders", [
    ([kv(5), kv(3), kv(9)], [3]),  # exclusive: the lowest create revision, whatever order etcd listed them
    ([kv(3, "shared"), kv(4, "shared"), kv(5, "shared")], [3, 4, 5]),
    ([kv(3, "shared"), kv(4), kv(5, "shared")], [3]),  # a waiting writer blocks a later reader
    ([kv(3), kv(4, "shared"), kv(5, "shared")], [3]),
    ([kv(3, None), kv(4, "shared")], [3]),  # etcdctl lock (empty value) is an exclusive holder
    ([kv(3, "shared"), kv(4, None)], [3]),  # ... and an exclusive waiter
    ([kv(3, "exclusive", 2), kv(4, "exclusive", 2), kv(5, "exclusive", 2)], [3, 4]),
    ([kv(3, "exclusive", 3), kv(4, "exclusive", 3)], [3, 4]),
    ([kv(3, "exclusive", 2), kv(4, "shared")], [3]),  # a slot holder is not a reader
])
def test_who_holds(queue, holders):
    assert holding(queue) == holders


def test_an_exclusive_waiter_waits_for_the_last_key_ahead_and_a_slot_waiter_for_any():
    entries = in_order([kv(3), kv(4), kv(7)])
    assert [e.rev for e in blockers(entries, 2)] == [3, 4]  # watched: 4, the last one ahead (etcd's Mutex)
    slots = in_order([kv(3, "exclusive", 2), kv(4, "exclusive", 2), kv(7, "exclusive", 2)])
    assert [e.rev for e in blockers(slots, 2)] == [3, 4]  # either leaving frees a slot


def test_foreign_values_are_exclusive_holders_without_a_record():
    e = Entry({"key": base64.b64encode(b"hostlock/x/1f").decode(), "create_revision": "8",
               "value": base64.b64encode(b"not a record").decode(), "lease": "31"})
    assert e.mode == "exclusive" and e.slots == 1 and e.fields is None and e.lease_hex == "1f"
    bad = Entry({"key": base64.b64encode(b"hostlock/x/2").decode(), "create_revision": "9",
                 "value": base64.b64encode(b"HL1|pid=1|mode=exclusive|slots=lots\n").decode()})
    assert bad.slots == 1
