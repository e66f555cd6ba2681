"""A waiter in a fleet lock's queue (fleet.lock.EtcdLocker calls these once its key does not hold at once):
watch only what can admit it, check a stream that stays silent, read the queue again when told to; and the
rewrite by which a slot taker that waited tells the one behind it. A lock free at once never loads this.
"""

from __future__ import annotations

from ..core.errors import FleetUnavailable
from .b64 import b64, unb64
from .etcd import EtcdError, monotonic, prefix_end
from .queue import blockers, waits_on
from .watch import CHECK_ATTEMPT, CHECK_EVERY, check_deadline, open_watch

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Protocol

    from .etcd import Client
    from .queue import Entry
    from .session import Claim
    from .watch import Watch

    class EtcdLocker(Protocol):
        """fleet.lock.EtcdLocker as used here."""

        client: Client
        prefix: bytes
        path: str

        def _net_deadline(self, deadline: float | None) -> float: ...

        def _gone(self, session: Any, what: str) -> Exception: ...


def rewrite(client: Client, key: bytes, fence: int) -> None:
    """Tell the slot taker behind us, which may watch our key (`waits_on`), that we hold now: put our key
    again as it is (same value and lease; same create revision, so the same place and fence). Only a slot
    taker that waited does it: one that held at once held in every later read of the queue too, so nobody
    behind it watches it. Best effort: if etcd does not answer at once, that waiter's check of its silent
    watch (CHECK_EVERY) reads the queue and finds us holding."""
    try:
        client.call("kv/txn", {
            "compare": [{"key": b64(key), "target": "CREATE", "create_revision": str(fence)}],
            "success": [{"request_put": {"key": b64(key), "ignore_value": True, "ignore_lease": True}}]},
            monotonic() + CHECK_EVERY, min_try=0.0, attempt=CHECK_ATTEMPT)
    except (EtcdError, FleetUnavailable):
        pass


def wait(locker: EtcdLocker, before: list, me: Entry, rev: int, deadline: float | None, session: Claim) -> bool:
    """Wait for the keys ahead of us to go; True once none of them blocks us any more (we hold), False
    when the queue must be read again (a stream ended, a member stopped answering, the key watched was
    rewritten) or the deadline passed.

    The watch starts now and what it covers is read right after, so no change is missed. Keys created
    later are behind us, so the set of keys ahead only shrinks: tracking it from the events is exact, and
    the waiter holds the moment nothing ahead blocks it, without reading again (handoff = one delete + one
    watch event). It watches only what can admit it (`waits_on`), so a release wakes only the waiter it
    admits: one key for its deletion (etcd's waitDeletes; when that key goes and another still blocks,
    False: the caller reads again and watches the next); the whole name's deletions for the first slot
    taker not admitted; the slot taker just ahead, for its deletion or its rewrite, for the slot takers
    behind that one (False on either: read again, watch as the queue now says).
    """
    target, rewritten = waits_on([*before, me], len(before))
    whole = target is None or rewritten  # whether the read below must see every key ahead, not the target's
    # The first slot taker not admitted watches the deletions of the whole name, not the N keys ahead: keys
    # sort by lease id, not by create revision, so no key range holds just the keys ahead ([prefix, our
    # key) is a random subset of the name), and N keys would be N streams, each a connection of its own.
    # The name's deletions are the releases of its N holders, all ahead of it (each admits it), and the rare
    # waiter behind it that gives up (an event it ignores).
    key, end = (locker.prefix, prefix_end(locker.prefix)) if target is None else (target.key, None)
    filters: tuple = () if rewritten else ("NOPUT",)  # a rewrite is a put; otherwise deletions alone
    # Watch from now, then look: a change before the watch began is in the read below, one after it in
    # the stream. (A watch from the older revision `rev`+1 would be "unsynced" in etcd while others write,
    # and its first event wait for etcd's catch-up loop: up to 100 ms per wait under contention.)
    w = open_watch(locker.client, key, end, 0, locker._net_deadline(deadline), filters=filters, wake=(session.lost_r,))
    try:
        reply = locker.client.call("kv/range", _keys(locker, None if whole else target), locker._net_deadline(deadline))
        present = {unb64(kv.get("key")) for kv in reply.get("kvs") or []}
        if me.key not in present and whole:
            raise locker._gone(session, "our place in the queue of %s was deleted while waiting" % locker.path)
        ahead = [e for e in before if e.key in present or (not whole and e is not target)]
        if not blockers([*ahead, me], len(ahead)):
            return True
        if target is not None and target.key not in present:
            return False  # it went before the watch began; others still block: read the queue again
        if rewritten and not blockers(ahead, ahead.index(target)):
            return False  # it held before the watch began: we are the first not admitted now
        left = _watch_until(locker, w, target, rewritten, ahead, me, deadline, session)
    finally:
        w.close()
    # The watched key went and others ahead still block us (they may have gone unseen): read the queue
    # again and watch from the revision read. A watch from an older revision would cost etcd's
    # catch-up loop (up to 100 ms) per key, far more than one read.
    return left is not None and not blockers([*left, me], len(left))


