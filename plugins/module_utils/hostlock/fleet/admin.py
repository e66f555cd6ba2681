"""A fleet's Backend beyond taking a lock (fleet.lock.EtcdBackend calls these): who holds what (status,
list_locks), break_lock, and leases that outlive a process (hold, renew, release). Loaded when asked: a
lock taken and released (`hostlock run`) never loads it.
"""

from __future__ import annotations

import time

from ..core.errors import FleetUnavailable, HostlockError, TokenError
from ..core.names import check_duration, validate_name
from ..core.owner import build_record, parse_record, record_prefix
from .b64 import b64, unb64
from .etcd import NOT_FOUND, EtcdError, monotonic, prefix_end
from .grant import DEFAULT_TTL, grant
from .queue import Entry, blockers, in_order

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Protocol

    from ..core.errors import LockTimeout
    from ..core.holder import Holder
    from ..core.model import LockStatus
    from .etcd import Client
    from .url import FleetURL

    class EtcdBackend(Protocol):
        """fleet.lock.EtcdBackend as used here (named, not imported: fleet.lock imports this module)."""

        url: FleetURL
        client: Client

        def name_prefix(self, name: str) -> bytes: ...

        def locker(self, name: str, slots: int, ttl: float, on_lost: Any) -> Any: ...


# A wait that ran out names who holds the lock from one more read: a short one, so that a hung etcd does not
# keep the command past its wait (1 s per member, the first answer wins; none: the line names nobody).
BUSY_READ = 2.0


def _range(backend: EtcdBackend, prefix: bytes, within: float | None = None) -> list:
    body = {"key": b64(prefix), "range_end": b64(prefix_end(prefix)), "sort_target": "CREATE",
            "sort_order": "ASCEND"}
    if within is None:
        reply = backend.client.call("kv/range", body, monotonic() + DEFAULT_TTL)
    else:
        reply = backend.client.call("kv/range", body, monotonic() + within, min_try=0.0, attempt=1.0)
    return reply.get("kvs") or []


def _status(backend: EtcdBackend, name: str, entries: list) -> LockStatus:
    from ..core.model import LockStatus

    holders: list = []
    waiters = 0
    for i, e in enumerate(entries):
        if blockers(entries, i):
            waiters += 1
        else:
            # A semaphore's holders are numbered in arrival order, as host locks number their slots.
            holders.append(_holder(e, len(holders) if e.slots > 1 else None))
    slots = max([e.slots for e in entries] or [1])
    return LockStatus(name, backend.url.display(), backend.url.display(name), "etcd", slots, holders, waiters)


def status(backend: EtcdBackend, name: str, within: float | None = None) -> LockStatus:
    """Who holds `name` and how many wait; `within`: read for at most that long (a wait that ran out)."""
    validate_name(name)
    return _status(backend, name, in_order(_range(backend, backend.name_prefix(name), within)))


def busy(backend: EtcdBackend, name: str, timeout: float | None) -> LockTimeout:
    """The LockTimeout of a wait that ran out, naming the holders a short read finds. FleetUnavailable when
    etcd does not answer that read: whether the lock is busy cannot be told then (CLI 76, not 75)."""
    return status(backend, name, BUSY_READ).timed_out(timeout)


def list_locks(backend: EtcdBackend) -> list:
    prefix = backend.url.prefix.encode("utf-8")
    names: dict = {}
    for kv in _range(backend, prefix):
        e = Entry(kv)
        name, sep, _hex = e.key[len(prefix):].rpartition(b"/")
        if not sep:
            continue
        try:
            text = validate_name(name.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, HostlockError):
            continue  # a key of another program under our prefix must not hide every lock
        names.setdefault(text, []).append(e)
    return [_status(backend, n, sorted(names[n], key=lambda e: e.rev)) for n in sorted(names)]


