"""A holder as read from its owner record: holdership proven from the kernel's tables, described, ended.

The read side of core.owner (which builds and parses the record and proves a process alive): status, break,
busy messages and the modules' lock_info use it; taking and releasing a lock never does, so a command that
only takes one (`hostlock run`) never loads it.
"""

from __future__ import annotations

import time

from . import oslite as os
from . import procstat
from .owner import _HAS_PROC, _read, cmdline, is_alive, psutil
from .text import one_line

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Mapping


def proc_uid(pid: int) -> int | None:
    """Real uid of a live process, to check a record's claimed uid against the kernel's."""
    if _HAS_PROC:
        status = _read("/proc/%d/status" % pid)
        if status:
            for line in status.splitlines():
                if line.startswith("Uid:"):
                    return int(line.split()[1])
        return None
    if psutil is not None:
        try:
            return int(psutil.Process(pid).uids().real)
        except Exception:
            return None
    return None


def _open_as(pid: int, dev: int, ino: int) -> list | None:
    """The descriptor numbers through which `pid` has the file (dev, ino) open; None when unreadable.

    Each is stat()ed through its magic link, which leads to the open file itself (no path lookup, cannot be
    redirected); a process that is gone has none.
    """
    fds = "/proc/%d/fd" % pid
    try:
        names = os.listdir(fds)
    except FileNotFoundError:
        return []  # gone
    except OSError:
        return None  # another user's process without root, hidepid
    found = []
    for n in names:
        try:
            st = os.stat("%s/%s" % (fds, n))
        except OSError:
            continue  # closed meanwhile
        if st.st_ino == ino and st.st_dev == dev:
            found.append(n)
    return found


def holds_open(pid: int, dev: int, ino: int) -> bool | None:
    """Whether process `pid` has the file (dev, ino) open: the kernel's word, not a record's (None: unproven)."""
    fds = _open_as(pid, dev, ino)
    return None if fds is None else bool(fds)


def holds_lock(pid: int, dev: int, ino: int, at: int | None) -> bool | None:
    """Whether process `pid` holds a kernel lock on the file (dev, ino) covering offset `at` (None: a flock()).

    The kernel's word from /proc/PID/fdinfo, whose `lock:` lines list the locks each open file description
    holds (a waiter's description shows only its queue ranges, never the lock itself): a record naming a
    process that merely has the file open, a waiter say, proves nothing. None when unreadable (another
    user's process without root, hidepid): unproven.
    """
    fds = _open_as(pid, dev, ino)
    if fds is None:
        return None
    unreadable = False
    for n in fds:
        info = _read("/proc/%d/fdinfo/%s" % (pid, n))
        if info is None:
            unreadable = True
            continue
        if any(_covers(line, at) for line in info.splitlines() if line.startswith("lock:")):
            return True
    return None if unreadable else False


def _covers(line: str, at: int | None) -> bool:
    """Does one fdinfo `lock:` line ("lock:\t1: OFDLCK ADVISORY WRITE -1 fe:00:123 1 1") cover `at`?"""
    words = line.split()
    if at is None:
        return "FLOCK" in words
    if "OFDLCK" not in words or len(words) < 3:
        return False
    try:
        start = int(words[-2])
        end = words[-1]
        return start <= at and (end == "EOF" or at <= int(end))
    except ValueError:
        return False


# Numbers in a record are text anyone in a shared directory may have written: out-of-range ones become
# None (unknown) instead of overflowing kill(), getpwuid() or localtime() later.
_INT_RANGE = (-(2 ** 31), 2 ** 32)
_TIME_RANGE = (0.0, 1e11)  # Unix seconds, to the year 5138


def _num(fields: dict, key: str, kind: type = int) -> object:
    try:
        value = kind(fields[key]) if fields.get(key, "") != "" else None
    except (ValueError, OverflowError):
        return None
    lo, hi = _INT_RANGE if kind is int else _TIME_RANGE
    return value if value is None or lo <= value < hi else None  # NaN fails both comparisons


def _int(fields: dict, key: str) -> int | None:
    value = _num(fields, key, int)
    return value if isinstance(value, int) else None


def _time(fields: dict, key: str) -> float | None:
    value = _num(fields, key, float)
    return value if isinstance(value, float) else None


