"""The lease control channel: where a lease's holder listens, how requests and answers are proven, and
the client side (renew, release).

Split from hostlock.lease (the holder) so that a client needs only core/ and host.safepath: the Ansible
plugins ship exactly this module's import closure to release a lease with one short interpreter run on the
host (plugin_utils/_engine_call.py), the engine's own code rather than a second client. The protocol, the
socket's name and the trust rules are described in hostlock.lease's docstring and docs/security.md ("Leases").
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

from ..core.errors import HostlockError, TokenError
from ..core.names import check_duration, validate_name
from ..core.text import one_line
from ..core.tokens import split_host, token_uid

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only: _socket is imported where a channel is used
    import _socket as socket
    from typing import Any

SOCKET_FILE = ".lease-%s.sock"  # in the lock directory: a dot file, never taken for a lock by list or gc
PROTOCOL = "HL2"  # first word of every request; an older holder refuses it as a wrong token
CLIENT_SECONDS = 10.0  # the most renew()/release() wait for a holder that does not answer


def via(dirfd: int, directory: str, entry: str) -> str:
    """A socket address for `entry` in the directory held by `dirfd`: on Linux /proc/self/fd/N/ENTRY, walked
    no further than that descriptor and short whatever the directory's path; elsewhere the path."""
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd"):
        return "/proc/self/fd/%d/%s" % (dirfd, entry)
    return os.path.join(directory, entry)


def _sha256() -> Any:
    """hashlib.sha256 without importing hashlib, which loads OpenSSL (~2.5 ms of a release run on Python 3.8):
    the interpreter's own SHA-256 module where it has one."""
    try:
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]  # Python 3.12+
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]
        except ImportError:  # built without it: hashlib's
            from hashlib import sha256
    return sha256


_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def hmac_sha256(key: bytes, message: bytes) -> str:
    """hmac.new(key, message, sha256).hexdigest() (RFC 2104), without the hmac and hashlib imports."""
    sha256 = _sha256()
    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b"\0")
    inner = sha256(key.translate(_IPAD) + message).digest()
    return sha256(key.translate(_OPAD) + inner).hexdigest()


def compare_digest(a: bytes, b: bytes) -> bool:
    """hmac.compare_digest (constant time), from the module hmac takes it from when OpenSSL is not loaded."""
    from _operator import _compare_digest

    return _compare_digest(a, b)


def proof(secret: str, kind: str, text: str) -> str:
    """HMAC-SHA256 of `text` under the token's secret; `kind` keeps request and answer proofs apart."""
    return hmac_sha256(secret.encode(), ("hostlock-lease %s\0%s" % (kind, text)).encode())