def break_lock(backend: EtcdBackend, name: str, force: bool) -> list:
    """With force, end every holder of `name`: revoke its lease when this key is all the lease holds (an
    `etcdctl lock` session learns it so), else delete the key alone, so a process's other locks on its
    one lease stay held (hostlock watches each key: the holder learns it lost this lock).
    Without force: nothing in etcd is stale (an expired lease is already gone), so nothing to do."""
    validate_name(name)
    if not force:
        return []
    entries = in_order(_range(backend, backend.name_prefix(name)))
    acted = []
    for i, e in enumerate(entries):
        if blockers(entries, i):
            continue
        deadline = monotonic() + DEFAULT_TTL
        try:
            ttl = backend.client.call("lease/timetolive", {"ID": str(e.lease), "keys": True}, deadline)
            if len(ttl.get("keys") or ()) > 1:
                reply = backend.client.call("kv/txn", {
                    "compare": [{"key": b64(e.key), "target": "CREATE", "create_revision": str(e.rev)}],
                    "success": [{"request_delete_range": {"key": b64(e.key)}}]}, deadline)
                if not reply.get("succeeded"):
                    continue  # gone meanwhile
            else:
                backend.client.call("lease/revoke", {"ID": str(e.lease)}, deadline)
        except EtcdError as exc:
            if exc.code != NOT_FOUND:
                raise
            continue
        acted.append(_holder(e))
    return acted


# -- leases that outlive a process ------------------------------------------------------------------------
def hold(backend: EtcdBackend, name: str, lease: float, mode: str = "exclusive", slots: int = 1,
         label: str | None = None, timeout: float | None = None) -> str:
    """Take `name` for `lease` seconds on an etcd lease that outlives this process; returns the token.

    The wait runs on a short kept-alive lease (a waiter that dies leaves nothing for long); once held,
    the key moves onto a lease of TTL `lease`, and no process keeps it alive.
    """
    from ..core.model import MODES

    validate_name(name)
    lease = check_duration(lease, "lease", positive=True)
    if timeout is not None:
        timeout = check_duration(timeout, "timeout")
    if mode not in MODES:
        raise ValueError("mode must be 'exclusive' or 'shared', not %r" % (mode,))
    extra: dict[str, object] = {"slots": slots}
    if label:
        extra["label"] = label
    pre = record_prefix(mode, extra)
    locker = backend.locker(name, slots, DEFAULT_TTL, None)
    deadline = None if timeout is None else monotonic() + timeout
    held = locker.acquire(mode, True, deadline, lambda s, t: build_record(pre, s, t))
    if held is None:
        raise busy(backend, name, timeout)
    hexid = held.key.rsplit(b"/", 1)[-1].decode("ascii")
    granted: list = []
    try:
        _move(backend, held.key, held.fence, held.lease, lease, pre, hexid, granted)
        if held.session.stop():  # the wait's lease has this key no more: revoked if nothing else is on it
            locker._revoke(held.lease)
    except BaseException:
        # Failed or interrupted (a signal's exception: `hostlock hold` unwinds on SIGTERM) before the token
        # is returned: nobody could release the lock, so neither lease may outlive this, the new one
        # (our key may be on it already) nor the old.
        for new in granted:
            locker._revoke(new)
        locker.release(held)
        raise
    from ..core.tokens import fleet_token  # leases only: not on the path of a lock

    return fleet_token(hexid, held.fence)


def _move(backend: EtcdBackend, key: bytes, fence: int, old: int, seconds: float, pre: bytes | None, hexid: str,
          granted: list | None = None) -> float:
    """Put our key on a new lease of `seconds` (keeping its create_revision, hence the fence and its place);
    revoke nothing. Returns the expiry (epoch). TokenError "gone" if the key is no longer ours. The new
    lease's id is appended to `granted` as soon as it is known, for a caller that must undo the move."""
    c = backend.client
    deadline = monotonic() + DEFAULT_TTL
    reply = grant(c, seconds, deadline, [] if granted is None else granted)
    new = int(reply["ID"])
    expires = time.time() + float(reply.get("TTL") or seconds)
    value = _value_with_lease(backend, key, pre, hexid, expires, deadline)
    reply = c.call("kv/txn", {
        "compare": [{"key": b64(key), "target": "CREATE", "create_revision": str(fence)},
                    {"key": b64(key), "target": "LEASE", "lease": str(old)}],
        "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": str(new)}}]}, deadline)
    if not reply.get("succeeded") and not _on_lease(backend, key, fence, new, deadline):
        try:
            c.call("lease/revoke", {"ID": str(new)}, deadline)
        except (EtcdError, FleetUnavailable):
            pass
        raise TokenError("no lease etcd-%s on %s: it expired or was released" % (hexid, backend.url.display()),
                         reason="gone")
    return expires


