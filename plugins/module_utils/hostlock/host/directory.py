"""Where locks live, and refusing any directory or lock path another user could have planted.

The system directory is shared by root and an admitted group (mode 3770: setgid so files get the group,
sticky so nobody removes another user's files). A user who cannot use it gets a per-user directory; every
error and status report names the directory in use, so a root playbook and a user's cron job never miss
each other silently.
"""

from __future__ import annotations

import errno
import os
import stat

from ..core.errors import LockDirectoryError, LockFileError, MechanismError
from ..core.model import MECHANISMS
from . import safepath as _safepath

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

# Under /run (root's, mode 0755), not /run/lock (1777): there any user could mkdir the name first and
# make every root job refuse it (a squatted default is a denial of service).
SYSTEM_DIRECTORY = "/run/hostlock"
MARKER = ".hostlock-mechanism"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # so a planted FIFO cannot block open()


def default_directory() -> str:
    """$HOSTLOCK_DIR, else the system directory if this user can lock there, else a per-user directory.

    The per-user directory must be one only this user controls and the same in every session: a cron job
    (no $XDG_RUNTIME_DIR) and a login shell of the same user must meet. So: ~/.local/state/hostlock when
    the home directory (from the password database, not $HOME) is this user's and not writable by others;
    else /tmp/hostlock-UID, refused with a clear error if another user created it first.
    """
    env = os.environ.get("HOSTLOCK_DIR")
    if env:
        return env
    uid = os.geteuid()
    if uid == 0 or _usable(SYSTEM_DIRECTORY):
        return SYSTEM_DIRECTORY
    return _home_directory(uid) or "/tmp/hostlock-%d" % uid


def _home_directory(uid: int) -> str | None:
    """~/.local/state/hostlock when this user's home (password database) is theirs alone, else None."""
    try:
        import pwd

        home = pwd.getpwuid(uid).pw_dir
    except (ImportError, KeyError):
        return None
    if not home or not _owned_by_me(home):
        return None
    return os.path.join(home, ".local", "state", "hostlock")


