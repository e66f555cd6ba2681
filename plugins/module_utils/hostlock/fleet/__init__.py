"""Fleet locks in etcd v3. Loaded only when a fleet URL is given (api loads it by name), so nothing of it
reaches a managed host in a module's payload."""

from __future__ import annotations

from .url import parse

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from ..core.model import Backend


def backend(url: str) -> Backend:
    """The Backend for a fleet URL, chosen once from its scheme (only etcd is built). The first one made for the
    URL of a grant sent early (fleet.grant.send_early) takes over its client, whose connection carries it."""
    parsed = parse(url)
    from .grant import take_client
    from .lock import EtcdBackend

    return EtcdBackend(parsed, take_client(url))
