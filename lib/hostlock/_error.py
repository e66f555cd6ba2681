"""Exceptions: one base class, each error carrying the lock directory or path it is about."""

from __future__ import annotations


class HostlockError(Exception):
    """Base of every hostlock error, so a caller can catch them all in one place."""

    def __init__(self, message: str, *, path: str | None = None, directory: str | None = None,
                 errno: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.directory = directory
        self.errno = errno


class LockTimeout(HostlockError, TimeoutError):
    """Not acquired in time; `holders` says who had it when we gave up."""

    def __init__(self, message: str, *, holders: list | None = None, waiters: int = 0, path: str | None = None,
                 directory: str | None = None, errno: int | None = None) -> None:
        super().__init__(message, path=path, directory=directory, errno=errno)
        self.holders = holders or []
        self.waiters = waiters


class InvalidName(HostlockError, ValueError):
    """A lock name outside the documented character set or length."""


class InvalidDuration(HostlockError, ValueError):
    """A duration (lease, timeout) that is not a number, negative, NaN, or longer than MAX_DURATION."""


class LockDirectoryError(HostlockError):
    """The lock directory is missing, unwritable, or not trustworthy (owner, mode, symlink)."""


class LockFileError(HostlockError):
    """The lock path is not a regular file we may use (symlink, FIFO, device, unreadable)."""


class CorruptLockFile(LockFileError):
    """A lock file whose header is not hostlock's (overwritten, or another program's file): exit 65."""


class TokenError(HostlockError):
    """A lease token that is malformed, wrong, or whose lease already ended.

    `reason` tells callers which, without parsing the message: "malformed", "refused" (a wrong token for
    a live lease), or "gone" (released, expired, or its holder died).
    """

    def __init__(self, message: str, *, reason: str = "refused", path: str | None = None,
                 directory: str | None = None, errno: int | None = None) -> None:
        super().__init__(message, path=path, directory=directory, errno=errno)
        self.reason = reason


class MechanismError(HostlockError):
    """The requested lock mechanism cannot work here, or disagrees with the directory's."""


class InvalidFleetURL(HostlockError, ValueError):
    """A fleet URL that does not parse (scheme, members, prefix, options): a usage error, exit 64."""


class FleetUnavailable(HostlockError):
    """The fleet's store could not be used in time: unreachable, no quorum, or authentication refused.

    The message names the endpoints tried; `endpoints` holds them ("host:port,..."). Nothing half-taken is
    left behind: a waiter's key is deleted, or expires with its lease.
    """

    def __init__(self, message: str, *, endpoints: str = "", path: str | None = None,
                 directory: str | None = None, errno: int | None = None) -> None:
        super().__init__(message, path=path, directory=directory, errno=errno)
        self.endpoints = endpoints


class LockLost(HostlockError):
    """A fleet lock this process held is gone (its lease expired or was revoked, or its key was deleted):
    whatever it protected may already be done by someone else. Stop acting on it."""


class FleetConfigError(HostlockError):
    """A fleet setting that cannot work, found before or at the first contact: a TLS or password file that
    is missing, unreadable or readable by other users, the URL's scheme against what the member speaks.
    Never retried (waiting cannot fix it); the message names the file or the scheme. CLI exit 78."""