def _watch_until(locker: EtcdLocker, w: Watch, target: Entry | None, rewritten: bool, ahead: list, me: Entry,
                 deadline: float | None, session: Claim) -> list | None:
    """The keys still ahead once `target` (or, watching the whole name, enough keys ahead) went; None when
    the queue must be read again (always, once a target watched for its rewrite changed). A stream silent
    for CHECK_EVERY is checked: a range (CHECK_ATTEMPT per member) tells whether the member it is on still
    answers and whether it missed a change, so a member that hangs (SIGSTOP) or a link that black-holes
    costs a waiter seconds, not its whole wait."""
    quiet_until = monotonic() + CHECK_EVERY
    while True:
        if session.lost:
            raise locker._gone(session, "lost our place in the queue of %s" % locker.path)
        now = monotonic()
        if deadline is not None and now >= deadline:
            return None
        try:
            evs = w.events(quiet_until if deadline is None else min(deadline, quiet_until))
        except OSError:  # WatchClosed among them: the stream ended
            return None  # the stream ended (member down, compaction): read again, watch from there
        if evs is None:
            if monotonic() >= quiet_until:
                if not _stream_ok(locker, w, target, rewritten, ahead, me):
                    return None
                quiet_until = monotonic() + CHECK_EVERY
            continue
        quiet_until = monotonic() + CHECK_EVERY
        if rewritten and target is not None and any(key == target.key for _kind, key, _kv in evs):
            return None  # it holds now, or left: read the queue again, watch as it says
        deleted = {key for kind, key, _kv in evs if kind == "DELETE"}
        if me.key in deleted:
            raise locker._gone(session, "our place in the queue of %s was deleted while waiting" % locker.path)
        if any(e.key in deleted for e in ahead):
            ahead = [e for e in ahead if e.key not in deleted]
            if target is not None or not blockers([*ahead, me], len(ahead)):
                return ahead


def _stream_ok(locker: EtcdLocker, w: Watch, target: Entry | None, rewritten: bool, ahead: list, me: Entry) -> bool:
    """Whether the watch `w` can be trusted on: its member answered a read now, and the read shows no change
    the stream has not reported (a key gone; for a target watched for its rewrite, that it holds, or that we
    do: a rewrite missed because its writer was killed first, or etcd did not take it, is found here). A
    member that does not answer within CHECK_ATTEMPT is skipped for the next (each member gets its attempt:
    the first asked is often the stream's own), so the read comes from a member that answers; the next watch
    opens there."""
    try:
        reply = locker.client.call("kv/range", _keys(locker, None if target is None or rewritten else target),
                                   check_deadline(locker.client), min_try=0.0, attempt=CHECK_ATTEMPT)
    except (FleetUnavailable, EtcdError):
        return True  # nobody answers: the lease's clock decides (the session), keep the stream meanwhile
    if locker.client.answering != w.i:
        return False  # the read came from another member: the stream's own member did not answer
    present = {unb64(kv.get("key")) for kv in reply.get("kvs") or []}
    if target is None:
        return all(e.key in present for e in ahead)
    if not rewritten:
        return target.key in present
    now = [e for e in ahead if e.key in present]
    return (target.key in present and bool(blockers([*now, me], len(now)))
            and bool(blockers(now, now.index(target))))


def _keys(locker: EtcdLocker, target: Entry | None) -> dict:
    """A read of `target`'s key, or of every key of the name (None): keys only, their values not needed."""
    if target is not None:
        return {"key": b64(target.key), "keys_only": True}
    return {"key": b64(locker.prefix), "range_end": b64(prefix_end(locker.prefix)), "keys_only": True}