def _owned_by_me(path: str) -> bool:
    """A directory of this user's that nobody else can write to (so nobody else can plant names in it)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _usable(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and os.access(path, os.W_OK | os.X_OK) and not _distrust(st)


def _distrust(st: os.stat_result) -> str | None:
    """Why a directory cannot be trusted to hold locks, or None."""
    if st.st_uid not in (0, os.geteuid()):
        return "it is owned by another user (uid %d)" % st.st_uid
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "it is writable by others without the sticky bit (mode %o)" % stat.S_IMODE(st.st_mode)
    return None


def open_directory(path: str) -> tuple[int, bool]:
    """Open a trusted lock directory (creating a private one if missing); returns (fd, group_shared)."""
    if "\0" in path:
        raise LockDirectoryError("lock directory path contains a NUL byte", directory=path)
    try:
        # Every component walked (host.safepath): no symlink another user could plant above the directory.
        fd = _safepath.open_directory(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except _safepath.UnsafePath as e:
        raise LockDirectoryError("cannot open lock directory %s: %s" % (path, e), directory=path,
                                 errno=e.errno) from None
    except FileNotFoundError:
        _create(path)
        return open_directory(path)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LockDirectoryError(
                "lock directory %s is a symlink or not a directory: refusing it; point HOSTLOCK_DIR at a real "
                "directory" % path, directory=path, errno=e.errno) from None
        hint = ("; ask an administrator to admit you to its group, or set HOSTLOCK_DIR to your own directory"
                if e.errno in (errno.EACCES, errno.EPERM) else "")
        raise LockDirectoryError("cannot open lock directory %s: %s%s" % (path, e.strerror, hint),
                                 directory=path, errno=e.errno) from None
    st = os.fstat(fd)
    why = _distrust(st)
    if why:
        os.close(fd)
        if st.st_uid not in (0, os.geteuid()):
            # Typically a squatter: /tmp/hostlock-UID made by someone else before this user's first lock.
            raise LockDirectoryError(
                "refusing lock directory %s: %s, who could remove or plant lock files there (it may have been "
                "created to deny you locks). Have root remove it, or set HOSTLOCK_DIR to a directory of yours"
                % (path, why), directory=path)
        raise LockDirectoryError(
            "refusing lock directory %s: %s; another user could plant or remove lock files there. Use a "
            "directory owned by you or root, mode 0700, or 3770 with a group for sharing" % (path, why),
            directory=path)
    return fd, bool(st.st_mode & 0o020)


def _create(path: str) -> None:
    parent = os.path.dirname(path.rstrip("/")) or "/"
    if not os.path.isdir(parent):
        if path != _home_directory(os.geteuid()):
            raise LockDirectoryError("lock directory %s does not exist and neither does its parent %s: create "
                                     "it, or set HOSTLOCK_DIR" % (path, parent), directory=path)
        _create_parents(path, parent)
    try:
        # Private by default; sharing with a group is an administrator's decision (the cli role). Made in
        # the parent as walked (host.safepath), so a symlink swapped in above it cannot move it elsewhere.
        pfd = _safepath.open_path(os.path.dirname(path.rstrip("/")) or ".", os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            os.mkdir(os.path.basename(path.rstrip("/")), 0o700 if os.geteuid() else 0o755, dir_fd=pfd)
        finally:
            os.close(pfd)
    except FileExistsError:
        return
    except OSError as e:
        raise LockDirectoryError("cannot create lock directory %s: %s. Create it (see docs/concepts.md) or "
                                 "set HOSTLOCK_DIR to a directory you own" % (path, e.strerror),
                                 directory=path, errno=e.errno) from None


def _create_parents(path: str, parent: str) -> None:
    """Create the per-user default's missing parents (0700) below a directory of ours only.

    A fresh account has no ~/.local/state; the chain is created only below a directory this user owns
    and nobody else can write to, so no path component is ever one another user made.
    """
    missing = []
    top = parent
    while not os.path.isdir(top):
        missing.append(top)
        up = os.path.dirname(top)
        if up == top:
            break
        top = up
    if not _owned_by_me(top):
        raise LockDirectoryError("lock directory %s does not exist and neither does its parent %s: create "
                                 "it, or set HOSTLOCK_DIR" % (path, parent), directory=path)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise LockDirectoryError("cannot create %s for lock directory %s: %s; set HOSTLOCK_DIR"
                                     % (d, path, e.strerror), directory=path, errno=e.errno) from None


def open_lock_file(dirfd: int, filename: str, directory: str, shared: bool, *, create: bool = True,
                   write: bool = True) -> int:
    """Open a lock file that is a regular file, never through a symlink, never blocking on a FIFO.

    Opens first without O_CREAT: with fs.protected_regular, O_CREAT on another user's file in a sticky
    directory fails even for root (filelock #317). Never truncates: the holder's record is in there.
    """
    path = os.path.join(directory, filename)
    flags = (os.O_RDWR if write else os.O_RDONLY) | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK
    while True:
        try:
            fd = os.open(filename, flags, dir_fd=dirfd)
            break
        except FileNotFoundError:
            if not create:
                raise
            try:
                fd = os.open(filename, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dirfd)
            except FileExistsError:
                continue  # lost a creation race: open the winner's file
            except OSError as e:
                raise file_error("cannot create lock file", path, e) from None
            # Explicit mode: the creator's umask must not decide who else may lock (filelock #70).
            os.fchmod(fd, 0o660 if shared else 0o600)
            break
        except OSError as e:
            raise file_error("cannot open lock file", path, e) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise LockFileError("lock path %s is not a regular file (mode %o): something was planted there; "
                            "remove it after checking who made it" % (path, st.st_mode), path=path)
    if st.st_nlink > 1:
        # hostlock never links a lock file: a second name (`ln A.lock Q.lock` by someone who may write it)
        # would make Q's lock A's, and `break Q` end A's holder.
        os.close(fd)
        raise LockFileError("lock path %s has %d links: another name leads to the same file (a hard link "
                            "someone made); refusing it; remove the extra name after checking who made it"
                            % (path, st.st_nlink), path=path)
    if _O_NONBLOCK:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_NONBLOCK)
    return fd


def must_adopt(dirfd: int, fd: int) -> int | None:
    """The owner uid of an open lock file or marker this process must replace with its own before trusting it.

    In a directory others can write, a file's owner can remove or replace it whatever its mode (the sticky
    bit stops everyone else): a lock taken on a member's file splits in two when the member removes it and a
    newcomer creates the name again. So the directory's owner and root, who can replace any name there,
    trust only files of their own, the owner's or root's (docs/security.md, "Lock directories"). Other users
    cannot replace anyone's file: they take files as they find them (what a member can still do is written
    there too). None: trust it as it is.
    """
    me = os.geteuid()
    dst = os.fstat(dirfd)
    if not dst.st_mode & 0o022 or me not in (dst.st_uid, 0):
        return None
    owner = os.fstat(fd).st_uid
    return None if owner in (me, dst.st_uid, 0) else owner


def foreign_file_error(path: str, owner: int, what: str = "lock file") -> LockFileError:
    """Refusing another user's file that cannot be replaced safely (flock(): nothing says it is idle)."""
    return LockFileError("%s %s belongs to uid %d, who could remove it while we hold it (two holders); not "
                         "locking it: remove it when nothing uses it, then lock again" % (what, path, owner),
                         path=path)


