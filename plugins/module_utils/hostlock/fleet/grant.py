"""Leases granted with ids we choose (see grant), for locks (fleet.lock) and leases alike (fleet.admin); and the
one grant a command sends early (send_early), before the modules that take the lock are even loaded."""

from __future__ import annotations

from ..core import oslite as os
from ..core.errors import FleetUnavailable
from ..core.model import FLEET_TTL
from .etcd import Client, EtcdError, monotonic

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from ..core.model import Meanwhile
    from .transport import Pending

DEFAULT_TTL = FLEET_TTL  # a lock's lease (core.model), and how long an admin call waits on etcd


LEASE_EXISTS = 9  # gRPC FAILED_PRECONDITION: "lease already exists" (a grant of an id already granted)


def lease_id() -> int:
    return (int.from_bytes(os.urandom(8), "big") >> 1) or 1  # 63 bits: etcd's ids are positive int64


def grant_body(ttl: float, lid: int) -> dict:
    # -(-x // 1): ceil(x) without `math` (a shared library on many builds: one dlopen less at start)
    return {"TTL": max(1, int(-(-ttl // 1))), "ID": str(lid)}


def grant(client: Client, ttl: float, deadline: float, ids: list, sent: list | None = None,
          meanwhile: Meanwhile | None = None, lid: int | None = None) -> dict:
    """Grant a lease of `ttl` seconds whose id we choose, appended to `ids` before it is asked for: a caller
    interrupted anywhere after (a signal's exception while the answer is on its way) still knows what to
    revoke; with an id of etcd's choosing, a lease granted but never seen would hold a key for a whole TTL.
    `lid`: the id to ask for first (in `ids` already: a grant of two_in_turn whose answer was not seen, asked
    again as call() asks again after a lost answer). `meanwhile`: see Client.call."""
    while True:
        if lid is None:
            lid = lease_id()
            ids.append(lid)
        try:
            return client.call("lease/grant", grant_body(ttl, lid), deadline, sent=sent, meanwhile=meanwhile)
        except EtcdError as e:
            if e.code != LEASE_EXISTS:
                raise
            # Our own grant, retried after its answer was lost: its TTL runs from a send earlier than `sent`
            # says. Give it up and take another id, rather than trust a clock started too late.
            try:
                client.call("lease/revoke", {"ID": str(lid)}, deadline)
            except (EtcdError, FleetUnavailable):
                pass
            lid = None


class Early:
    """A lease grant written before the lock that will use it exists (send_early): its client (the connection the
    grant is on, its answer unread), the id asked for, the TTL, and when it was sent."""

    __slots__ = ("url", "client", "lid", "ttl", "pending", "sent")

    def __init__(self, url: str, client: Client, lid: int, ttl: float, pending: Pending, sent: float) -> None:
        self.url, self.client, self.lid, self.ttl, self.pending, self.sent = url, client, lid, ttl, pending, sent


_EARLY: list = []  # the early grant this process sent and no lock has taken yet (at most one)


def send_early(url: str, ttl: float) -> None:
    """Write the lease grant a fleet lock on `url` with `ttl` will need, now: `hostlock run --fleet` sends it as
    soon as its options are read, and etcd commits it while the command loads the modules that take the lock
    (~1 ms of a ~17 ms run, which would otherwise come before the grant). The first backend made for `url`
    takes the client over (take_client) and its lock the grant (take): the queue transaction follows its answer,
    which is there by then, on the same connection (Client.two_in_turn). Never raises: a URL that
    does not parse, a member that cannot be reached, credentials refused... all are left to the lock's own
    acquisition, its retries, messages and exit codes. A grant no lock takes is revoked (drop)."""
    if _EARLY:
        return
    try:
        from .url import parse

        client = Client(parse(url))
        lid = lease_id()
        sent: list = []
        pending = client.send_first("lease/grant", grant_body(ttl, lid), monotonic() + DEFAULT_TTL, sent)
    except Exception:  # noqa: BLE001 - the acquisition says what is wrong, the one way it always does
        return
    if pending is not None:
        _EARLY.append(Early(url, client, lid, ttl, pending, sent[0]))


def take_client(url: str) -> Client | None:
    """The early grant's client, for the backend of its URL (its connection carries the grant)."""
    return _EARLY[0].client if _EARLY and _EARLY[0].url == url else None


def take(client: Client, ttl: float) -> Early | None:
    """The early grant on `client` for `ttl`, now the caller's (it reads the answer, or abandons it); None if
    there is none for them."""
    if _EARLY and _EARLY[0].client is client and _EARLY[0].ttl == ttl:
        return _EARLY.pop()
    return None


def drop() -> None:
    """The command is done, and no lock took the early grant (an error came first): revoke it, so that no lease
    is left to expire. Its answer is read first (within a second), so the revoke never overtakes the grant."""
    if not _EARLY:
        return
    early = _EARLY.pop()
    try:
        early.pending.conn.answer(min(early.pending.end, monotonic() + 1.0))
    except Exception:  # noqa: BLE001 - no answer: the revoke below may then find no such lease (it expires)
        pass
    early.pending.abandon()
    try:
        early.client.call("lease/revoke", {"ID": str(early.lid)}, monotonic() + 1.0)
    except Exception:  # noqa: BLE001 - best effort: the lease, which has no key, expires within its TTL anyway
        pass
