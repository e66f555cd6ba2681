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
from ..core.tokens import split_host

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only: _socket is imported where a channel is used
    import _socket as socket
    from typing import Any

SOCKET_FILE = ".lease-%s.sock"  # in the lock directory: a dot file, never taken for a lock by list or gc
ABSTRACT_PREFIX = "\0hostlock-lease/"  # the Linux fallback where the directory cannot take the socket
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


def peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's uid as the kernel saw it at connect(); None where it cannot say."""
    import _socket as socket  # the C module: `socket` imports selectors and enum (~3.5 ms on Python 3.8)
    import struct

    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    size = struct.calcsize("3i")  # struct ucred: pid, uid, gid
    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, opt, size))[1]


def exchange(address: str, request: bytes, deadline: float, gone: TokenError, owner: int | None = None,
             denied: TokenError | None = None) -> str:
    """Send one request and read one line back; '' when the holder hung up without answering.

    The listening peer must be of our uid or root's (a holder refuses every other user anyway), or, for a
    root client, of the uid that owns the socket file (`owner`): anything else is not our holder.
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
            if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
                raise gone from None
            if e.errno in (errno.EACCES, errno.EPERM):  # a 0600 socket: the holder's uid and root only
                raise (denied or gone) from None
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise HostlockError("the holder of lease %s did not accept a connection within %gs" % (
                    address.rsplit("/", 1)[-1], CLIENT_SECONDS), errno=errno.ETIMEDOUT) from None
            raise
        server = peer_uid(sock)
        me = os.geteuid()
        if server is not None and server not in (me, 0) and not (me == 0 and server == owner):
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
    """Where the holder listens: (dirfd, socket file, its owner uid), or (-1, None, None) for the abstract
    fallback (Linux; also where the directory is gone: then nobody answers and the lease is gone).
    Raises `denied` where we may not look: the directory is not ours to search."""
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
    """One authenticated request to the lease's holder; returns its proven "OK ..." answer."""
    tid, secret = split_host(token)
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
    deadline = time.monotonic() + CLIENT_SECONDS
    dirfd, entry, owner = find_channel(directory, tid, denied)
    try:
        while True:
            nonce = os.urandom(16).hex()
            text = "%s %s %s %s %s" % (PROTOCOL, verb, name, nonce, arg)
            line = ("%s %s\n" % (text, proof(secret, "request", text))).encode()
            if entry is None:
                reply = exchange(ABSTRACT_PREFIX + tid, line, deadline, gone)
            else:
                try:
                    reply = exchange(via(dirfd, directory, entry), line, deadline, gone, owner, denied)
                except TokenError:
                    remove_stale(dirfd, directory, entry, owner)
                    raise
            if reply != "BUSY":
                break
            if time.monotonic() >= deadline:  # the holder kept dropping us for newer peers: only its own uid can
                raise HostlockError("the holder of lease %s stayed busy for %gs" % (tid, CLIENT_SECONDS),
                                    directory=directory, errno=errno.ETIMEDOUT)
    finally:
        if dirfd >= 0:
            os.close(dirfd)
    if not reply:
        raise gone
    body, _sep, given = reply.rpartition(" ")
    proven = compare_digest(given.encode(), proof(secret, "answer", nonce + " " + body).encode())
    if body.startswith("OK") and proven:
        return body
    if reply.startswith("OK"):
        # Only the holder knows the secret: an unproven OK comes from whoever took the name after it ended.
        raise gone
    raise TokenError("lease %s refused the request for lock %r: %s" % (tid, shown, (body if proven else reply)[4:]
                                                                       or "no answer"),
                     directory=directory, reason="refused")


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