def file_error(what: str, path: str, e: OSError) -> Exception:
    if e.errno == errno.ELOOP:
        return LockFileError("lock path %s is a symlink: refusing to follow it (it may point at a file an "
                             "attacker wants overwritten); remove it" % path, path=path, errno=e.errno)
    if e.errno in (errno.EACCES, errno.EPERM):
        return LockFileError("%s %s: permission denied; the lock belongs to another user or group. Ask an "
                             "administrator to admit you to the lock directory's group" % (what, path),
                             path=path, errno=e.errno)
    if e.errno == errno.EROFS:
        return LockFileError("%s %s: read-only file system; use a writable HOSTLOCK_DIR" % (what, path),
                             path=path, errno=e.errno)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return LockFileError("%s %s: no space left (disk or quota full); free space and retry" % (what, path),
                             path=path, errno=e.errno)
    return LockFileError("%s %s: %s" % (what, path, e.strerror), path=path, errno=e.errno)


def _trusted_marker(st: os.stat_result, dst: os.stat_result) -> bool:
    """Whether a marker's value may decide a mechanism: a plain file of root's or the directory owner's (the
    only users who may choose it for everyone), with one name, that nobody else may write. A marker another
    user made, can write, or linked in from elsewhere (a second name) is no record of anything."""
    return (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid in (0, dst.st_uid)
            and not st.st_mode & 0o022)


def _open_marker(dirfd: int, directory: str) -> tuple[int, bool] | None:
    """The marker (fd, trusted), or None when there is none; a symlink there (ELOOP) is an untrusted one."""
    try:
        fd = os.open(MARKER, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return -1, False
        raise file_error("cannot read mechanism marker", os.path.join(directory, MARKER), e) from None
    return fd, _trusted_marker(os.fstat(fd), os.fstat(dirfd))


def read_marker(dirfd: int, directory: str) -> str | None:
    """The directory's recorded mechanism, or None if nothing has locked there yet or the marker is not one
    root or the directory's owner recorded (never creates it)."""
    found = _open_marker(dirfd, directory)
    if found is None or found[0] < 0:
        return None
    fd, trusted = found
    if not trusted:
        os.close(fd)
        return None
    return _read_marker(fd, directory) or None


def _read_marker(fd: int, directory: str) -> str:
    """Read and close an open marker file (trusted: see _trusted_marker)."""
    try:
        return os.read(fd, 64).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def replace_own(dirfd: int, directory: str, name: str, mode: int, data: bytes, what: str) -> None:
    """Put a fresh file of ours at `name`, renamed over what is there (atomic: never missing, never half
    written); the way root takes over another user's lock file or marker (must_adopt)."""
    base = name if name.startswith(".") else "." + name
    tmp = ""
    try:
        fd, tmp = _fresh_file(dirfd, base + ".%s.new", 0o600)
        try:
            os.fchmod(fd, mode)  # explicit: the umask must not decide who else may use it
            if data:
                os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except OSError as e:
        if tmp:
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass
        raise file_error("cannot replace another user's %s" % what, os.path.join(directory, name), e) from None


def _fresh_file(dirfd: int, pattern: str, mode: int) -> tuple[int, str]:
    """A new file of ours in the directory, under a name nobody could guess: (fd, name).

    A name another user can predict (one with our pid) can be made first in a shared directory, by every
    pid at once, and O_EXCL would then refuse every lock there. A name found taken is a planted one (or a
    one-in-2**64 collision): another random name is tried, a few times."""
    for _try in range(8):
        tmp = pattern % os.urandom(8).hex()
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, mode, dir_fd=dirfd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "eight random temporary names in a row were taken")


