"""hostlock: work that must not overlap never overlaps, on one host or across a fleet.

Exclusive locks, shared locks and N-slot semaphores by name: on a host, on kernel locks that vanish with
their holder (Linux OFD locks; flock() elsewhere), served in arrival order, with an owner record that
answers "who holds it" and serves as the fallback mechanism where kernel locks are unavailable; across
hosts (fleet=URL), in etcd v3. This module is the public API; docs/layout.md maps the parts behind it.
"""

from __future__ import annotations

from .api import Lock, break_lock, fleet_backend, holders, list_locks, status
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
from .core.model import STATUS_SCHEMA, LockStatus
from .core.names import MAX_DURATION, parse_duration, validate_name
from .core.owner import Holder

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .host.directory import SYSTEM_DIRECTORY, default_directory

__version__ = "0.1.0"
_HOST_NAMES = ("SYSTEM_DIRECTORY", "default_directory")


def __getattr__(name: str) -> object:
    """SYSTEM_DIRECTORY and default_directory come from host/ on first use (PEP 562): importing the package
    (as `hostlock run --fleet` does, for hostlock.cli) loads no host mechanism."""
    if name in _HOST_NAMES:
        from .host import directory

        value = getattr(directory, name)
        globals()[name] = value
        return value
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__() -> list:
    return sorted(set(globals()) | set(_HOST_NAMES))


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
