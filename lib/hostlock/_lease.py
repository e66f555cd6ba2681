"""Leases: a lock that outlives the process that asked for it (an Ansible task, a shell step).

hold() forks a detached holder (new session, double fork, every inherited descriptor closed, stdio on
/dev/null, so it never keeps an SSH connection or a module's pipes open). The holder takes the lock, then
keeps it until release(), until the lease ends, or until it is killed; kernel locks then free at once.
Control goes through a Unix socket named by the token's public id; only the secret half of the token
may renew or release, and a holder signalled by another user is protected by kill()'s own checks.
"""

from __future__ import annotations

import errno
import os
import sys
import time

from ._error import HostlockError, LockTimeout, TokenError
from ._names import check_duration, validate_name

_SOCKET_PREFIX = "\0hostlock-lease/"  # Linux abstract namespace: no file to clean up after a SIGKILL


def _address(directory: str, token_id: str) -> str:
    if sys.platform.startswith("linux"):
        return _SOCKET_PREFIX + token_id
    return os.path.join(directory, ".lease-%s.sock" % token_id)


def _split(token: object) -> tuple[str, str]:
    if not isinstance(token, str):
        raise TokenError("lease token must be a string", reason="malformed")
    tid, sep, secret = token.strip().partition(".")
    if not sep or len(tid) != 12 or len(secret) != 32 or not all(c in "0123456789abcdef" for c in tid + secret):
        raise TokenError("malformed lease token %r: expected the token printed by hold (12 hex, '.', 32 hex)"
                         % (token if len(token) < 80 else token[:80] + "..."), reason="malformed")
    return tid, secret


def hold(name: str, lease: float, *, mode: str = "exclusive", slots: int = 1, directory: str | None = None,
         timeout: float | None = None, mechanism: str = "auto", label: str | None = None) -> str:
    """Take `name` in a detached holder process for `lease` seconds; returns the token to release it."""
    from ._api import Lock

    lease = check_duration(lease, "lease", positive=True)
    if timeout is not None:
        timeout = check_duration(timeout, "timeout")  # refused here, not in the detached holder
    probe = Lock(name, mode=mode, slots=slots, directory=directory, mechanism=mechanism, label=label)
    directory = probe.directory
    probe.close()
    token_id, secret = os.urandom(6).hex(), os.urandom(16).hex()
    token = "%s.%s" % (token_id, secret)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child; covered by the lease tests through processes
        try:
            os.close(r)
            os.setsid()
            if os.fork() == 0:
                _holder(w, name, lease, mode, slots, directory, timeout, mechanism, label, token_id, secret)
        finally:
            os._exit(0)
    os.close(w)
    daemon = 0
    try:
        os.waitpid(pid, 0)
        data = b""
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
            if data.startswith(b"PID ") and b"\n" in data and not daemon:
                daemon = int(data[4:data.index(b"\n")])
    except BaseException:
        if daemon:  # interrupted while waiting: the holder must not take the lock behind our back
            try:
                os.kill(daemon, 15)
            except OSError:
                pass
        raise
    finally:
        os.close(r)
    lines = data.decode("utf-8", "replace").splitlines()
    last = lines[-1] if lines else ""
    if last.startswith("OK "):
        return token
    if last.startswith("TIMEOUT"):
        from ._api import status

        st = status(name, directory)
        who = "; ".join(h.describe() for h in st.holders) or "another holder"
        raise LockTimeout("lock %r in %s is held by %s; gave up after %ss" % (name, directory, who, timeout),
                          holders=st.holders, waiters=st.waiters, directory=directory)
    raise HostlockError("lease holder for %r failed: %s" % (name, last[4:] if last.startswith("ERR ") else
                                                            "it exited without a word"), directory=directory)