class Holder:
    """One holder of a lock as read from its owner record, with liveness and holdership proven where possible.

    A record is only text, in a file others in a shared directory may write: `alive` comes from the
    kernel's process table (pid + start time + boot id, in this PID namespace), `verified` from the kernel's
    own tables (the live process holds this very lock, its range as /proc/PID/fdinfo lists it, or for the
    record mechanism has this very file open; and its real uid is the claimed one), and
    `forged` from the record file's owner (the record mechanism: the kernel sets a file's owner; a record
    claiming another uid was written by someone else). Nothing ever acts on a holder not `verified`.
    """

    __slots__ = ("pid", "start_time", "boot_id", "hostname", "pid_namespace", "uid", "user", "cmdline", "mode",
                 "slot", "acquired_at", "lease_expires", "label", "job_pid", "job_cmdline", "alive", "stale",
                 "token_id", "verified", "forged", "record_ok", "file_uid", "problem", "fence", "lease_id", "_file",
                 "_start", "path", "lease_proven")

    def __init__(self, fields: dict | None, mode: str | None = None, slot: int | None = None,
                 file: tuple | None = None) -> None:
        """`file` is (st_dev, st_ino, owner uid or None[, lock offset]) of the lock or record file, from fstat.

        The offset names the kernel lock range this holder must hold (None: a flock() on the file); without
        it (the record mechanism) having the file open is the proof.
        """
        f = fields or {}
        self.record_ok = fields is not None
        self.pid = _int(f, "pid")
        start = f.get("start") or ""
        self.start_time = int(start) if start.isascii() and start.isdigit() and len(start) < 20 else None
        self._start = f.get("start") or None
        self.boot_id = f.get("boot") or None
        self.hostname = f.get("host") or None
        self.pid_namespace = f.get("pidns") or None
        self.uid = _int(f, "uid")
        self.user = _user(self.uid)
        self.cmdline = f.get("cmd") or None
        self.mode = f.get("mode") or mode
        rslot = _int(f, "slot")
        self.slot = rslot if rslot is not None else slot
        self.acquired_at = _time(f, "at")
        # The record's lease is text anyone who may write the file chose: shown only until the holder's own
        # word replaces it (host locks: its socket's time, host.channel.lease_end), never acted on unproven.
        self.lease_expires = _time(f, "lease")
        self.lease_proven = False
        self.label = f.get("label") or None
        self.job_pid = _int(f, "jpid")
        self.job_cmdline = f.get("jcmd") or None
        self.token_id = f.get("tid") or None
        self.fence: int | None = None  # fleet locks: the holder's key's create_revision (its fencing token)
        self.lease_id: str | None = None  # fleet locks: the etcd lease (hex) its key was made with
        self._file = file
        self.path: str | None = None  # the record mechanism: the file this record was read from
        self.file_uid = file[2] if file is not None and len(file) > 2 else None
        self.alive: bool | None = None
        self.verified: bool | None = None
        self.forged = False
        self.problem: str | None = None
        self.stale = False
        if self.record_ok and self.file_uid is not None and self.uid != self.file_uid:
            self.forged = True
            self.verified = False
            self.problem = ("forged record: it claims uid %s but its file belongs to uid %d, who wrote it; "
                            "never acted upon" % (self.uid, self.file_uid))
        if isinstance(self.pid, int):
            self.alive = self._alive()
            if self.alive:
                live = cmdline(self.pid)
                if live:
                    self.cmdline = live
                if not self.forged:
                    self.verified = self.prove()
            elif self.alive is False and not self.forged:
                self.verified = False
            if self.job_pid and self.alive:
                live = cmdline(self.job_pid)
                if live:
                    self.job_cmdline = live

    def _alive(self) -> bool | None:
        return is_alive(self.pid, self._start, self.boot_id, self.hostname, self.pid_namespace)

    def prove(self) -> bool | None:
        """Is the recorded process, now, the holder? True only on the kernel's evidence, re-read each call.

        Its real uid must be the claimed one and it must have this lock file open (a process named by a
        record it never wrote has not); pid + start time are checked after the descriptor scan, so a pid
        reused meanwhile is not mistaken for the holder. None: cannot be told from here.
        """
        if self.forged or not isinstance(self.pid, int) or self.pid <= 0:
            return False if self.forged else None
        alive = self._alive()
        if not alive:
            return None if alive is None else False
        if proc_uid(self.pid) != self.uid:
            return False
        if self._file is None:
            return None
        lock_at = self._file[3] if len(self._file) > 3 else False
        if lock_at is False:  # the record mechanism: no kernel lock to point at, the open file must do
            opened = holds_open(self.pid, self._file[0], self._file[1])
        else:  # a kernel mechanism: the process must hold the very range, not just have the file open
            opened = holds_lock(self.pid, self._file[0], self._file[1], lock_at)
        if opened and self._alive() is not True:
            return False  # exited (and the pid maybe reused) while we looked
        return opened

    @property
    def lease_expired(self) -> bool:
        """The lease ended, on the holder's own word (`lease_proven`): what lets break end a live holder."""
        return self.lease_proven and self.lease_expires is not None and self.lease_expires <= time.time()

    def describe(self, fleet: bool = False) -> str:
        """Short human form for error messages: 'pid 123 (user root: rsync -a ...)' (describe_holder)."""
        return describe_holder(self.as_dict(), fleet=fleet)

    def to_json(self) -> dict:
        """The documented, stable JSON shape of a holder (schema hostlock.status/1, docs/cli.md): the one
        serializer the CLI, the Ansible modules and scripts share. Keys are only ever added."""
        return {
            "pid": self.pid,
            "user": self.user,
            "uid": self.uid,
            "mode": self.mode,
            "slot": self.slot,
            "cmdline": self.cmdline,
            "job_pid": self.job_pid,
            "job_cmdline": self.job_cmdline,
            "label": self.label,
            "acquired_at": self.acquired_at,
            "lease_expires": self.lease_expires,
            "token_id": self.token_id,
            "alive": self.alive,
            "stale": bool(self.stale),
            "verified": self.verified,
            "forged": self.forged,
            "problem": self.problem,
            "hostname": self.hostname,
            "boot_id": self.boot_id,
            "start_time": self.start_time,
            "pid_namespace": self.pid_namespace,
            "fence": self.fence,
        }

    def as_dict(self) -> dict:
        """to_json() plus the engine's extras (record_ok, file_uid, lease_expired): one shape, a superset."""
        d = self.to_json()
        d.update(record_ok=self.record_ok, file_uid=self.file_uid, lease_expired=self.lease_expired,
                 lease_id=self.lease_id)
        return d

    def __repr__(self) -> str:
        return "Holder(%s)" % self.describe()


