"""The queue of a fleet lock, as etcd holds it: one key per taker (its value the owner record), ordered by
create revision, and the rule of who blocks whom (core.admission). Pure: no request to etcd here.
"""

from __future__ import annotations

from ..core import admission
from ..core.owner import parse_record
from .b64 import unb64


class Entry:
    """One key of a lock: a holder or a waiter."""

    __slots__ = ("key", "rev", "lease", "fields", "mode", "slots", "value")

    def __init__(self, kv: dict) -> None:
        self.key = unb64(kv.get("key"))
        self.rev = int(kv.get("create_revision") or 0)
        self.lease = int(kv.get("lease") or 0)
        self.value = unb64(kv.get("value"))
        self.fields = parse_record(self.value) if self.value else None
        f = self.fields or {}
        self.mode = "shared" if f.get("mode") == "shared" else "exclusive"
        try:
            self.slots = max(1, min(int(f.get("slots") or 1), 1 << 20))
        except ValueError:
            self.slots = 1

    @property
    def lease_hex(self) -> str:
        return self.key.rsplit(b"/", 1)[-1].decode("ascii", "replace")


def blockers(entries: list, i: int) -> list:
    """The entries that keep entries[i] from holding (empty: it holds). `entries` sorted by create_revision."""
    me = entries[i]
    # etcdctl's keys (no owner record) count as exclusive takers of one slot (Entry's defaults)
    return admission.blockers(entries[:i], me.mode, me.slots)


def waits_on(entries: list, i: int) -> tuple:
    """What entries[i], which does not hold, watches: (key, rewritten). key None: the deletion of any key of
    the name; rewritten: the key's rewrite (a put) wakes it as well as its deletion.

    - by default, the last key that blocks it, for its deletion (etcd's waitDeletes);
    - a slot taker whose key just ahead is a slot taker of the same N that holds: it is the first not admitted
      (exactly N takers ahead, all holding: the rule in core.admission), and any of them leaving admits it;
    - a slot taker whose key just ahead is a slot taker of the same N that waits too: it holds no sooner than
      that one (a taker of another kind that keeps that one out is ahead of both; N takers ahead of that one
      are N+1 ahead of it), and that one rewrites its key once it holds (fleet.waiting.rewrite): the rewrite, or
      the key's deletion, wakes exactly this waiter, which reads the queue again and is now the first not
      admitted (or holds).

    So a release wakes the slot taker it admits, and that one's rewrite the next, never the whole queue. A
    rewrite missed (its writer killed before it, or etcd did not take it) is found by the check of a silent
    watch (CHECK_EVERY: a read of the queue), and the key's deletion ends the watch anyway.
    """
    me = entries[i]
    if me.slots > 1 and i and entries[i - 1].slots == me.slots:
        ahead = entries[i - 1]
        return (ahead, True) if blockers(entries, i - 1) else (None, False)
    blocking = blockers(entries, i)
    return (blocking[-1] if blocking else None), False


def in_order(kvs: list | None) -> list:
    """A range's keys as Entries, in queue order (create revision)."""
    out = [Entry(kv) for kv in kvs or []]
    out.sort(key=lambda e: e.rev)
    return out