def _holder(w: int, name: str, lease: float, mode: str, slots: int, directory: str, timeout: float | None,
            mechanism: str, label: str | None, token_id: str, secret: str) -> None:  # pragma: no cover
    import hmac
    import signal
    import socket

    os.write(w, b"PID %d\n" % os.getpid())
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = {0, 1, 2, w}
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass

    def report(text: str) -> None:
        os.write(w, (text.replace("\n", " ") + "\n").encode("utf-8", "replace"))

    def stop(_sig: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from ._api import Lock

    try:
        lock = Lock(name, mode=mode, slots=slots, directory=directory, mechanism=mechanism, label=label)
        expires = time.time() + lease
        lock.update_record(lease="%.3f" % expires, tid=token_id)
        try:
            lock.acquire(timeout)
        except LockTimeout:
            report("TIMEOUT")
            return
        expires = time.time() + lease
        lock.update_record(lease="%.3f" % expires)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(_address(directory, token_id))
        sock.listen(4)
    except BaseException as e:  # noqa: BLE001 - reported to hold() as one line
        report("ERR %s" % e)
        return
    report("OK %.3f" % expires)
    os.close(w)
    deadline = time.monotonic() + lease
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                conn = sock.accept()[0]
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    words = conn.recv(4096).decode("utf-8", "replace").split()
                except OSError:
                    continue
                if len(words) < 3 or words[1] != name or not hmac.compare_digest(words[2], secret):
                    conn.sendall(b"ERR wrong token\n")
                    continue
                if words[0] == "release":
                    # Unlock first, then answer: when release() returns, the lock is free.
                    sock.close()
                    lock.release()
                    conn.sendall(b"OK\n")
                    break
                if words[0] == "renew":
                    try:
                        more = check_duration(float(words[3]), "lease", positive=True) if len(words) > 3 else lease
                    except ValueError as e:
                        conn.sendall(b"ERR %s\n" % str(e).encode())
                        continue
                    deadline = time.monotonic() + more
                    expires = time.time() + more
                    lock.update_record(lease="%.3f" % expires)
                    conn.sendall(b"OK %.3f\n" % expires)
                else:
                    conn.sendall(b"ERR unknown request\n")
    finally:
        sock.close()  # stop answering first, so nobody reaches a holder that no longer holds
        lock.release()
        if not _address(directory, token_id).startswith("\0"):
            try:
                os.unlink(_address(directory, token_id))
            except OSError:
                pass


def _request(name: str, token: str, directory: str | None, words: str) -> str:
    import socket

    from ._directory import default_directory

    validate_name(name)
    tid, secret = _split(token)
    directory = os.path.abspath(directory or default_directory())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10.0)
        try:
            sock.connect(_address(directory, tid))
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
                raise TokenError("no lease %s on lock %r: it expired, was released, or its holder died"
                                 % (tid, name), directory=directory, reason="gone") from None
            raise
        sock.sendall(("%s %s %s %s\n" % (words.split()[0], name, secret, " ".join(words.split()[1:]))).encode())
        reply = b""
        try:
            while not reply.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
        except (ConnectionResetError, BrokenPipeError):
            reply = b""
        if not reply:
            raise TokenError("no lease %s on lock %r: it expired, was released, or its holder died"
                             % (tid, name), directory=directory, reason="gone")
    finally:
        sock.close()
    text = reply.decode("utf-8", "replace").strip()
    if not text.startswith("OK"):
        raise TokenError("lease %s refused the request for lock %r: %s" % (tid, name, text[4:] or "no answer"),
                         directory=directory, reason="refused")
    return text


def token_id(token: str) -> str:
    """The public half of a lease token: what status shows as a holder's token_id."""
    return _split(token)[0]


def renew(name: str, token: str, lease: float | None = None, directory: str | None = None) -> float:
    """Extend (or shorten) a lease to `lease` seconds from now (default: its original length)."""
    if lease is not None:
        lease = check_duration(lease, "lease", positive=True)
    reply = _request(name, token, directory, "renew" + ("" if lease is None else " %r" % lease))
    return float(reply.split()[1])


def release(name: str, token: str, directory: str | None = None) -> None:
    """End a lease: its holder releases the lock and exits."""
    _request(name, token, directory, "release")
