"""The record mechanism: owner files alone, for filesystems where kernel locks fail (ENOLCK and kin).

Files live flat in the lock directory as `NAME~...` ('~' cannot occur in a name, so no two names collide):
  NAME~owner        the exclusive holder (or a writer that waits for readers to leave)
  NAME~s<k>         the holder of semaphore slot k
  NAME~r~<id>       one shared holder; the id (pid~start~boot~host~pidns~nonce) is unique and never reused
  NAME~guard        held by the one process breaking a stale owner file
  NAME~t~<id>       a holder's file before link(2) publishes it whole
Owner files are created by link(2), which is atomic (even on NFS) and fails if the name exists. A holder's
file is stale only when its process is proven dead (same boot: pid gone or start time differs; another
boot); a pid from another PID namespace is never looked up here (it names another process, or none).
Breaking one takes the guard first and re-checks the inode under it, so two breakers can never both
win, nor can a breaker delete a fresh holder's file (proper-lockfile #121). A breaker that died holding the
guard is itself proven dead and its guard claimed by rename to a unique name and re-checked.
Waiting here polls with backoff (0.5 ms doubling to 50 ms): without kernel locks nothing can wake us.
"""

from __future__ import annotations

import errno
import os
import stat

from ..core.holder import Holder, holds_open
from ..core.owner import BOOT_ID, HOSTNAME, _Self, is_alive, parse_record, record_prefix
from .directory import file_error

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


# How this host and boot appear inside file-name ids (short, and free of the '~' separator).
_BOOT_TAG = BOOT_ID.replace("-", "")[:8]
_HOST_TAG = HOSTNAME[:40].replace("~", "_")


def _ns_tag(pidns: str) -> str:
    return pidns.rsplit(":", 1)[-1]  # the namespace's inode (hex) is enough on one host


def _identity() -> str:
    me = _Self.get()
    return "%d~%s~%s~%s~%s~%s" % (me.pid, me.start or "", _BOOT_TAG, _HOST_TAG, _ns_tag(me.pidns),
                                  os.urandom(4).hex())


def _open_anywhere(dev: int, ino: int, mine: int = -1) -> bool | None:
    """Whether any process of this PID namespace has the file open (our descriptor `mine` aside); None when
    some process's descriptors cannot be read (not root, hidepid): unproven. Reads every /proc/PID/fd: a
    rare path, taken only for a record whose named process is alive without its file."""
    from ..core.holder import _open_as

    me = os.getpid()
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fds = _open_as(pid, dev, ino)
        if fds is None:
            return None
        if pid == me:
            fds = [n for n in fds if n != str(mine)]
        if fds:
            return True
    return False


def _int(text: object) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _id_pid(ident: str) -> tuple | None:
    """(pid, start time or None) of an id hostlock made (_identity); None for a name it never makes."""
    parts = ident.split("~")
    if len(parts) < 5 or not parts[0].isdigit():
        return None
    return int(parts[0]), parts[1] or None


def _id_alive(ident: str) -> bool | None:
    """Liveness from an id embedded in a file name: no need to read (or trust) the file's content."""
    named = _id_pid(ident)
    if named is None:
        return None
    parts = ident.split("~")
    if len(parts) >= 6 and parts[4] and parts[4] != _ns_tag(_Self.get().pidns):
        return None  # another PID namespace: its pid cannot be looked up here
    if parts[3] and _HOST_TAG and parts[3] != _HOST_TAG:
        return None
    if parts[2] and _BOOT_TAG and parts[2] != _BOOT_TAG:
        return False
    return is_alive(named[0], named[1], None, None)


class RecordHeld:
    __slots__ = ("fd", "filename", "slot", "mode")

    def __init__(self, fd: int, filename: str, slot: int | None, mode: str) -> None:
        self.fd = fd
        self.filename = filename
        self.slot = slot
        self.mode = mode


