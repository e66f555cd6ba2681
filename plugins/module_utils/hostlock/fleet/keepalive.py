"""A fleet lease's upkeep, run by its keep-alive thread (fleet/session.py's Session): keep-alives every TTL/3, a
watch on each claim's key (deleted, or moved to another lease: that claim's loss), records written later
(`update_record(defer=True)`), and the deletion of keys released while etcd did not answer.

Loaded by the thread once its first sleep ends (KEY_WATCH_DELAY, 0.1 s), like `select` and fleet/watch.py: a
`hostlock run --fleet` whose job is shorter never loads it (its code was ~20 KB of the ~290 KB a run unmarshals
at its start). It works on the session it is given and imports nothing of fleet/session.py, whose thread calls
it: the arrows point one way.
"""

from __future__ import annotations

import select

from ..core.clock import boottime
from ..core.errors import FleetUnavailable
from .b64 import b64
from .etcd import ATTEMPT, EtcdError, monotonic
from .watch import CHECK_ATTEMPT, CHECK_EVERY, check_deadline, open_watch

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    from .watch import Watch

_INF = float("inf")


def record_request(held: Any, data: bytes) -> dict:
    """The transaction that replaces our record (held: an EtcdHeld), only while the key is still ours (same
    create_revision): never one that recreates a key deleted meanwhile (its lease is in the put, but the compare
    fails first)."""
    return {"compare": [{"key": b64(held.key), "target": "CREATE", "create_revision": str(held.fence)}],
            "success": [{"request_put": {"key": b64(held.key), "value": b64(data), "lease": str(held.lease)}}]}


def _attempt(session: Any) -> float:
    """How long one member gets: a quarter of the TTL (a member stuck on a dead leader holds a request ~6 s
    before answering 503), so the others are asked while the lease still lives."""
    return max(0.2, min(session.ttl / 4.0, ATTEMPT))


def upkeep(session: Any, interval: float, watch_delay: float) -> None:
    """The keep-alive thread's loop, until the session is stopped or lost: a keep-alive every `interval`, a
    claim's key watched `watch_delay` after it was made (Claim.watch_key), each deferred record written when due."""
    next_ka = session.ok_at + interval
    watches: dict = {}  # claim -> the Watch on its key
    check_at = boottime() + CHECK_EVERY  # when the watches are checked next (_check_watches)
    try:
        while True:
            with session._mutex:
                if session._stopped or session._lost:
                    return
                claims = list(session.claims)
            session._drain()
            now = boottime()
            if now >= session.expires:
                session._lose_all("no keep-alive was answered within the lease's TTL (%gs)" % session.ttl,
                                  unavailable=True)
                return
            if now >= next_ka:
                next_ka = _keepalive(session, interval)
                if session._lost:
                    return
                if any(w.i != session.client.answering for w in watches.values()):
                    # The keep-alive was answered by another member: the one our watches are on may hang
                    # (SIGSTOP, a black hole) and would never report a key's deletion. Watch where the
                    # keep-alive got through (each reopen reads the key first: nothing is missed).
                    for w in watches.values():
                        w.close()
                    watches = {}
                continue
            for claim in [c for c in watches if c not in claims or c._lost]:
                watches.pop(claim).close()  # released, or lost by its own key: nothing more to watch
            if watches and now >= check_at:
                _check_watches(session, watches, next_ka)
                check_at = boottime() + CHECK_EVERY
                continue
            wake_at = next_ka  # the keep-alive's time comes first: an open below never passes it
            if session.orphans and not _delete_orphans(session, next_ka):
                wake_at = min(wake_at, boottime() + 0.5)  # try again soon, never in a hot loop
            for claim in claims:
                if claim.later is not None:
                    wake_at = min(wake_at, _write_later(session, claim, next_ka))
                if claim.key is None:  # being queued: its watch_key() comes with etcd's answer
                    wake_at = min(wake_at, now + watch_delay)  # waking us then would slow a job's start
                    continue
                if not claim._lost and claim not in watches:
                    if claim.watch_at > now:
                        wake_at = min(wake_at, claim.watch_at)
                        continue
                    w = _open_watch(session, claim, next_ka)
                    if w is not None:
                        watches[claim] = w
                    elif not claim._lost:
                        # Could not watch now: try again after a pause (never a hot loop against etcd);
                        # keep-alives go on meanwhile, and so do the watches that are open.
                        wake_at = min(wake_at, boottime() + 0.5)
            if watches:  # the watches as they are now, those opened just above included
                wake_at = min(wake_at, check_at)
            pause = wake_at - boottime()
            socks = {w.sock: claim for claim, w in watches.items() if w.sock is not None}
            # What select() cannot see: a message read along with an earlier one (a key deleted before its
            # watch opened: etcd's "created" and the DELETE can come in one segment), or a whole TLS record
            # already read from the socket.
            ready = [claim for claim, w in watches.items()
                     if w.buffered() or (getattr(w.sock, "pending", None) and w.sock.pending())]
            if not ready:
                got = select.select([session._stop_r, *socks], [], [], max(0.0, pause))[0]
                ready = [socks[s] for s in got if s in socks]
            for claim in ready:
                w = watches[claim]
                try:
                    evs = w.events(monotonic() + 0.05)
                except OSError:  # WatchClosed among them: the stream ended
                    watches.pop(claim).close()  # reopened after reading the key again: nothing is missed
                    continue
                _check(session, claim, evs)
    finally:
        for w in watches.values():
            w.close()


