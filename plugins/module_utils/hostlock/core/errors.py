"""Errors and exit codes: one base class, each error carrying the lock directory or path it is about, and the
exit code each one means (the command line's, the modules' rc, the callback's refusals)."""

from __future__ import annotations

import errno as _errno


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


class FleetRefused(HostlockError):
    """The fleet's store answered, and refused a request hostlock does not expect it to refuse (its reason
    in the message): CLI exit 76, as for a store that cannot be used (fleet.etcd.EtcdError is one)."""


class LockLost(HostlockError):
    """A fleet lock this process held is gone (its lease expired or was revoked, or its key was deleted):
    whatever it protected may already be done by someone else. Stop acting on it."""


class FleetConfigError(HostlockError):
    """A fleet setting that cannot work, found before or at the first contact: a TLS or password file that
    is missing, unreadable or readable by other users, the URL's scheme against what the member speaks.
    Never retried (waiting cannot fix it); the message names the file or the scheme. CLI exit 78."""


# Exit codes of the command line, the modules' rc and the callback's refusals: one home for all.
# sysexits(3) values where flock(1) uses them, so scripts written for flock keep working.
EX_USAGE = 64  # bad command line: unknown option, invalid name, missing command
EX_DATAERR = 65  # lock error that is not an open failure: corrupt record, mechanism mismatch
EX_NOINPUT = 66  # cannot open the lock file or the lock directory
EX_UNAVAILABLE = 69  # the command could not be executed
EX_OSERR = 71  # operating-system error (out of memory, out of descriptors, fork failed)
EX_CANTCREAT = 73  # read-only file system, disk full
EX_TEMPFAIL = 75  # default exit code on conflict: "did not run, try later" (lckdo's choice; flock: -E 1)
EX_FLEET = 76  # the fleet (etcd) was unavailable within the wait: unreachable, no quorum, auth refused
EX_NOPERM = 77  # wrong or expired lease token; another user's lock
EX_CONFIG = 78  # a fleet setting that cannot work: TLS/password file missing or open to others, wrong scheme
EX_LOST = 79  # the fleet lock was lost while the job ran: the job was stopped, whatever its own status
EX_TIMEOUT = 124  # the job ran longer than --time-limit (timeout(1)'s code)


def errno_exit_code(err: int | None, default: int) -> int:
    """Exit code for an errno the way flock(1) maps open failures: 73 read-only/full, 71 resources."""
    if err in (_errno.EROFS, _errno.ENOSPC, _errno.EDQUOT):
        return EX_CANTCREAT
    if err in (_errno.ENOMEM, _errno.EMFILE, _errno.ENFILE, _errno.EAGAIN):
        return EX_OSERR
    return default


def error_exit_code(exc: BaseException) -> int:
    """Exit code of an engine or OS error; LockTimeout is handled by callers (it is -E CODE)."""
    if isinstance(exc, (InvalidName, InvalidDuration, InvalidFleetURL)):
        return EX_USAGE
    if isinstance(exc, FleetConfigError):
        return EX_CONFIG
    if isinstance(exc, (FleetUnavailable, FleetRefused)):
        return EX_FLEET
    if isinstance(exc, LockLost):
        return EX_LOST
    if isinstance(exc, TokenError):
        return EX_NOPERM
    if isinstance(exc, CorruptLockFile):
        return EX_DATAERR  # the file exists and opens: it is its content that is wrong
    if isinstance(exc, (LockDirectoryError, LockFileError)):
        return errno_exit_code(getattr(exc, "errno", None), EX_NOINPUT)
    if isinstance(exc, HostlockError):
        err = getattr(exc, "errno", None)
        if err in (_errno.EPERM, _errno.EACCES):  # e.g. breaking another user's lock
            return EX_NOPERM
        return errno_exit_code(err, EX_DATAERR)
    if isinstance(exc, PermissionError):
        return EX_NOPERM
    if isinstance(exc, OSError):
        return errno_exit_code(exc.errno, EX_OSERR)
    return EX_DATAERR


def describe_error(exc: BaseException) -> str:
    """One line for an error, adding the directory or path the engine attached when the text lacks it."""
    text = str(exc) or exc.__class__.__name__
    if isinstance(exc, OSError) and not getattr(exc, "directory", None) and exc.strerror:
        text = "%s%s" % (exc.strerror, ": %s" % exc.filename if exc.filename else "")
    where = getattr(exc, "path", None) or getattr(exc, "directory", None)
    if where and where not in text:
        text = "%s (%s)" % (text, where)
    return text.replace("\n", " ")