def _clock(epoch: float | None) -> str:
    """An epoch as local HH:MM:SS (what an operator compares with `date`)."""
    return "?" if epoch is None else time.strftime("%H:%M:%S", time.localtime(epoch))


def _short(text: str | None, limit: int = 80) -> str:
    """A holder's command line or label, as one inert line: it is text another user may have written."""
    text = one_line(" ".join((text or "").split()))  # whitespace runs (newlines too) to one space
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_holder(h: Mapping[str, Any], detailed: bool = False, fleet: bool = False) -> str:
    """The one text naming a holder for people, from its JSON shape (Holder.as_dict(), a module result's
    `holders` item, a path lock's holder dict from /proc).

    Short (the engine's errors, the command line): 'pid 12 on web1 running job pid 13 (user root, backup.sh,
    label L, since 02:00:01)'. `detailed` (a task's msg: a playbook reader sees only that line, so it also
    says the mode, slot, lease and staleness, with the command and label quoted and made inert): 'pid 12,
    user root, job pid 13 'backup.sh', label "L", slot 1, since 02:00:01, lease until 02:10:01 on web1'.
    `fleet` (hostlock gc --fleet): the host even without a fence, and the fencing token.
    """
    if detailed:
        parts = ["pid %s" % h.get("pid")]
        if h.get("user"):
            parts.append("user %s" % h["user"])
        if h.get("job_pid"):
            parts.append("job pid %s '%s'" % (h["job_pid"], _short(h.get("job_cmdline"))))
        elif h.get("job_cmdline"):  # a fleet holder's job in its first 0.1 s (its pid is written then)
            parts.append("job '%s'" % _short(h["job_cmdline"]))
        elif h.get("cmdline"):
            parts.append("'%s'" % _short(h["cmdline"]))
        if h.get("label"):
            parts.append('label "%s"' % _short(h["label"]))
        if h.get("mode") and h.get("mode") != "exclusive":
            parts.append(str(h["mode"]))
        if h.get("slot") is not None:
            parts.append("slot %s" % h["slot"])
        if h.get("acquired_at"):
            parts.append("since %s" % _clock(h["acquired_at"]))
        if h.get("lease_expires"):
            parts.append("lease until %s" % _clock(h["lease_expires"]))
        if h.get("stale"):
            parts.append("STALE")
        return ", ".join(parts) + (" on %s" % h["hostname"] if h.get("hostname") else "")
    fence = h.get("fence")
    if not h.get("record_ok", True):
        if h.get("lease_id") is not None:
            text = "etcdctl lock, lease %s (no owner record)" % h["lease_id"]
        else:
            text = "an unknown holder (no readable owner record)"
    else:
        who = "pid %s" % h.get("pid")
        if h.get("hostname") and (fleet or fence is not None):
            who += " on %s" % h["hostname"]  # a fleet lock: the pid means something on that host only
        if h.get("job_pid"):
            who += " running job pid %s" % h["job_pid"]
        cmd = h.get("job_cmdline") or h.get("cmdline") or ""
        extra = ", ".join(x for x in (
            "user %s" % (h.get("user") or h.get("uid")),
            " ".join(cmd.split())[:80],
            "label %s" % h["label"] if h.get("label") else "",
            "since %s" % _clock(h["acquired_at"]) if h.get("acquired_at") else "",
        ) if x)
        text = "%s (%s)%s" % (who, extra, ": FORGED" if h.get("forged") else "")
    return text + (", fence %s" % fence if fleet and fence is not None else "")


