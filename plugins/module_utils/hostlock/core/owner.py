"""The owner record: who we are (pid + start time + boot id) as one line, and whether such a process lives.

A pid alone proves nothing (pids are reused), and wall-clock start times move when the clock steps, so a
process is named by pid + start time in clock ticks since boot (/proc/PID/stat field 22) + boot id. The
record is one line of escaped `key=value` fields: cheap to build without importing json on the hot path.
What a reader makes of another's record (Holder: holdership proven, described, ended) is core.holder's, off
the locking path.
"""

from __future__ import annotations

import sys
import time

from . import oslite as os


def _is_directory(path: str) -> bool:
    """os.path.isdir."""
    try:
        return os.stat(path).st_mode & 0o170000 == 0o040000  # S_ISDIR
    except (OSError, ValueError):
        return False


_HAS_PROC = _is_directory("/proc/self")
try:  # optional, only where /proc is missing (BSD, macOS); not even looked for with /proc (a failed import
    if _HAS_PROC:  # searches every directory of sys.path, at every start of the command)
        raise ImportError("/proc is there")
    import psutil
except ImportError:  # pragma: no cover - depends on the host
    psutil = None

from . import procstat  # noqa: E402  # after the optional import above

MAGIC = "HL1"


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    """Start time of `pid` as a comparable token, or None if it cannot be read (fail closed: unknown)."""
    if _HAS_PROC:
        return procstat.start_ticks(pid)
    if psutil is not None:
        try:
            return "ps:%r" % psutil.Process(pid).create_time()
        except Exception:
            return None
    return None


def _boot_id() -> str:
    text = _read("/proc/sys/kernel/random/boot_id")
    if text:
        return text.strip()
    if psutil is not None:
        try:
            return "btime:%d" % int(psutil.boot_time())
        except Exception:
            pass
    return ""


BOOT_ID = _boot_id()
HOSTNAME = os.uname().nodename if hasattr(os, "uname") else ""


def pid_namespace() -> str:
    """This process's PID namespace as 'dev:inode' of /proc/self/ns/pid, '' where it cannot be read.

    A pid means something only in the namespace that issued it: a record from another PID namespace
    (a container, `unshare --pid`) names a process this one cannot look up.
    """
    try:
        st = os.stat("/proc/self/ns/pid")  # follows the nsfs link: its inode names the namespace
    except OSError:
        return ""
    return "%x:%x" % (st.st_dev, st.st_ino)


def cmdline(pid: int) -> str | None:
    """Live command line of `pid` (NULs become spaces), None when unreadable."""
    if _HAS_PROC:
        raw = _read("/proc/%d/cmdline" % pid)
        return raw.rstrip("\0").replace("\0", " ") if raw else None
    if psutil is not None:
        try:
            return " ".join(psutil.Process(pid).cmdline())
        except Exception:
            return None
    return None


def is_alive(pid: int | None, start: str | None, boot: str | None, host: str | None,
             pidns: str | None = None) -> bool | None:
    """True/False when proven, None when it cannot be told: callers treat None as alive (fail closed)."""
    if host and HOSTNAME and host != HOSTNAME:
        return None  # another host (shared filesystem): its pids mean nothing here
    if boot and BOOT_ID and boot != BOOT_ID:
        return False  # recorded before the last reboot
    if pidns and pidns != _Self.get().pidns:
        return None  # another PID namespace: this pid number names some other process here, or none
    if pid is None or pid <= 0 or pid > 0x7FFFFFFF:
        return None  # no pid, or none that can exist (kill() takes a C int): a record's number, not a process
    if _HAS_PROC:
        data = procstat.read(pid)
        if data is None:
            return _signal_probe(pid)  # gone, or /proc hidden from us (hidepid)
        rest = procstat.split(data)
        if rest is None:
            return None
        if rest[procstat.STATE] in (b"Z", b"X"):
            return False  # a zombie holds no files and runs no code
        if start is None:
            return None
        return rest[procstat.START].decode() == start
    current = start_time(pid)
    if current is None:
        return _signal_probe(pid)
    return current == start if start is not None else None


def _signal_probe(pid: int) -> bool | None:
    """kill(pid, 0) when its start time cannot be read: False if gone, else None (exists, unprovable)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return None
    return None


class _Self:
    """This process's identity, recomputed after fork (pid and start time change)."""

    pid = -1
    start: str | None = None
    pidns = ""
    prefix = ""

    @classmethod
    def get(cls) -> type[_Self]:
        pid = os.getpid()
        if pid != cls.pid:
            cls.pid = pid
            cls.start = start_time(pid)
            cls.pidns = pid_namespace()
            argv = cmdline(pid) or " ".join(sys.argv)
            cls.prefix = encode_fields({
                "pid": pid, "start": cls.start or "", "boot": BOOT_ID, "host": HOSTNAME,
                "pidns": cls.pidns or None, "uid": os.getuid(), "cmd": argv[:300],
            })
        return cls


def _escape(value: str) -> str:
    return value.replace("%", "%25").replace("|", "%7C").replace("\n", "%0A").replace("\0", "%00")


def _unescape(value: str) -> str:
    return value.replace("%0A", "\n").replace("%7C", "|").replace("%00", "\0").replace("%25", "%")


def encode_fields(fields: dict) -> str:
    return "".join("|%s=%s" % (k, _escape(str(v))) for k, v in fields.items() if v is not None)


def record_prefix(mode: str, extra: dict | None = None) -> bytes:
    """Everything of a record but the acquisition time and slot, built once per lock (hot path)."""
    me = _Self.get()
    return (MAGIC + me.prefix + "|mode=" + mode + (encode_fields(extra) if extra else "")).encode(
        "utf-8", "replace")


def build_record(prefix: bytes, slot: int | None, ticket: int | None = None, at: float | None = None) -> bytes:
    """One record line: the cached prefix plus when (and which slot, which queue ticket) it was taken;
    `at` keeps the original time when a holder rewrites its record (a lease renewal is not a new hold)."""
    line = prefix + b"|at=%.6f" % (time.time() if at is None else at)
    if slot is not None:
        line += b"|slot=%d" % slot
    if ticket is not None:
        line += b"|q=%d" % ticket
    return line + b"\n"


def parse_record(data: bytes) -> dict | None:
    """Fields of a record line, or None for an empty, torn or foreign one (never raises)."""
    end = data.find(b"\n")
    if end <= 0 or not data.startswith(MAGIC.encode()):
        return None
    try:
        parts = data[:end].decode("utf-8", "replace").split("|")
        fields = {}
        for part in parts[1:]:
            key, sep, value = part.partition("=")
            if not sep:
                return None
            fields[key] = _unescape(value)
        return fields if "pid" in fields else None
    except Exception:
        return None
