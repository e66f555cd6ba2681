"""A lock's history in the system journal: events sent natively to systemd-journald, read back with journalctl.

Why the journal: another user can neither forge nor erase root's entries there. journald stamps each entry
with its sender's credentials as the kernel passed them on the socket (`_UID`, `_GID`, `_PID`: SCM_CREDENTIALS,
which only a privileged process can set to anything but its own), keeps them apart from the fields a sender
writes, and bounds the journal in size and age itself (SystemMaxUse=, MaxRetentionSec=; journald.conf(5)).
So `hostlock history` names each entry's user from `_UID`, never from a field of the entry, and marks an entry
whose own HOSTLOCK_UID claims another uid than its sender's as forged (docs/security.md).

The sender speaks journald's native protocol (one datagram of `FIELD=value` lines, a field holding a newline
sent with its length; systemd's "Native Journal Protocol") with `_socket` alone: no python-systemd, no
`socket` module (~15 ms). Loaded only by `--history`, `break` and `history`.
"""

from __future__ import annotations

import errno
import os

from . import common as c

SOCKET = "/run/systemd/journal/socket"
# Every hostlock event carries this MESSAGE_ID (a fixed 128-bit id, as journal catalogs key on): the one match
# `history` asks journalctl for; SYSLOG_IDENTIFIER=hostlock makes `journalctl -t hostlock` show them too.
MESSAGE_ID = "09b2d49999914d86a09523ea6ea22499"
SEND_TIMEOUT = 2.0
MAX_VALUE = 4096  # a field's longest value (a command line can be 2 MB: one datagram must stay well under 200 kB)
EVENTS = ("acquired", "released", "busy", "timeout", "replaced", "broken", "lost")
_PRIORITY = {"acquired": 6, "released": 6, "busy": 5, "timeout": 5, "replaced": 5, "broken": 4, "lost": 3}


class JournalUnavailable(OSError):
    """No journald to send to (no socket, or it refuses): `--history` cannot be honoured (exit 69)."""

    exit_code = 69  # EX_UNAVAILABLE


def check() -> None:
    """JournalUnavailable unless journald's socket is there (a run with --history must not run without it)."""
    try:
        st = os.stat(SOCKET)
    except OSError as exc:
        raise JournalUnavailable(exc.errno, "no system journal here (%s: %s): --history needs systemd-journald"
                                 % (SOCKET, exc.strerror)) from None
    if (st.st_mode & 0o170000) != 0o140000:
        raise JournalUnavailable(errno.ENOTSOCK, "no system journal here (%s is not a socket): --history needs "
                                 "systemd-journald" % SOCKET)


def encode(fields: dict[str, object]) -> bytes:
    """The native protocol's datagram: `NAME=value\\n`, or for a value with a newline `NAME\\n`, its length as
    64-bit little endian, the value, `\\n`. Values that are None are left out."""
    out = []
    for name, value in fields.items():
        if value is None:
            continue
        data = str(value).encode("utf-8", "backslashreplace")
        if len(data) > MAX_VALUE:  # cut on a character's boundary: the field stays text
            data = data[:MAX_VALUE].decode("utf-8", "ignore").encode("utf-8")
        key = name.encode("ascii")
        if b"\n" in data:
            out.append(key + b"\n" + len(data).to_bytes(8, "little") + data + b"\n")
        else:
            out.append(key + b"=" + data + b"\n")
    return b"".join(out)


def send(event: str, lock: str, message: str, **fields: object) -> None:
    """One event of `lock` to the journal (fields become HOSTLOCK_<NAME>); raises JournalUnavailable."""
    import _socket

    entry: dict[str, object] = {
        "MESSAGE": message,
        "MESSAGE_ID": MESSAGE_ID,
        "PRIORITY": _PRIORITY.get(event, 6),
        "SYSLOG_IDENTIFIER": "hostlock",
        "HOSTLOCK_EVENT": event,
        "HOSTLOCK_LOCK": lock,
        "HOSTLOCK_UID": os.getuid(),  # what journald's _UID must confirm (history marks it forged if not)
    }
    entry.update(("HOSTLOCK_" + k.upper(), v) for k, v in fields.items())
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    s.settimeout(SEND_TIMEOUT)  # a journald too busy to read its socket must not hold up a run holding its lock
    try:
        s.sendto(encode(entry), SOCKET)
    except OSError as exc:
        raise JournalUnavailable(exc.errno, "cannot write to the system journal (%s): %s"
                                 % (SOCKET, exc.strerror or exc)) from None
    finally:
        s.close()