def _on_lease(backend: EtcdBackend, key: bytes, fence: int, lease: int, deadline: float) -> bool:
    """Whether `key` (still of create revision `fence`) is on `lease`: a retried move whose first try
    went through (its answer lost) fails its compare, yet is done."""
    kvs = backend.client.call("kv/range", {"key": b64(key)}, deadline).get("kvs") or []
    return bool(kvs) and int(kvs[0].get("create_revision") or 0) == fence and int(kvs[0].get("lease") or 0) == lease


def _value_with_lease(backend: EtcdBackend, key: bytes, pre: bytes | None, hexid: str, expires: float,
                      deadline: float) -> bytes:
    if pre is None:  # renew: keep the record, update its lease expiry
        kvs = backend.client.call("kv/range", {"key": b64(key)}, deadline).get("kvs") or []
        old = unb64(kvs[0].get("value")) if kvs else b""
        fields = parse_record(old)
        if fields is None:
            return old
        line = old.split(b"\n", 1)[0]
        parts = [p for p in line.split(b"|") if not p.startswith((b"lease=", b"tid="))]
        return b"|".join(parts) + b"|tid=etcd-%s|lease=%.3f\n" % (hexid.encode(), expires)
    return build_record(pre, None)[:-1] + b"|tid=etcd-%s|lease=%.3f\n" % (hexid.encode(), expires)


def _token_key(backend: EtcdBackend, name: str, token: str) -> tuple:
    validate_name(name)
    from ..core.tokens import split_fleet

    hexid, rev = split_fleet(token)
    key = backend.name_prefix(name) + hexid.encode()
    kvs = backend.client.call("kv/range", {"key": b64(key)}, monotonic() + DEFAULT_TTL).get("kvs") or []
    if not kvs or int(kvs[0].get("create_revision") or 0) != rev:
        raise TokenError("no lease etcd-%s on lock %r in %s: it expired, was released or broken"
                         % (hexid, name, backend.url.display()), reason="gone")
    return key, rev, int(kvs[0].get("lease") or 0), hexid


def renew(backend: EtcdBackend, name: str, token: str, lease: float | None = None) -> float:
    """Extend a lease: to `lease` seconds from now on a new etcd lease (the key moves, keeping its place
    and fence), or by its own TTL again (a keep-alive) when `lease` is None. Returns the new expiry."""
    if lease is not None:
        lease = check_duration(lease, "lease", positive=True)
    key, rev, old, hexid = _token_key(backend, name, token)
    if lease is None:
        reply = backend.client.call("lease/keepalive", {"ID": str(old)}, monotonic() + DEFAULT_TTL)
        ttl = int((reply.get("result") or {}).get("TTL") or 0)
        if ttl <= 0:
            raise TokenError("no lease etcd-%s on lock %r: it expired" % (hexid, name), reason="gone")
        expires = time.time() + ttl
        value = _value_with_lease(backend, key, None, hexid, expires, monotonic() + DEFAULT_TTL)
        backend.client.call("kv/txn", {
            "compare": [{"key": b64(key), "target": "CREATE", "create_revision": str(rev)}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value), "ignore_lease": True}}]},
            monotonic() + DEFAULT_TTL)
        return expires
    expires = _move(backend, key, rev, old, lease, None, hexid)
    try:
        backend.client.call("lease/revoke", {"ID": str(old)}, monotonic() + DEFAULT_TTL)
    except EtcdError:
        pass
    return expires


def release(backend: EtcdBackend, name: str, token: str) -> None:
    """End a lease: the key is deleted (its lease revoked) when this returns."""
    _key, _rev, lease, hexid = _token_key(backend, name, token)
    try:
        backend.client.call("lease/revoke", {"ID": str(lease)}, monotonic() + DEFAULT_TTL)
    except EtcdError as e:
        if e.code != NOT_FOUND:
            raise
        raise TokenError("no lease etcd-%s on lock %r: it expired" % (hexid, name), reason="gone") from None


def _holder(e: Entry, slot: int | None = None) -> Holder:
    from ..core.holder import Holder  # the read side: status and busy messages only

    h = Holder(e.fields, e.mode, slot)
    h.fence = e.rev
    h.lease_id = e.lease_hex
    if e.fields is None:
        h.mode = "exclusive"
    return h
