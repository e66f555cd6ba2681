"""Who holds what, and breaking a lock: status, holders, list_locks, break_lock (the read side of the API).

Lock (api.py) takes and releases; these read what the mechanisms left (owner records, kernel locks, a
fleet's keys) and prove holders alive and holding (core.holder) before anything acts on them. Loaded when
asked (`hostlock status`, lock_info, a busy message), never by a command that only takes a lock.
"""

from __future__ import annotations

import errno

from .core import oslite as os
from .core.errors import HostlockError, LockFileError
from .core.holder import Holder
from .core.model import LockStatus, fleet_backend
from .core.names import check_duration, validate_name
from .core.owner import parse_record

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .host.record import RecordMechanism


def _record_mechanism() -> RecordMechanism:
    from .host.record import RecordMechanism

    return RecordMechanism()


def _holder(fields: dict | None, mode: str, slot: int | None, *, held_by_kernel: bool,
            file: tuple | None = None, planted: str | None = None, path: str | None = None,
            channel: tuple | None = None) -> Holder:
    from .core.holder import Holder

    h = Holder(fields, mode, slot, file)
    h.path = path
    if planted:
        h.problem = planted
    if channel is not None:
        _lease_of(h, *channel)
    # Stale means break can act: a record proven dead (never one the kernel still holds), or an ended
    # lease whose holder is alive here and not disproven (root can prove it; another user's cannot be
    # examined, and break refuses them anyway). A forged record, one naming a process that does not hold
    # the lock, or one from another host or PID namespace is not stale: break would not act on it.
    h.stale = not h.forged and not planted and (
        (h.lease_expired and h.alive is True and h.verified is not False)
        or (h.alive is False and not held_by_kernel))
    return h


def _lease_of(h: Holder, dirfd: int, directory: str) -> None:
    """A host holder's lease as the holder itself keeps it (its socket file's time, host.channel.lease_end),
    proven to be that holder's when it has ended; no socket of the holder's uid, no lease."""
    from .host.channel import lease_end

    h.lease_expires, h.lease_proven = None, False
    if not h.token_id or not isinstance(h.pid, int) or h.uid is None or h.forged:
        return
    end, _proven = lease_end(dirfd, directory, h.token_id, h.pid, h.uid, prove=False)
    if end is not None and end <= _now():
        # Ended: shown (and acted on) only once proven this holder's, never another lease's named in its record.
        if h.verified is True:
            end, h.lease_proven = lease_end(dirfd, directory, h.token_id, h.pid, h.uid, prove=True)
        if not h.lease_proven:
            end = None
    h.lease_expires = end


def _now() -> float:
    import time

    return time.time()


def status(name: str, directory: str | None = None, *, fleet: str | None = None) -> LockStatus:
    """Holders and waiters of one lock, read without taking it; never creates anything."""
    validate_name(name)
    if fleet:
        return fleet_backend(fleet).status(name)
    import posixpath

    from .host.directory import default_directory, open_directory

    directory = posixpath.abspath(directory or default_directory())
    if not posixpath.lexists(directory):
        return LockStatus(name, directory, posixpath.join(directory, name + ".lock"), "none", 1, [], 0)
    dirfd = open_directory(directory)[0]
    try:
        return _status(dirfd, directory, name, _mechanism(dirfd, directory))
    finally:
        os.close(dirfd)


def _mechanism(dirfd: int, directory: str) -> str:
    """The directory's mechanism as its trusted marker records it, else the kernel's answer for it, as a
    process taking a lock there decides (host.directory.directory_mechanism): never a marker another user
    wrote, nor "nothing here" because no trusted marker is there yet (members lock without recording)."""
    from .host.directory import read_marker
    from .host.kernel import probe

    return read_marker(dirfd, directory) or probe(dirfd)


