"""hostlock: on one host, work that must not overlap never overlaps.

Exclusive locks, shared locks and N-slot semaphores by name, on kernel locks that vanish with their holder
(Linux OFD locks; flock() elsewhere), served in arrival order, with an owner record that answers "who holds
it" and serves as the fallback mechanism where kernel locks are unavailable.
"""

from __future__ import annotations

from .api import Lock, break_lock, hold, holders, list_locks, prune_unused, release, renew, status, token_id
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
from .host.directory import SYSTEM_DIRECTORY, default_directory

__version__ = "0.1.0"


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