def _send(pid: int, pidfd: int | None, signum: int) -> None:
    import signal  # not on the locking path: signal imports enum

    sender = getattr(signal, "pidfd_send_signal", None)
    if pidfd is not None and sender is not None:
        sender(pidfd, signum)
    else:
        os.kill(pid, signum)


def end_holders(holders: list, wait: float) -> list:
    """SIGTERM, then SIGCONT, to each holder proven at that moment to hold the lock; wait for them to exit.

    SIGCONT because a stopped holder would otherwise never act on SIGTERM (the lock would stay held while
    we reported it ended). The proof is re-read after the pidfd is opened, so the signal reaches the
    process proven, never a successor on a reused pid. Unproven holders are skipped, never signalled.
    Returns the holders signalled; waits (bounded by `wait` seconds) until each has exited: on the
    pidfds where the kernel has them (woken by the exit itself), else probing with backoff.
    PermissionError propagates (the kernel refused: another user's process).
    """
    import signal

    signalled = []
    fds: list = []
    try:
        for h in holders:
            fd = procstat.pidfd(h.pid)
            if h.prove() is not True:
                if fd is not None:
                    os.close(fd)
                continue
            try:
                _send(h.pid, fd, signal.SIGTERM)
            except ProcessLookupError:
                if fd is not None:
                    os.close(fd)
                continue  # exited on its own in between: nothing was signalled
            except BaseException:
                if fd is not None:
                    os.close(fd)
                raise
            try:
                _send(h.pid, fd, signal.SIGCONT)
            except ProcessLookupError:
                pass  # the SIGTERM already ended it: signalled all the same (it was reported "nothing to remove")
            signalled.append(h)
            fds.append(fd)
        _wait_exits(signalled, fds, time.monotonic() + max(0.0, wait))
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)
    return signalled


def _wait_exits(holders: list, fds: list, deadline: float) -> None:
    import select

    poller = select.poll() if hasattr(select, "poll") else None
    pending = []
    for h, fd in zip(holders, fds):
        if fd is not None and poller is not None:
            poller.register(fd, select.POLLIN)  # a pidfd polls readable once its process has exited
        else:
            pending.append(h)
    waiting = {fd for fd in fds if fd is not None} if poller is not None else set()
    attempt = 0
    while waiting or pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        pending = [h for h in pending if h._alive() is not False]
        if waiting and poller is not None:
            step = left if not pending else min(left, 0.0005 * (2 ** min(attempt, 7)))
            for fd, _ev in poller.poll(max(1, int(step * 1000))):
                poller.unregister(fd)
                waiting.discard(fd)
        elif pending:
            time.sleep(min(left, 0.0005 * (2 ** min(attempt, 7))))
        attempt += 1


_USERS: dict = {}


def _user(uid: object) -> str | None:
    if not isinstance(uid, int):
        return None
    if uid not in _USERS:
        try:
            import pwd

            _USERS[uid] = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError, OverflowError, ValueError):
            _USERS[uid] = None
    return _USERS[uid]
