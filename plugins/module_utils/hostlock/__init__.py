# GENERATED from lib/hostlock/__init__.py by `make module-utils`: do not edit; edit lib/hostlock instead.
# SPDX-License-Identifier: GPL-3.0-or-later
"""hostlock: on one host, work that must not overlap never overlaps.

Exclusive locks, shared locks and N-slot semaphores by name, on kernel locks that vanish with their holder
(Linux OFD locks; flock() elsewhere), served in arrival order, with an owner record that answers "who holds
it" and serves as the fallback mechanism where kernel locks are unavailable.
"""

from __future__ import annotations

from ._api import Lock, LockStatus, break_lock, holders, list_locks, status
from ._directory import SYSTEM_DIRECTORY, default_directory
from ._error import (
    HostlockError,
    InvalidName,
    LockDirectoryError,
    LockFileError,
    LockTimeout,
    MechanismError,
    TokenError,
)
from ._names import parse_duration, validate_name
from ._owner import Holder

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """hold/renew/release load the lease code (and socket) only when used: the CLI's `run` never does."""
    if name in ("hold", "renew", "release"):
        from . import _lease

        return getattr(_lease, name)
    raise AttributeError("module 'hostlock' has no attribute %r" % name)


__all__ = [
    "SYSTEM_DIRECTORY",
    "Holder",
    "HostlockError",
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
    "release",
    "renew",
    "status",
    "validate_name",
]