class RecordMechanism:
    """One per Lock: it remembers a writer's owner file while readers drain."""

    name = "record"

    def __init__(self) -> None:
        self._pending: dict = {}

    # -- helpers ---------------------------------------------------------------------------------------
    def _publish(self, dirfd: int, directory: str, target: str, data: bytes, shared: bool) -> int | None:
        """Create `target` whole and atomically; its fd, or None if it already exists."""
        tmp = "%s~t~%s" % (target.split("~", 1)[0], _identity())
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=dirfd)
        except OSError as e:
            raise file_error("cannot create owner file", os.path.join(directory, tmp), e) from None
        try:
            os.fchmod(fd, 0o640 if shared else 0o600)
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write")
            try:
                os.link(tmp, target, src_dir_fd=dirfd, dst_dir_fd=dirfd, follow_symlinks=False)
            except FileExistsError:
                os.close(fd)
                return None
            return fd
        except OSError as e:
            os.close(fd)
            if isinstance(e, FileExistsError):
                return None
            raise file_error("cannot create owner file", os.path.join(directory, target), e) from None
        finally:
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass

    def _read(self, dirfd: int, filename: str) -> tuple | None:
        """(fields, inode, (dev, inode, owner uid) or None, why it is refused or None) of an owner file, or
        None if it is gone. Never follows a symlink, never blocks on a FIFO."""
        try:
            fd = os.open(filename, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, dir_fd=dirfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                return ({"pid": "-1", "cmd": "<symlink planted at owner path>"}, -1, None,
                        "a symlink is planted at this owner path: not followed; remove it after checking who made it")
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return ({"pid": "-1", "cmd": "<non-regular file planted at owner path>"}, st.st_ino, None,
                        "a non-regular file (mode %o) is planted at this owner path: not opened; remove it after "
                        "checking who made it" % st.st_mode)
            return parse_record(os.read(fd, 4096)), st.st_ino, (st.st_dev, st.st_ino, st.st_uid), None
        finally:
            os.close(fd)

    def _dead(self, fields: dict | None) -> bool:
        """Proven dead: only then may its file go. Unreadable or foreign records count as alive."""
        if not fields:
            return False
        try:
            pid = int(fields.get("pid", ""))
        except ValueError:
            return False
        return is_alive(pid, fields.get("start") or None, fields.get("boot") or None,
                        fields.get("host") or None, fields.get("pidns") or None) is False

    def _stale(self, got: tuple, pid: int | None = None, start: str | None = None, mine: int = -1) -> bool:
        """Not a live holder's file: its process is dead, or (the kernel's word) no process of this host has
        the file open. Every holder, reader and breaker keeps its file open from before it is published until
        after it is unlinked, so a record naming a live process (pid 1, root's cron) in a file nobody has
        open was written by someone else: a planted file, which would otherwise stall the name for good.
        `pid`, `start`: a reader's, from its name; else the record's. `mine`: our own descriptor of the file
        (_open_stale's), not counted. Unprovable (a process whose descriptors we cannot read: another user's
        without root; a record of another host or PID namespace): not stale, as ever."""
        fields, _ino, file, _why = got
        if self._dead(fields):
            return True
        if file is None or not fields:
            return False
        if pid is None:
            pid, start = _int(fields.get("pid")), fields.get("start")
        else:
            start = start or (fields.get("start") if pid == _int(fields.get("pid")) else None)
        if pid is None or is_alive(pid, start, fields.get("boot"), fields.get("host"),
                                   fields.get("pidns")) is not True:
            return False
        if pid != os.getpid() and holds_open(pid, file[0], file[1]) is not False:
            return False  # the named process has it (the usual case: one cheap look), or cannot be examined
        return _open_anywhere(file[0], file[1], mine) is False

    def _open_stale(self, dirfd: int, filename: str, inode: int | None = None) -> int | None:
        """An open descriptor of `filename` proven stale while it stays open, or None.

        Held open, its inode cannot be reused: if the name still leads to it after the holder was found
        without it, the holder (who unlinks before it closes) had not let go: it never held it."""
        try:
            fd = os.open(filename, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, dir_fd=dirfd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (inode is not None and st.st_ino != inode):
                return None
            got = (parse_record(os.pread(fd, 4096, 0)), st.st_ino, (st.st_dev, st.st_ino, st.st_uid), None)
            if not self._stale(got, mine=fd):
                return None
            try:
                now = os.stat(filename, dir_fd=dirfd, follow_symlinks=False)
            except OSError:
                return None  # released meanwhile
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return None
            fd, kept = -1, fd
            return kept
        finally:
            if fd >= 0:
                os.close(fd)

    def _break(self, dirfd: int, directory: str, filename: str, inode: int, shared: bool) -> bool:
        """Remove `filename` if it is still the stale inode; True if removed. Serialised by the guard."""
        base = filename.split("~", 1)[0]
        guard = base + "~guard"
        data = record_prefix("guard") + b"\n"
        gfd = self._publish(dirfd, directory, guard, data, shared)
        if gfd is None:
            self._claim_stale_guard(dirfd, guard)
            return False  # someone else is breaking; look again
        try:
            fd = self._open_stale(dirfd, filename, inode)
            if fd is None:
                return False
            try:
                # Under the guard nobody else breaks, and nobody can create the name while it exists: the
                # path still names the inode we proved stale (held open, it cannot be another's).
                os.unlink(filename, dir_fd=dirfd)
            except FileNotFoundError:
                return False
            finally:
                os.close(fd)
            return True
        finally:
            # Unlinked while still open: a guard that exists is always open in its breaker (see _stale).
            try:
                os.unlink(guard, dir_fd=dirfd)
            finally:
                os.close(gfd)

    def _claim_stale_guard(self, dirfd: int, guard: str) -> None:
        """Take away a guard whose breaker died (or that was planted): renamed to a unique name, checked to
        be the inode proven stale (held open meanwhile), else put back."""
        fd = self._open_stale(dirfd, guard)
        if fd is None:
            return
        try:
            inode = os.fstat(fd).st_ino
            claimed = "%s~t~%s" % (guard.split("~", 1)[0], _identity())
            try:
                os.rename(guard, claimed, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            except OSError:
                return  # gone meanwhile, or another user's that we may not move
            try:
                if os.stat(claimed, dir_fd=dirfd, follow_symlinks=False).st_ino != inode:
                    # We moved a live breaker's fresh guard: put it back unless a newer one exists.
                    try:
                        os.link(claimed, guard, src_dir_fd=dirfd, dst_dir_fd=dirfd, follow_symlinks=False)
                    except FileExistsError:
                        pass
            finally:
                os.unlink(claimed, dir_fd=dirfd)
        finally:
            os.close(fd)

    def _readers(self, dirfd: int, base: str) -> list:
        prefix = base + "~r~"
        return [n for n in os.listdir(dirfd) if n.startswith(prefix)]

    # -- acquiring -------------------------------------------------------------------------------------
    def try_acquire(self, dirfd: int, directory: str, base: str, mode: str, slots: int, record: bytes,
                    shared_dir: bool) -> RecordHeld | None:
        if slots > 1:
            for k in range(slots):
                held = self._try_file(dirfd, directory, "%s~s%d" % (base, k), record, shared_dir, k, mode)
                if held:
                    return held
            return None
        if mode == "shared":
            name = "%s~r~%s" % (base, _identity())
            fd = self._publish(dirfd, directory, name, record, shared_dir)
            if fd is None:
                return None
            # Dekker-style: publish ourselves, then look for a writer. A writer publishes its owner file
            # before scanning readers, so at least one of the two sees the other.
            got = self._read(dirfd, base + "~owner")
            if got is not None:
                if self._stale(got):
                    self._break(dirfd, directory, base + "~owner", got[1], shared_dir)
                try:
                    os.unlink(name, dir_fd=dirfd)  # before the close: a file that exists is open (see _stale)
                except FileNotFoundError:
                    pass
                finally:
                    os.close(fd)
                return None
            return RecordHeld(fd, name, None, mode)
        owner = base + "~owner"
        held = self._pending.get(owner)
        if held is None:
            held = self._try_file(dirfd, directory, owner, record, shared_dir, None, mode)
            if held is None:
                return None
        # We hold the owner file (new readers back off); wait for readers already in to leave.
        for reader in self._readers(dirfd, base):
            ident = reader.split("~r~", 1)[1]
            named = _id_pid(ident)
            alive = _id_alive(ident) if named is not None else False  # a name hostlock never makes: planted
            if alive and named is not None:
                got = self._read(dirfd, reader)
                alive = got is not None and not self._stale(got, *named)
            if alive is False:
                try:
                    os.unlink(reader, dir_fd=dirfd)
                except OSError:
                    pass  # gone; or planted by a user whose file we may not remove (it holds nothing)
            else:
                self._pending[owner] = held
                return None
        self._pending.pop(owner, None)
        return held

    def _try_file(self, dirfd: int, directory: str, filename: str, record: bytes, shared: bool,
                  slot: int | None, mode: str) -> RecordHeld | None:
        for _attempt in range(3):
            fd = self._publish(dirfd, directory, filename, record, shared)
            if fd is not None:
                return RecordHeld(fd, filename, slot, mode)
            got = self._read(dirfd, filename)
            if got is None:
                continue  # released meanwhile: try again at once
            if not self._stale(got) or not self._break(dirfd, directory, filename, got[1], shared):
                return None
        return None

    def abandon(self, dirfd: int, base: str) -> None:
        """Give up a pending writer's owner file (timeout while readers were still in)."""
        held = self._pending.pop(base + "~owner", None)
        if held is not None:
            self.release(dirfd, held)

    def release(self, dirfd: int, held: RecordHeld) -> None:
        try:
            st = os.stat(held.filename, dir_fd=dirfd, follow_symlinks=False)
            if st.st_ino == os.fstat(held.fd).st_ino:
                os.unlink(held.filename, dir_fd=dirfd)
        except FileNotFoundError:
            pass
        finally:
            os.close(held.fd)

    def write_record(self, held: RecordHeld, data: bytes) -> None:
        os.ftruncate(held.fd, 0)
        os.pwrite(held.fd, data, 0)

    def read_record(self, held: RecordHeld) -> bytes:
        return os.pread(held.fd, 4096, 0)

    # -- inspecting -----------------------------------------------------------------------------------
    def inspect(self, dirfd: int, base: str) -> tuple[int, list]:
        entries = []
        slots = 1
        names = [n for n in os.listdir(dirfd) if n.startswith(base + "~")]
        for n in sorted(names):
            kind = n[len(base) + 1:]
            if kind == "owner" or kind.startswith("r~") or (kind.startswith("s") and kind[1:].isdigit()):
                got = self._read(dirfd, n)
                if got is None:
                    continue
                slot = int(kind[1:]) if kind.startswith("s") else None
                if slot is not None:
                    slots = max(slots, slot + 1)
                entries.append((got[0], "shared" if kind.startswith("r~") else "exclusive", slot, n, got[2], got[3]))
        return slots, entries

    def remove_stale(self, dirfd: int, directory: str, base: str, shared: bool) -> list:
        removed = []
        for fields, _mode, _slot, filename, _file, _planted in self.inspect(dirfd, base)[1]:
            got = self._read(dirfd, filename)
            named = _id_pid(filename.split("~r~", 1)[1]) if "~r~" in filename else None
            if got and self._stale(got, *(named or (None, None))):
                if filename.startswith(base + "~r~"):
                    try:
                        os.unlink(filename, dir_fd=dirfd)
                        removed.append(Holder(fields, file=got[2]))
                    except FileNotFoundError:
                        pass
                elif self._break(dirfd, directory, filename, got[1], shared):
                    removed.append(Holder(fields, file=got[2]))
        return removed
