"""hostlock: work that must not overlap never overlaps, on one host or across a fleet.

Exclusive locks, shared locks and N-slot semaphores by name: on a host, on kernel locks that vanish with
their holder (Linux OFD locks; flock() elsewhere), served in arrival order, with an owner record that
answers "who holds it" and serves as the fallback mechanism where kernel locks are unavailable; across
hosts (fleet=URL), in etcd v3. This module is the public API; docs/layout.md maps the parts behind it.
"""

from __future__ import annotations

from .core.errors import (
    CorruptLockFile,
    FleetConfigError,
    FleetUnavailable,
    HostlockError,
    InvalidDuration,
    InvalidFleetURL,
    InvalidName,
    LockDirectoryError,
    LockFileError,
    LockLost,
    LockTimeout,
    MechanismError,
    TokenError,
)
from .core.model import STATUS_SCHEMA, LockStatus, fleet_backend
from .core.names import MAX_DURATION, parse_duration, validate_name

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .api import Lock
    from .core.holder import Holder
    from .host.directory import SYSTEM_DIRECTORY, default_directory
    from .queries import break_lock, holders, list_locks, status

__version__ = "0.1.0"
# Loaded on first use (PEP 562): importing the package, as `hostlock run` does for hostlock.cli, loads neither
# a host mechanism nor the read side (queries: status, holders, list_locks, break_lock; core.holder: a holder's
# proofs and texts), nor the policy (api: Lock; `run --fleet` sends its lease's grant first). Only from the command's
# bundle, whose code comes from a file held open since the start (cli/bundle.py): imported from files, they
# come now, so that a process that drops its privileges (or whose engine is upgraded under it) after importing
# hostlock still has them (as api.py imports the host mechanisms).
_LAZY = {"SYSTEM_DIRECTORY": "host.directory", "default_directory": "host.directory", "Holder": "core.holder",
         "status": "queries", "holders": "queries", "list_locks": "queries", "break_lock": "queries", "Lock": "api"}
if not getattr(getattr(globals().get("__spec__"), "loader", None), "PINNED", False):
    from .api import Lock  # noqa: F811
    from .core.holder import Holder  # noqa: F811
    from .queries import break_lock, holders, list_locks, status  # noqa: F811


def __getattr__(name: str) -> object:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    value = getattr(__import__(where, globals(), None, (name,), 1), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))


def hold(name: str, lease: float, *, mode: str = "exclusive", slots: int = 1, label: str | None = None,
         timeout: float | None = None, directory: str | None = None, mechanism: str = "auto",
         in_flight: bool = False, fleet: str | None = None) -> str:
    """Take `name` for `lease` seconds beyond this process; returns the token for renew()/release().

    On a host (lease.hold): a detached holder process. With `fleet=URL` (and mode, slots, label,
    timeout): an etcd lease of TTL `lease`, which outlives this process with no helper at all.
    The lease code (and socket) loads only when used: the command line's `run` never pays for it.
    """
    if fleet:
        if directory is not None or mechanism != "auto" or in_flight:
            raise ValueError("a fleet lease lives in etcd: give fleet= without directory=, mechanism= or in_flight=")
        return fleet_backend(fleet).hold(name, lease, mode, slots, label, timeout)
    from .lease import hold as _hold

    return _hold(name, lease, mode=mode, slots=slots, directory=directory, timeout=timeout, mechanism=mechanism,
                 label=label, in_flight=in_flight)


def renew(name: str, token: str, lease: float | None = None, directory: str | None = None, *,
          fleet: str | None = None) -> float:
    """Extend (or shorten) a lease to `lease` seconds from now; returns the new expiry (epoch)."""
    if fleet:
        return fleet_backend(fleet).renew(name, token, lease)
    from .lease import renew as _renew

    return _renew(name, token, lease, directory)


def release(name: str, token: str, directory: str | None = None, *, fleet: str | None = None) -> None:
    """End a lease: the lock is free when this returns."""
    if fleet:
        fleet_backend(fleet).release(name, token)
        return
    from .lease import release as _release

    _release(name, token, directory)


def prune_unused(older_than: float, directory: str | None = None, dry_run: bool = False) -> list:
    """Remove lock files nobody holds or waits for and nobody used for `older_than` seconds (host.gc)."""
    from .host.directory import default_directory
    from .host.gc import collect

    return collect(directory or default_directory(), older_than, dry_run)


def token_id(token: str) -> str:
    """The public id of a lease token (what status shows); TokenError if it is malformed."""
    from .core.tokens import token_id as _token_id  # leases only: importing hostlock does not load it

    return _token_id(token)


__all__ = [
    "MAX_DURATION",
    "STATUS_SCHEMA",
    "SYSTEM_DIRECTORY",
    "CorruptLockFile",
    "FleetConfigError",
    "FleetUnavailable",
    "Holder",
    "HostlockError",
    "InvalidDuration",
    "InvalidFleetURL",
    "InvalidName",
    "Lock",
    "LockDirectoryError",
    "LockFileError",
    "LockLost",
    "LockStatus",
    "LockTimeout",
    "MechanismError",
    "TokenError",
    "__version__",
    "break_lock",
    "default_directory",
    "hold",
    "holders",
    "list_locks",
    "parse_duration",
    "prune_unused",
    "release",
    "renew",
    "status",
    "token_id",
    "validate_name",
]