def _check_watches(session: Any, watches: dict, next_ka: float) -> None:
    """Check the key watches, which say nothing while the key stays ours (fleet/watch.py, CHECK_EVERY): read
    each key through the client, each member getting CHECK_ATTEMPT (never past the next keep-alive). A watch
    whose member did not answer, or whose key the read shows gone or moved, is closed: _open_watch reopens it
    where the read was answered, reading the key first, and a key gone or moved there is that claim's loss.
    The keep-alives alone would move the watches only every TTL/3: a holder would learn of its key's deletion
    (a `break --force`) that late, while the next holder ran. Nobody answering: the lease's clock decides; the
    streams are kept meanwhile."""
    client = session.client
    deadline = min(check_deadline(client), monotonic() + max(0.05, next_ka - boottime()))
    for claim, w in list(watches.items()):
        try:
            reply = client.call("kv/range", {"key": b64(claim.key), "keys_only": True}, deadline, min_try=0.0,
                                attempt=CHECK_ATTEMPT)
        except (FleetUnavailable, EtcdError):
            return
        kvs = reply.get("kvs") or []
        if client.answering != w.i or not kvs or int(kvs[0].get("lease") or 0) != session.lease:
            watches.pop(claim).close()


def _moved(claim: Any, key: bytes) -> None:
    claim._lose("our key %s was moved to another lease" % key.decode("utf-8", "replace"))


def _check(session: Any, claim: Any, evs: list | None) -> None:
    for kind, key, kv in evs or ():
        if key != claim.key:
            continue
        if kind == "DELETE":
            claim.key_deleted()
            return
        if int(kv.get("lease") or 0) != session.lease:
            _moved(claim, key)
            return


def _keepalive(session: Any, interval: float) -> float:
    """One keep-alive; returns when the next one is due."""
    box = [boottime()]
    try:
        reply = session.client.call("lease/keepalive", {"ID": str(session.lease)},
                                    monotonic() + max(0.0, session.expires - box[0]), min_try=0.0,
                                    attempt=_attempt(session), sent=box)
    except (FleetUnavailable, EtcdError):
        return boottime() + min(interval, 0.25)  # retry soon: the loss deadline runs on
    result = reply.get("result") or {}
    try:
        ttl = int(result.get("TTL") or 0)
    except ValueError:
        ttl = 0
    sent = box[0]
    if ttl <= 0:
        session._lose_all("etcd says our lease %x is gone (expired or revoked)" % session.lease)
        return sent
    with session._mutex:
        session.ok_at = max(session.ok_at, sent)
    return sent + interval


def _delete_orphans(session: Any, next_ka: float) -> bool:
    """Delete the orphaned keys that etcd lets us delete now; False while some are left to try again."""
    with session._mutex:
        orphans = list(session.orphans)
    for compare in orphans:
        key = compare[0]["key"]
        try:
            session.client.call("kv/txn", {"compare": compare, "success": [{"request_delete_range": {"key": key}}]},
                                monotonic() + max(0.05, next_ka - boottime()), min_try=0.0,
                                attempt=_attempt(session))
        except (EtcdError, FleetUnavailable):
            continue
        with session._mutex:
            session.orphans.remove(compare)
    return not session.orphans


def _write_later(session: Any, claim: Any, next_ka: float) -> float:
    """Write the record claim.later holds once it is due; returns when to look again (inf: nothing left)."""
    pending = claim.later
    if pending is None:
        return _INF
    held, data, due = pending
    if boottime() < due:
        return due
    with claim.writing:
        if claim.later is not pending:  # replaced by a later one, or by a write of the caller's own
            return _INF if claim.later is None else claim.later[2]
        try:
            reply = session.client.call("kv/txn", record_request(held, data),
                                        monotonic() + max(0.05, next_ka - boottime()), min_try=0.0,
                                        attempt=_attempt(session))
        except (EtcdError, FleetUnavailable):
            return boottime() + 0.5  # again after a pause, as for a watch that could not open
        with claim._mutex:
            if claim.later is pending:
                claim.later = None
        if reply.get("succeeded"):
            held.value = data
            return _INF
    claim.key_deleted()
    return _INF


def _open_watch(session: Any, claim: Any, next_ka: float) -> Watch | None:
    key = claim.key
    if key is None:  # not yet created: nothing to watch
        return None
    deadline = monotonic() + max(0.05, next_ka - boottime())
    if claim._from:
        # First watch: from the revision after our key's creation, every change of it arrives (a
        # compacted start cancels the watch; the reopen below then reads the key first).
        start, claim._from = claim._from, 0
        try:
            return open_watch(session.client, key, None, start, deadline, filters=(), wake=(session._stop_r,),
                              min_try=0.0)
        except (FleetUnavailable, EtcdError, OSError):
            return None
    try:
        # Read the key first, then watch from the revision read: whatever happened before (while the
        # stream was down, or compacted away) is in the read, whatever happens after is in the stream.
        reply = session.client.call("kv/range", {"key": b64(key)}, deadline, min_try=0.0, attempt=_attempt(session))
        kvs = reply.get("kvs") or []
        if not kvs:
            claim.key_deleted()
            return None
        if int(kvs[0].get("lease") or 0) != session.lease:
            _moved(claim, key)
            return None
        rev = int((reply.get("header") or {}).get("revision") or 0)
        return open_watch(session.client, key, None, rev + 1, deadline, filters=(), wake=(session._stop_r,),
                          min_try=0.0)
    except (FleetUnavailable, EtcdError, OSError):
        return None