def _status(dirfd: int, directory: str, name: str, mechanism: str) -> LockStatus:
    import posixpath

    from .host.directory import open_lock_file
    from .host.lockers import KERNEL as _KERNEL

    if mechanism == "record":
        slots, entries = _record_mechanism().inspect(dirfd, name)
        holders = [_holder(f, m, s, held_by_kernel=False, file=fi, planted=pl, path=posixpath.join(directory, n),
                           channel=(dirfd, directory)) for f, m, s, n, fi, pl in entries]
        return LockStatus(name, directory, posixpath.join(directory, name + "~owner"), mechanism, slots, holders, 0)
    path = posixpath.join(directory, name + ".lock")
    if mechanism not in _KERNEL:
        return LockStatus(name, directory, path, mechanism, 1, [], 0)
    try:
        fd = open_lock_file(dirfd, name + ".lock", directory, False, create=False, write=False)
    except FileNotFoundError:
        return LockStatus(name, directory, path, mechanism, 1, [], 0)
    except LockFileError as e:  # a symlink, FIFO or device planted at the lock path: report it, never open it
        return LockStatus(name, directory, path, mechanism, 1, [], 0, problem=str(e))
    f = _KERNEL[mechanism].file_class(fd, path)
    try:
        st = os.fstat(fd)
        # A corrupt header (`problem`: nobody can lock the file until it is removed) still leaves the holders
        # the kernel shows: a header is text, a held lock is never reported free.
        slots, entries, tickets, problem = _KERNEL[mechanism].inspect(f)
    finally:
        f.close()
    # The lock every holder must hold, as the kernel lists it (its file's owner says nothing about them:
    # all lock the same file): OFD, a range of this file; flock(), this file or the slot's own file.
    records = [(parse_record(r) if r else None, m, s) for r, m, s in entries]
    holding = {fields.get("q") for fields, _m, _s in records if fields}
    holders = [_holder(fields, m, s, held_by_kernel=True, file=_held_range(dirfd, name, mechanism, st, s),
                       channel=(dirfd, directory)) for fields, m, s in records]
    waiters = len([t for t in tickets if str(t) not in holding])
    return LockStatus(name, directory, path, mechanism, slots, holders, waiters, problem=problem,
                      corrupt=problem is not None)


