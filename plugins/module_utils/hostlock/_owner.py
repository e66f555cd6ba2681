# GENERATED from lib/hostlock/_owner.py by `make module-utils`: do not edit; edit lib/hostlock instead.
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who holds a lock: the owner record, and proof of whether its process is still alive.

A pid alone proves nothing (pids are reused), and wall-clock start times move when the clock steps, so a
process is named by pid + start time in clock ticks since boot (/proc/PID/stat field 22) + boot id. The
record is one line of escaped `key=value` fields: cheap to build without importing json on the hot path.
"""

from __future__ import annotations

import os
import sys
import time

try:  # optional, only where /proc is missing (BSD, macOS)
    import psutil  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the host
    psutil = None

MAGIC = "HL1"
_HAS_PROC = os.path.isdir("/proc/self")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    """Start time of `pid` as a comparable token, or None if it cannot be read (fail closed: unknown)."""
    if _HAS_PROC:
        stat = _read("/proc/%d/stat" % pid)
        if stat is None:
            return None
        # comm (field 2) may hold spaces and ')': split after the last ')'; field 22 is index 19 after it.
        fields = stat[stat.rfind(")") + 2:].split()
        return fields[19] if len(fields) > 19 else None
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


def is_alive(pid: int, start: str | None, boot: str | None, host: str | None) -> bool | None:
    """True/False when proven, None when it cannot be told: callers treat None as alive (fail closed)."""
    if host and HOSTNAME and host != HOSTNAME:
        return None  # another host (shared filesystem): its pids mean nothing here
    if boot and BOOT_ID and boot != BOOT_ID:
        return False  # recorded before the last reboot
    if pid <= 0:
        return None
    if _HAS_PROC:
        stat = _read("/proc/%d/stat" % pid)
        if stat is None:
            return _signal_probe(pid)  # gone, or /proc hidden from us (hidepid)
        rest = stat[stat.rfind(")") + 2:].split()
        if rest and rest[0] in ("Z", "X"):
            return False  # a zombie holds no files and runs no code
        if start is None:
            return None
        return len(rest) > 19 and rest[19] == start
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
    prefix = ""

    @classmethod
    def get(cls) -> _Self:
        pid = os.getpid()
        if pid != cls.pid:
            cls.pid = pid
            cls.start = start_time(pid)
            argv = cmdline(pid) or " ".join(sys.argv)
            cls.prefix = encode_fields({
                "pid": pid, "start": cls.start or "", "boot": BOOT_ID, "host": HOSTNAME,
                "uid": os.getuid(), "cmd": argv[:300],
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


def build_record(prefix: bytes, slot: int | None, ticket: int | None = None) -> bytes:
    """One record line: the cached prefix plus when (and which slot, which queue ticket) it was taken."""
    line = prefix + b"|at=%.6f" % time.time()
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


def _num(fields: dict, key: str, kind: type = int) -> object:
    try:
        return kind(fields[key]) if fields.get(key, "") != "" else None
    except ValueError:
        return None


class Holder:
    """One holder of a lock as read from its owner record, with liveness proven where possible."""

    __slots__ = ("pid", "start_time", "boot_id", "hostname", "uid", "user", "cmdline", "mode", "slot",
                 "acquired_at", "lease_expires", "label", "job_pid", "job_cmdline", "alive", "stale",
                 "token_id", "verified", "record_ok")

    def __init__(self, fields: dict | None, mode: str | None = None, slot: int | None = None) -> None:
        f = fields or {}
        self.record_ok = fields is not None
        self.pid = _num(f, "pid")
        self.start_time = _num(f, "start")
        self.boot_id = f.get("boot") or None
        self.hostname = f.get("host") or None
        self.uid = _num(f, "uid")
        self.user = _user(self.uid)
        self.cmdline = f.get("cmd") or None
        self.mode = f.get("mode") or mode
        rslot = _num(f, "slot")
        self.slot = rslot if rslot is not None else slot
        self.acquired_at = _num(f, "at", float)
        self.lease_expires = _num(f, "lease", float)
        self.label = f.get("label") or None
        self.job_pid = _num(f, "jpid")
        self.job_cmdline = f.get("jcmd") or None
        self.token_id = f.get("tid") or None
        self.alive: bool | None = None
        self.verified = False
        self.stale = False
        if isinstance(self.pid, int):
            self.alive = is_alive(self.pid, f.get("start") or None, self.boot_id, self.hostname)
            if self.alive:
                live = cmdline(self.pid)
                if live:
                    self.cmdline = live
                # A record is only text in a shared file: check its claimed uid against the kernel's.
                self.verified = proc_uid(self.pid) == self.uid
            if self.job_pid and self.alive:
                live = cmdline(self.job_pid)
                if live:
                    self.job_cmdline = live

    @property
    def lease_expired(self) -> bool:
        return self.lease_expires is not None and self.lease_expires <= time.time()

    def describe(self) -> str:
        """Short human form for error messages: 'pid 123 (user root: rsync -a ...)'."""
        if not self.record_ok:
            return "an unknown holder (no readable owner record)"
        who = "pid %s" % self.pid
        if self.job_pid:
            who += " running job pid %s" % self.job_pid
        cmd = self.job_cmdline or self.cmdline or ""
        extra = ", ".join(x for x in (
            "user %s" % (self.user or self.uid),
            " ".join(cmd.split())[:80],
            "label %s" % self.label if self.label else "",
            "since %s" % time.strftime("%H:%M:%S", time.localtime(self.acquired_at)) if self.acquired_at else "",
        ) if x)
        return "%s (%s)" % (who, extra)

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__}
        d["lease_expired"] = self.lease_expired
        return d

    def __repr__(self) -> str:
        return "Holder(%s)" % self.describe()


_USERS: dict = {}


def _user(uid: object) -> str | None:
    if not isinstance(uid, int):
        return None
    if uid not in _USERS:
        try:
            import pwd

            _USERS[uid] = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError):
            _USERS[uid] = None
    return _USERS[uid]