def query(journalctl: str, name: str | None, since: float | None, lines: int, uid: int | None) -> list[dict]:
    """The hostlock entries journalctl shows (newest `lines`, since `since`, of lock `name`, sent by `uid`), as
    its JSON objects, oldest first. OSError when journalctl cannot be run or fails (its message)."""
    import json
    import subprocess

    argv = [journalctl, "--no-pager", "--quiet", "-o", "json", "-n", str(lines), "MESSAGE_ID=" + MESSAGE_ID]
    if name:
        argv.append("HOSTLOCK_LOCK=" + name)
    if uid is not None:
        argv.append("_UID=%d" % uid)
    if since is not None:
        argv.append("--since=@%d" % int(since))
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OSError(errno.EIO, "journalctl failed (exit %d): %s"
                      % (done.returncode, why[-1] if why else "no message"))
    out = []
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _field(entry: dict, key: str) -> str | None:
    """A field as text: journalctl's JSON gives a list for a field sent more than once (the first counts here:
    a sender that repeats a field to confuse readers gets its first word) and a list of bytes for a binary one."""
    value = entry.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
        if isinstance(value, list):
            value = bytes(v for v in value if isinstance(v, int) and 0 <= v < 256).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except (TypeError, ValueError, OverflowError):
        return None
    # NaN, the one float unequal to itself, is no number (math.isnan would load math for this alone)
    return value if value is None or value == value else None  # pylint: disable=comparison-with-itself


def _int(text: str | None) -> int | None:
    n = c.decimal_arg(text) if text else None
    return n if n is not None and 0 <= n < 2 ** 63 else None


def event(entry: dict) -> dict:
    """One journal entry as history's JSON event. Who sent it (`uid`, `pid`) comes from journald's trusted
    fields only; `claimed_uid` is what the entry says of itself, and `forged` is true when the two differ
    (another user sent fields that name someone else) or the sender is unknown (no `_UID`)."""
    uid = _int(_field(entry, "_UID"))
    claimed = _int(_field(entry, "HOSTLOCK_UID"))
    stamp = _int(_field(entry, "__REALTIME_TIMESTAMP"))
    return {
        "time": stamp / 1e6 if isinstance(stamp, int) else None,
        "event": _field(entry, "HOSTLOCK_EVENT"),
        "lock": _field(entry, "HOSTLOCK_LOCK"),
        "directory": _field(entry, "HOSTLOCK_DIRECTORY"),
        "uid": uid,
        "user": _user(uid),
        "pid": _int(_field(entry, "_PID")),
        "claimed_uid": claimed,
        "forged": uid is None or claimed != uid,
        "job": _field(entry, "HOSTLOCK_JOB"),
        "label": _field(entry, "HOSTLOCK_LABEL"),
        "command": _field(entry, "HOSTLOCK_COMMAND"),
        "job_pid": _int(_field(entry, "HOSTLOCK_JOB_PID")),
        "wait": _number(_field(entry, "HOSTLOCK_WAIT_SECONDS")),
        "hold": _number(_field(entry, "HOSTLOCK_HOLD_SECONDS")),
        "result": _field(entry, "HOSTLOCK_RESULT"),
        "exit_status": _int(_field(entry, "HOSTLOCK_EXIT_STATUS")),
        "holder_pid": _int(_field(entry, "HOSTLOCK_HOLDER_PID")),
        "holder_job_pid": _int(_field(entry, "HOSTLOCK_HOLDER_JOB_PID")),
        "hostname": _field(entry, "_HOSTNAME"),
        "message": _field(entry, "MESSAGE"),
    }


def _user(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError, OverflowError, ValueError):
        return None