def directory_mechanism(dirfd: int, directory: str, requested: str, probe: Callable[[int], str]) -> str:
    """The directory's one mechanism: every process on a directory must use the same one, or none excludes.

    Recorded in a marker file, which only root or the directory's owner write and which decides only while
    it is theirs alone (_trusted_marker): a marker another user made, can write or linked in is never read.
    Without a trusted marker the mechanism is the kernel's answer on this filesystem (`probe(fd)`:
    "ofd"/"flock", or "record" when it refuses kernel locks), the same for every process that asks, or what
    was asked for. Root and the directory's owner record it: where no marker is, what they use (link(2),
    never over another's); over an untrusted one, the kernel's answer whatever was asked (renamed over it:
    the name is never missing, so no other process can record anything in between, and every process
    replacing one writes the same value).
    """
    recorder = os.geteuid() in (0, os.fstat(dirfd).st_uid)  # who may record the directory's mechanism
    for _try in range(8):
        found = _open_marker(dirfd, directory)
        if found is not None and found[1]:
            recorded = _read_marker(found[0], directory)
            if recorded not in MECHANISMS:
                raise MechanismError("%s names an unknown mechanism %r: remove the file when no locks are held"
                                     % (os.path.join(directory, MARKER), recorded), directory=directory)
            if requested not in ("auto", recorded):
                raise MechanismError(
                    "lock directory %s uses the %r mechanism, not %r: processes using different mechanisms "
                    "would not exclude each other. Use mechanism='auto' or another directory"
                    % (directory, recorded, requested), directory=directory)
            return recorded
        planted_dir = False
        if found is not None and found[0] >= 0:
            planted_dir = stat.S_ISDIR(os.fstat(found[0]).st_mode)
            os.close(found[0])
        if not recorder:
            return requested if requested != "auto" else _probe_here(dirfd, directory, probe)
        if found is None:
            _record(dirfd, directory, requested, probe)
        elif planted_dir:  # nothing can be renamed over a directory: moved aside whole, under a random name
            try:
                fd, aside = _fresh_file(dirfd, MARKER + ".%s.old", 0o600)
                os.close(fd)
                os.unlink(aside, dir_fd=dirfd)
                os.rename(MARKER, aside, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            except OSError as e:
                raise file_error("cannot move aside the directory at", os.path.join(directory, MARKER), e) from None
        else:  # another user's, or one they can write or linked in: ours in its place, with the kernel's answer
            replace_own(dirfd, directory, MARKER, 0o644,
                        (_probe_here(dirfd, directory, probe) + "\n").encode(), "mechanism marker")
    raise MechanismError("the mechanism marker in %s kept changing under us: remove %s when no locks are held"
                         % (directory, os.path.join(directory, MARKER)), directory=directory)


def _record(dirfd: int, directory: str, requested: str, probe: Callable[[int], str]) -> None:
    """Publish our marker where none is (link(2): never over another's); the caller reads what won."""
    try:
        wfd, tmp = _fresh_file(dirfd, MARKER + ".%s", 0o644)
        try:
            os.fchmod(wfd, 0o644)
            # Probe kernel locks on the marker file itself: no extra file left behind.
            chosen = requested if requested != "auto" else probe(wfd)
            os.write(wfd, (chosen + "\n").encode())
            os.close(wfd)
            wfd = -1
            try:
                os.link(tmp, MARKER, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            except FileExistsError:
                pass
        finally:
            # Whatever failed (a full disk fails the write), the temporary name never stays behind.
            if wfd >= 0:
                os.close(wfd)
            os.unlink(tmp, dir_fd=dirfd)
    except OSError as e:
        raise file_error("cannot create mechanism marker", os.path.join(directory, MARKER), e) from None


def _probe_here(dirfd: int, directory: str, probe: Callable[[int], str]) -> str:
    """The kernel's answer for this directory without recording it: probed on a file of our own made and
    removed at once (what _record probes on), else on the directory itself where we may not create one."""
    try:
        fd, tmp = _fresh_file(dirfd, "." + MARKER.lstrip(".") + ".probe.%s", 0o600)
    except OSError:
        return probe(dirfd)
    try:
        return probe(fd)
    finally:
        os.close(fd)
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except OSError:
            pass