def _held_range(dirfd: int, name: str, mechanism: str, st: os.stat_result, slot: int | None) -> tuple | None:
    """(dev, ino, None, offset or None) of the kernel lock a holder of `slot` must hold: what proves it."""
    from .host.kernel import MAIN, SLOT0

    at = MAIN if slot is None else SLOT0 + slot
    if mechanism == "ofd":
        return (st.st_dev, st.st_ino, None, at)
    if slot is None:
        return (st.st_dev, st.st_ino, None, None)
    try:  # flock(): each slot is a file of its own (FlockFile)
        sst = os.stat("%s.lock.%d" % (name, at), dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return None  # cannot be told: unproven
    return (sst.st_dev, sst.st_ino, None, None)


def holders(name: str, directory: str | None = None, *, fleet: str | None = None) -> list:
    """The current holders of a lock (see Holder), for 'who holds it?'."""
    return status(name, directory, fleet=fleet).holders


def list_locks(directory: str | None = None, *, fleet: str | None = None) -> list:
    """Every lock in a directory that has a file (in a fleet: that has a key), held or not, sorted by name."""
    if fleet:
        return fleet_backend(fleet).list_locks()
    import posixpath

    from .host.directory import default_directory, open_directory

    directory = posixpath.abspath(directory or default_directory())
    if not posixpath.lexists(directory):
        return []
    dirfd = open_directory(directory)[0]
    try:
        mechanism = _mechanism(dirfd, directory)
        names = set()
        for entry in os.listdir(dirfd):
            if mechanism == "record":
                base, sep, kind = entry.partition("~")
                if sep and (kind == "owner" or kind.startswith("r~") or kind[:1] == "s"):
                    names.add(base)
            elif entry.endswith(".lock") and not entry.startswith("."):
                names.add(entry[:-5])
        out = []
        for n in sorted(names):
            try:
                out.append(_status(dirfd, directory, validate_name(n), mechanism))
            except (HostlockError, ValueError, OSError):
                continue  # a foreign or corrupt file must not hide every other lock
        return out
    finally:
        os.close(dirfd)


def break_lock(name: str, directory: str | None = None, force: bool = False, wait: float = 5.0, *,
               fleet: str | None = None) -> list:
    """Remove provably stale state (dead owners' files, ended leases); with force, end live holders too.

    Acts on kernel facts, never on a record alone: a record is removed only when its process is proven
    dead or, the record mechanism, alive without the record's file open (every holder keeps it open: one
    that does not never held it, a planted file), and a process is signalled (SIGTERM, then SIGCONT so a
    stopped one acts on it) only when proven, at that moment, to be the holder (alive with the recorded
    start time and boot id, in this PID namespace, its real uid the claimed one, the lock file open).
    Forged and unproven records never get a process signalled. Only holders of this user, unless we are
    root: the kernel's kill() check agrees.
    Waits up to `wait` seconds for ended holders to exit. With force, a lock file with a corrupt header is
    removed if nobody has it locked. Returns the holders removed or ended; `status()` afterwards says
    what the kernel still holds. With `fleet`, force revokes the holders' etcd leases (they learn it:
    LockLost); without force nothing is done.
    """
    from .core.holder import end_holders

    wait = check_duration(wait, "wait")
    if fleet:
        # In a fleet nothing is stale (etcd ends an expired lease itself): force revokes the holders' leases.
        return fleet_backend(fleet).break_lock(validate_name(name), force)
    st = status(name, directory)
    directory = st.directory
    acted = []
    if st.mechanism == "record":
        acted += _remove_dead_records(directory, name)
    targets = []
    for h in st.holders:
        if h.forged or h.problem or h.alive is False or not isinstance(h.pid, int):
            continue
        if not (h.lease_expired or force):
            continue
        if os.geteuid() != 0 and h.uid != os.geteuid():
            raise HostlockError("lock %r in %s is held by uid %s (%s): only that user or root can break it"
                                % (name, directory, h.uid, h.describe()), directory=directory, errno=errno.EPERM)
        targets.append(h)
    try:
        ended = end_holders(targets, wait)
    except PermissionError:
        raise HostlockError("not permitted to end a holder of lock %r: it belongs to another user" % name,
                            directory=directory, errno=errno.EPERM) from None
    acted += ended
    if st.corrupt and force:  # once its holders are ended: removed only while nobody has it locked
        _remove_corrupt(directory, name, st.mechanism)
    if ended and st.mechanism == "record":
        # An ended holder that died without cleaning up leaves its owner file: proven dead now, remove it.
        gone = {h.pid for h in ended}
        acted += [h for h in _remove_dead_records(directory, name) if h.pid not in gone]
    return acted


def _remove_dead_records(directory: str, name: str) -> list:
    from .host.directory import open_directory

    dirfd = open_directory(directory)[0]
    try:
        return _record_mechanism().remove_stale(dirfd, directory, name, _shared(dirfd))
    finally:
        os.close(dirfd)


def _remove_corrupt(directory: str, name: str, mechanism: str) -> None:
    """Unlink a lock file whose header is corrupt, only while holding a lock over the whole file.

    That lock conflicts with every holder and waiter (ofd: every range; flock: the file), so a file in use
    stays; a process that opened it before the unlink restarts on the new file (st_nlink 0).
    """
    import fcntl

    from .host.directory import open_directory, open_lock_file
    from .host.kernel import CONTENTION, F_OFD_SETLK, WHOLE_FILE

    dirfd = open_directory(directory)[0]
    try:
        filename = name + ".lock"
        fd = open_lock_file(dirfd, filename, directory, False, create=False)
        try:
            try:
                if mechanism == "ofd":
                    fcntl.fcntl(fd, F_OFD_SETLK, WHOLE_FILE)
                else:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in CONTENTION:
                    return  # in use: status keeps reporting it
                raise
            st, now = os.fstat(fd), os.stat(filename, dir_fd=dirfd, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                os.unlink(filename, dir_fd=dirfd)
        finally:
            os.close(fd)  # drops the whole-file lock, after the unlink
    except FileNotFoundError:
        pass
    finally:
        os.close(dirfd)


def _shared(dirfd: int) -> bool:
    return bool(os.fstat(dirfd).st_mode & 0o020)
