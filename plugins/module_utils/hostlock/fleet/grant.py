"""Leases granted with ids we choose (see grant), for locks (fleet.lock) and leases alike (fleet.admin)."""

from __future__ import annotations

from ..core import oslite as os
from ..core.errors import FleetUnavailable
from ..core.model import FLEET_TTL
from .etcd import EtcdError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from ..core.model import Meanwhile
    from .etcd import Client

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
    `lid`: the id to ask for first (in `ids` already: a pipelined grant whose answer was not seen, asked
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