def path_name(path: str) -> str:
    """The name a path lease answers to on its channel: one word, whatever the path holds (spaces too)."""
    return "path-" + _sha256()(os.path.abspath(path).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def peer_cred(conn: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of the process at the other end as the kernel saw it at connect() or listen(); None where
    the platform cannot say."""
    import _socket as socket  # the C module: `socket` imports selectors and enum (~3.5 ms on Python 3.8)
    import struct

    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    size = struct.calcsize("3i")  # struct ucred: pid, uid, gid
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, opt, size))
    return pid, uid


def peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's uid as the kernel saw it at connect(); None where it cannot say."""
    cred = peer_cred(conn)
    return None if cred is None else cred[1]


def _has_open(pid: int, files: set) -> bool | None:
    """Whether process `pid` has one of `files` ((st_dev, st_ino) pairs) open: the kernel's word
    (/proc/PID/fd); None when it cannot be read from here."""
    fds = "/proc/%d/fd" % pid
    try:
        names = os.listdir(fds)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    for n in names:
        try:
            st = os.stat("%s/%s" % (fds, n))
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in files:
            return True
    return False


def lock_files(dirfd: int, name: str | None, path: str | None) -> set:
    """(st_dev, st_ino) of every file a holder of this lock keeps open: NAME.lock (and flock()'s range files
    NAME.lock.N) or the record mechanism's NAME~... files; for a path lease, the path's file."""
    if path is not None:
        names = [os.path.basename(path)]
    else:
        prefix = (name or "") + "~"
        names = [n for n in os.listdir(dirfd) if n == "%s.lock" % name or n.startswith(prefix)
                 or n.startswith("%s.lock." % name)]
    found = set()
    for n in names:
        try:
            st = os.stat(n, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
    return found


def exchange(address: str, request: bytes, deadline: float, gone: TokenError, holder_uid: int | None,
             is_holder: Any = None) -> str:
    """Send one request and read one line back; '' when the holder hung up without answering.

    The listening peer must be the lease's holder as the kernel reports it, before a byte is sent: its uid
    the one the token names (an older token: ours or root's), and, where /proc tells, a process that has the
    lock's file open (`is_holder(pid)`). Anything else took the name after the holder ended: `gone`.
    """
    import _socket as socket  # the C module: `socket` imports selectors and enum (~3.5 ms on Python 3.8)
    import struct

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # A blocking socket with kernel timeouts, not settimeout(): Python's timeout mode makes connect()
        # non-blocking, which fails at once with EAGAIN while the holder's backlog is full (issue 8).
        left = max(0.001, deadline - time.monotonic())
        tv = struct.pack("@ll", int(left), int(left % 1 * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        try:
            sock.connect(address)
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.EACCES, errno.EPERM):
                raise gone from None  # nobody listens, or a socket we may not reach: not our holder's
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise HostlockError("the holder of lease %s did not accept a connection within %gs" % (
                    address.rsplit("/", 1)[-1], CLIENT_SECONDS), errno=errno.ETIMEDOUT) from None
            raise
        cred = peer_cred(sock)
        if cred is not None:
            pid, uid = cred
            if (uid != holder_uid) if holder_uid is not None else (uid not in (os.geteuid(), 0)):
                raise gone
            if is_holder is not None and pid > 0 and is_holder(pid) is False:
                raise gone
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it hung up at once (BUSY, refused): its answer may still be waiting to be read
        reply = b""
        try:
            while not reply.endswith(b"\n") and len(reply) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
        except (BlockingIOError, InterruptedError):
            raise HostlockError("the holder of lease %s did not answer within %gs" % (
                address.rsplit("/", 1)[-1], CLIENT_SECONDS), errno=errno.ETIMEDOUT) from None
        except (ConnectionResetError, BrokenPipeError):
            pass
    finally:
        sock.close()
    return reply.decode("ascii", "backslashreplace").strip() if reply.endswith(b"\n") else ""


def find_channel(directory: str, tid: str, denied: TokenError) -> tuple[int, str | None, int | None]:
    """Where the holder listens: (dirfd, socket file, its owner uid), or (-1, None, None) when there is no
    socket file (then nobody answers and the lease is gone). Raises `denied` where we may not look: the
    directory is not ours to search."""
    from . import safepath as _safepath

    entry = SOCKET_FILE % tid
    try:
        # Walked, never created (open_directory would make a missing lock directory).
        dirfd = _safepath.open_path(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except _safepath.UnsafePath as e:
        from ..core.errors import LockDirectoryError

        raise LockDirectoryError("cannot reach lease %s in %s: %s" % (tid, directory, e), directory=directory,
                                 errno=e.errno) from None
    except PermissionError:
        raise denied from None
    except OSError:
        return -1, None, None
    try:
        st = os.stat(entry, dir_fd=dirfd, follow_symlinks=False)
    except OSError as e:
        os.close(dirfd)
        if e.errno in (errno.EACCES, errno.EPERM):
            raise denied from None
        return -1, None, None
    if not stat.S_ISSOCK(st.st_mode):  # never connect through a symlink (or to anything but a socket)
        os.close(dirfd)
        return -1, None, None
    return dirfd, entry, st.st_uid


def remove_stale(dirfd: int, directory: str, entry: str, owner: int | None) -> None:
    """A socket file nobody listens on is a holder's that was killed (SIGKILL leaves it): remove it if it
    is ours to remove. Its name came from a secret, so no live holder can have bound it again."""
    import _socket as socket  # the C module: `socket` imports selectors and enum (~3.5 ms on Python 3.8)

    if owner not in (os.geteuid(),) and os.geteuid() != 0:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(via(dirfd, directory, entry))
    except ConnectionRefusedError:
        try:
            os.unlink(entry, dir_fd=dirfd)
        except OSError:
            pass
    except OSError:
        pass
    finally:
        probe.close()


def request(name: str, token: str, directory: str | None, verb: str, arg: str = "-", path: str | None = None) -> str:
    """One authenticated request to the lease's holder; returns its proven "OK ..." answer.

    Only to the holder: the socket file and the listening process must be of the uid the token names, and
    the process must have the lock's file open (the kernel's tables); anything else at the name is not the
    holder, the lease is gone, and it is sent nothing."""
    tid, secret = split_host(token)
    holder_uid = token_uid(token)
    if path is not None:  # a lease on a path (hold(path=...)): its channel answers to the path's name
        path = os.path.abspath(path)
        name, directory = path_name(path), os.path.dirname(path)
    else:
        validate_name(name)
        if not directory:  # imported only here: a caller naming the directory needs none of host.directory
            from .directory import default_directory

            directory = default_directory()
        directory = os.path.abspath(directory)
    shown = path if path is not None else name
    gone = TokenError("no lease %s on lock %r: it expired, was released, or its holder died" % (tid, shown),
                      directory=directory, reason="gone")
    denied = TokenError("lease %s refused the request for lock %r: not the lease holder's user" % (tid, shown),
                        directory=directory, reason="refused")
    if holder_uid is not None and os.geteuid() not in (0, holder_uid):
        raise denied  # its 0600 socket is not ours to reach; nor its holder ours to talk to
    deadline = time.monotonic() + CLIENT_SECONDS
    dirfd, entry, owner = find_channel(directory, tid, denied)
    if entry is None:
        raise gone
    try:
        if (owner != holder_uid) if holder_uid is not None else (owner not in (os.geteuid(), 0)):
            raise gone  # a socket someone else bound at the name, after the holder's went
        files = lock_files(dirfd, None if path is not None else name, path)

        def is_holder(pid: int) -> bool | None:
            return _has_open(pid, files) if files else None

        while True:
            nonce = os.urandom(16).hex()
            text = "%s %s %s %s %s" % (PROTOCOL, verb, name, nonce, arg)
            line = ("%s %s\n" % (text, proof(secret, "request", text))).encode()
            try:
                reply = exchange(via(dirfd, directory, entry), line, deadline, gone, holder_uid, is_holder)
            except TokenError:
                remove_stale(dirfd, directory, entry, owner)
                raise
            if reply != "BUSY":
                break
            if time.monotonic() >= deadline:  # the holder kept dropping us for newer peers: only its own uid can
                raise HostlockError("the holder of lease %s stayed busy for %gs" % (tid, CLIENT_SECONDS),
                                    directory=directory, errno=errno.ETIMEDOUT)
    finally:
        os.close(dirfd)
    if not reply:
        raise gone
    body, _sep, given = reply.rpartition(" ")
    proven = compare_digest(given.encode(), proof(secret, "answer", nonce + " " + body).encode())
    if proven and body.startswith("OK"):
        return body
    if reply.startswith("OK"):
        # Only the holder knows the secret: an unproven OK is not its word.
        raise gone
    # The kernel showed the peer to be the holder (its uid, its open lock file): its refusal of a request it
    # could not prove (a wrong secret) is its word, one inert line.
    raise TokenError("lease %s refused the request for lock %r: %s" % (
        tid, shown, one_line((body if proven else reply)[4:])[:200] or "no answer"), directory=directory,
        reason="refused")


def lease_end(dirfd: int, directory: str, tid: str, pid: int, uid: int, prove: bool) -> tuple[float | None, bool]:
    """(when the lease `tid` ends, proven) as its holder set it: the modification time of its socket file,
    which only the file's owner (or root) may set to a chosen time, read only when that file is a socket of
    the holder's uid (the kernel's word, not a record's). Proven (`prove`, and worth it only for a lease that
    has ended, before anything acts on it) when the process listening on that socket is the holder `pid`
    (SO_PEERCRED): then no text anyone wrote, in a record or a name, says this holder's lease ended.
    (None, False) when there is no such socket: no lease is known (an in-flight holder closed its own)."""
    entry = SOCKET_FILE % tid
    try:
        st = os.stat(entry, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return None, False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid:
        return None, False
    if not prove:
        return st.st_mtime, False
    import _socket as socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)  # a full backlog (a stopped holder's) says EAGAIN at once
        sock.connect(via(dirfd, directory, entry))
        cred = peer_cred(sock)
    except OSError:
        return st.st_mtime, False
    finally:
        sock.close()  # the holder reads end-of-file at once and forgets us
    try:
        again = os.stat(entry, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return None, False
    proven = cred is not None and cred[0] == pid and cred[1] == uid and (again.st_dev, again.st_ino) == (
        st.st_dev, st.st_ino)
    return again.st_mtime, proven


def channel_address(directory: str, token: str) -> str:
    """The holder's socket file for this token in `directory` (what a connect would reach; for tests)."""
    return os.path.join(directory, SOCKET_FILE % split_host(token)[0])


def renew(name: str, token: str, lease: float | None = None, directory: str | None = None,
          path: str | None = None) -> float:
    """Extend (or shorten) a lease to `lease` seconds from now (default: its original length)."""
    if lease is not None:
        lease = check_duration(lease, "lease", positive=True)
    reply = request(name, token, directory, "renew", "-" if lease is None else repr(lease), path)
    return float(reply.split()[1])


def release(name: str, token: str, directory: str | None = None, path: str | None = None) -> None:
    """End a lease: its holder releases the lock and exits."""
    request(name, token, directory, "release", path=path)
