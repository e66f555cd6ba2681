"""hostlock: on one host, work that must not overlap never overlaps.

Exclusive locks, shared locks and N-slot semaphores by name, on kernel locks that vanish with their holder
(Linux OFD locks; flock() elsewhere), served in arrival order, with an owner record that answers "who holds
it" and serves as the fallback mechanism where kernel locks are unavailable.
"""

from __future__ import annotations

from ._api import STATUS_SCHEMA, Lock, LockStatus, break_lock, holders, list_locks, status
from ._directory import SYSTEM_DIRECTORY, default_directory
from ._error import (
    CorruptLockFile,
    HostlockError,
    InvalidDuration,
    InvalidName,
    LockDirectoryError,
    LockFileError,
    LockTimeout,
    MechanismError,
    TokenError,
)
from ._names import MAX_DURATION, parse_duration, validate_name
from ._owner import Holder

__version__ = "0.1.0"


def hold(name: str, lease: float, **options: object) -> str:
    """Take `name` in a detached holder for `lease` seconds; see hostlock._lease.hold for the options.

    The lease code (and socket) loads only when used: the command line's `run` never pays for it.
    """
    from ._lease import hold as _hold

    return _hold(name, lease, **options)  # type: ignore[arg-type]


def renew(name: str, token: str, lease: float | None = None, directory: str | None = None) -> float:
    """Extend (or shorten) a lease to `lease` seconds from now; returns the new expiry (epoch)."""
    from ._lease import renew as _renew

    return _renew(name, token, lease, directory)


def release(name: str, token: str, directory: str | None = None) -> None:
    """End a lease: the lock is free when this returns."""
    from ._lease import release as _release

    _release(name, token, directory)


def prune_unused(older_than: float, directory: str | None = None, dry_run: bool = False) -> list:
    """Remove lock files nobody holds or waits for and nobody used for `older_than` seconds (hostlock._gc)."""
    from ._gc import collect

    return collect(directory or default_directory(), older_than, dry_run)


def token_id(token: str) -> str:
    """The public id of a lease token (what status shows); TokenError if it is malformed."""
    from ._lease import token_id as _token_id

    return _token_id(token)


__all__ = [
    "MAX_DURATION",
    "STATUS_SCHEMA",
    "SYSTEM_DIRECTORY",
    "CorruptLockFile",
    "Holder",
    "HostlockError",
    "InvalidDuration",
    "InvalidName",
    "Lock",
    "LockDirectoryError",
    "LockFileError",
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
