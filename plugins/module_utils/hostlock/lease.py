"""Leases: a lock that outlives the process that asked for it (an Ansible task, a shell step).

hold() forks a detached holder (proc.daemon: new session, double fork, every inherited descriptor closed, stdio
on /dev/null, so it never keeps an SSH connection or a module's pipes open). The holder takes the lock, then
keeps it until release(), until the lease ends, or until it is killed; kernel locks then free at once.

The control channel is a Unix socket named by the token's public id, which status shows to anyone, so it
is built to survive everyone who can reach it (docs/security.md, "Leases"):
- It is a pathname socket, `.lease-ID.sock` in the lock directory (for a path lease, the path's directory,
  which must be one no other user can change entries of), bound before the id is published anywhere, so
  nobody can take the name first, and in a directory where nobody else can remove or replace it. Pathname
  sockets work across network namespaces that share the filesystem (`unshare -n`, containers,
  PrivateNetwork=); abstract ones are per network namespace, where anyone could bind a holder's name. It
  is bound mode 0600 through the directory's descriptor (/proc/self/fd/N/NAME: nothing above it walked
  again, no sun_path length limit), so only the holder's uid and root can connect; any peer that does is
  checked again with SO_PEERCRED at accept, and every one that is neither the holder's uid nor root is
  closed before a byte is read. A holder that cannot bind it (a directory another user may change, no
  inode left) fails: there is no weaker channel to fall back to. A SIGKILLed holder leaves its file: the
  next client that finds nobody listening removes it (if it is that client's own or the client is root);
  whoever binds the name after that is not of the holder's uid (the token names it), or does not have the
  lock's file open, and the client sends it nothing.
- The lease's end is the socket file's modification time, set by the holder at every renewal: only the
  file's owner (or root) can set it, so `status` and `break` judge an ended lease on the holder's own word,
  proven by the socket's peer credentials, never on a record's text (host.channel.lease_end).
- Requests and answers are proven with HMAC-SHA256 keyed by the token's secret, which never crosses the
  socket: the holder compares the request's proof in constant time (channel.compare_digest, as the
  client does the answer's); the client accepts an "OK" only with the holder's proof over its fresh
  nonce, so a process that binds the name after the holder died can neither learn the secret nor fake
  a renewal.
- The holder is one non-blocking selector loop: each connection has a deadline and a size bound, every
  socket error ends only that connection, at most _MAX_CONNECTIONS idle peers are kept (the oldest are
  told BUSY and dropped; the client then retries), and nothing a peer does can block the loop.
"""

from __future__ import annotations

import errno
import os
import time

from .core.errors import HostlockError, LockTimeout
from .core.names import check_duration
from .core.tokens import host_token, split_host
from .host.channel import (
    PROTOCOL,
    SOCKET_FILE,
    channel_address,
    compare_digest,
    path_name,
    peer_uid,
    proof,
    release,
    renew,
    via,
)
from .host.pathlock import PathLock
from .proc.daemon import detached
from .proc.marks import ancestors, marked, wait_unmarked

__all__ = ["EXPIRE_NOW", "channel_address", "hold", "in_flight_environment", "in_flight_pids", "release", "renew",
           "wait_in_flight"]

# The lease to renew to for "end now, after the in-flight work" (durations must be positive, so not 0): the holder
# then waits for every process carrying the lease's mark before it frees the lock, as when a lease runs out.
EXPIRE_NOW = 0.001

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only: socket is imported where a channel is used
    import socket

    from .api import Lock

_MAX_REQUEST = 512  # bytes: a request is one short line; longer is garbage
_REQUEST_SECONDS = 5.0  # a peer gets this long to send its whole request
_MAX_CONNECTIONS = 64  # idle peers kept at once (only the holder's uid and root get this far)


def _open_channel_dir(directory: str, path_lease: bool) -> int:
    """The directory holding the channel's socket: the lock directory (trusted by open_directory) or, for a
    path lease, the path's directory walked by host.safepath."""
    if path_lease:
        from .host import safepath as _safepath

        return _safepath.open_path(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    from .host.directory import open_directory

    return open_directory(directory)[0]


class _PathHolding(PathLock):
    """A path lock held by a lease holder: there is no owner record to update (holders come from /proc)."""

    def update_record(self, job_pid: int | None = None, job_cmdline: str | None = None, *, defer: bool = False,
                      **_fields: str) -> None:
        return None


def hold(name: str, lease: float, *, mode: str = "exclusive", slots: int = 1, directory: str | None = None,
         timeout: float | None = None, mechanism: str = "auto", label: str | None = None,
         in_flight: bool = False, path: str | None = None) -> str:
    """Take `name` in a detached holder process for `lease` seconds; returns the token to release it.

    With `in_flight`, a lease that runs out (rather than being released) keeps the lock until no process
    carrying in_flight_environment(token) is left: the work it protected, still running when its owner
    stopped renewing (a killed controller), never overlaps the next holder's.
    With `path`, the lease holds flock(1)'s lock on that file (host.pathlock.PathLock) instead of a named lock:
    `name`, `slots`, `directory`, `mechanism` and `label` do not apply; renew() and release() take the path.
    """
    from .api import Lock

    lease = check_duration(lease, "lease", positive=True)
    if timeout is not None:
        timeout = check_duration(timeout, "timeout")  # refused here, not in the detached holder
    if path is not None:
        if slots != 1:
            raise ValueError("slots does not apply to a path lock")
        path = os.path.abspath(path)
        name, directory = path_name(path), os.path.dirname(path)
    else:
        probe = Lock(name, mode=mode, slots=slots, directory=directory, mechanism=mechanism, label=label)
        directory = probe.directory
        probe.close()
    token_id, secret = os.urandom(6).hex(), os.urandom(16).hex()
    token = host_token(token_id, secret, os.geteuid())  # the holder runs as we do
    r, daemon = detached(lambda w: _holder(w, name, lease, mode, slots, directory, timeout, mechanism, label,
                                           token_id, secret, in_flight, path))
    try:
        data = b""
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
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
        if path is not None:
            raise LockTimeout("%s is busy" % path, holders=_PathHolding(path)._holders(), path=path)
        from .queries import status

        raise status(name, directory).timed_out(timeout)
    err, _sp, text = last[4:].partition(" ") if last.startswith("ERR ") else ("0", "", "it exited without a word")
    raise HostlockError("lease holder for %r failed: %s" % (name, text), directory=directory,
                        errno=int(err) if err.isdigit() and int(err) else None)


def _holder(w: int, name: str, lease: float, mode: str, slots: int, directory: str, timeout: float | None,
            mechanism: str, label: str | None, token_id: str, secret: str,
            in_flight: bool = False, path: str | None = None) -> None:  # pragma: no cover
    import signal

    os.chdir("/")

    def report(text: str) -> None:
        os.write(w, (text.replace("\n", " ") + "\n").encode("utf-8", "replace"))

    def stop(_sig: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a peer that hangs up is that connection's problem
    from .api import Lock

    listener: _Listener | None = None
    try:
        # Bound before hold() returns the token: the name comes from the secret, so nobody can take it first.
        listener = _Listener(directory, token_id, path is not None)
        sock = listener.sock
        lock: Lock | _PathHolding
        if path is not None:
            lock = _PathHolding(path, mode=mode)
        else:
            lock = Lock(name, mode=mode, slots=slots, directory=directory, mechanism=mechanism, label=label)
        expires = time.time() + lease
        lock.update_record(lease="%.3f" % expires, tid=token_id)
        try:
            lock.acquire(timeout)
        except LockTimeout:
            listener.close()
            report("TIMEOUT")
            return
        expires = time.time() + lease
        listener.mark(expires)
        lock.update_record(lease="%.3f" % expires)
    except BaseException as e:  # noqa: BLE001 - reported to hold() as one line
        if listener is not None:
            listener.close()  # no socket file left behind by a holder that never held
        report("ERR %d %s" % (getattr(e, "errno", None) or 0, e))  # the errno decides the exit code
        return
    report("OK %.3f" % expires)
    os.close(w)
    try:
        channel = _Channel(sock, lock, name, secret, lease)
        channel.listener = listener
        channel.serve()
        if in_flight and not channel.done:  # the lease ran out: its owner stopped renewing, never said "done"
            listener.close()
            key, value = _in_flight_entry(token_id, secret)
            lock.update_record(lease="", job_cmdline="waiting for the in-flight work of its lease to end")
            wait_in_flight(key, value, os.getuid())  # our own uid's processes only (proc.marks)
    finally:
        listener.close()  # stop answering first, so nobody reaches a holder that no longer holds
        lock.release()


IN_FLIGHT_PREFIX = "HOSTLOCK_LEASE_"


def _in_flight_entry(tid: str, secret: str) -> tuple[str, str]:
    # The value is proven with the secret: the token id is public (status shows it), so anyone could
    # otherwise start a process that keeps a root holder's lock past its lease.
    return IN_FLIGHT_PREFIX + tid, proof(secret, "in-flight", tid)[:32]


def in_flight_environment(token: str) -> dict:
    """The environment variable that marks a process (and its children) as work under this lease.

    A lease taken with in_flight=True that runs out waits for every process carrying it before it frees
    the lock (Ansible: the `environment:` of the block the lease protects).
    """
    key, value = _in_flight_entry(*split_host(token))
    return {key: value}


def in_flight_pids(token: str, uid: int | None = None) -> list:
    """The processes of this host carrying the lease's in-flight mark (in_flight_environment), other than us and
    our ancestors: work under the lease still running (a task its `timeout:` ended, left going). Only processes
    whose real and effective uid are `uid` count (None: ours, the lease holder's when its user asks): another
    user can copy the mark into a process of their own (proc.marks). Linux /proc."""
    key, value = _in_flight_entry(*split_host(token))
    return marked(("%s=%s" % (key, value)).encode(), os.getuid() if uid is None else uid, skip=ancestors())


def wait_in_flight(key: str, value: str, uid: int, poll: float = 0.2) -> None:
    """Return once no process of `uid` (real and effective) carries KEY=VALUE in its environment (Linux /proc;
    elsewhere at once): the holder passes its own uid, so another user's copy of the mark keeps nothing."""
    wait_unmarked(("%s=%s" % (key, value)).encode(), uid, poll)


class _Listener:
    """The holder's bound socket and where it lives, so that it can remove exactly its own file at the end."""

    def __init__(self, directory: str, tid: str, path_lease: bool) -> None:
        import socket

        from .host.safepath import replaceable

        self.dirfd = _open_channel_dir(directory, path_lease)
        self.entry: str | None = SOCKET_FILE % tid
        self.ino = -1
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A 0600 socket: only our uid and root may connect (and SO_PEERCRED checks it again at accept).
        old = os.umask(0o177)
        try:
            # Judged as the lock file beside it is (host.safepath.replaceable): a directory where someone we do
            # not trust could swap our socket for theirs is one where they could swap the lock file too.
            why = replaceable(os.geteuid(), os.fstat(self.dirfd), strict=False)
            if why:
                raise HostlockError("no lease's control socket in %s: %s, who could replace it with theirs; lock a "
                                    "file in a directory of yours or root's" % (directory, why),
                                    directory=directory, errno=errno.EPERM)
            try:
                self.sock.bind(via(self.dirfd, directory, self.entry))
            except OSError as e:
                # No weaker channel to fall back to (an abstract name anyone could bind once it is free):
                # a lease nobody but its holder can answer for, or none.
                raise HostlockError("cannot make the lease's control socket %s in %s: %s" % (
                    self.entry, directory, e.strerror or e), directory=directory, errno=e.errno) from None
            self.ino = os.stat(self.entry, dir_fd=self.dirfd, follow_symlinks=False).st_ino
        except BaseException:
            self.sock.close()
            os.close(self.dirfd)
            self.dirfd = -1
            raise
        finally:
            os.umask(old)
        # A deep backlog: connections of other users wait there only until the next accept round drops them.
        self.sock.listen(socket.SOMAXCONN)
        self.sock.setblocking(False)

    def mark(self, expires: float) -> None:
        """Say when the lease ends where only we (and root) can write it: our socket's modification time."""
        if self.dirfd >= 0 and self.entry is not None:
            os.utime(self.entry, (expires, expires), dir_fd=self.dirfd, follow_symlinks=False)

    def close(self) -> None:
        """Stop answering and remove our socket file (only if it is still ours: same inode)."""
        self.sock.close()
        if self.dirfd < 0:
            return
        try:
            if self.entry is not None and \
                    os.stat(self.entry, dir_fd=self.dirfd, follow_symlinks=False).st_ino == self.ino:
                os.unlink(self.entry, dir_fd=self.dirfd)
        except OSError:
            pass
        os.close(self.dirfd)
        self.dirfd = -1


def _send_once(conn: socket.socket, data: bytes) -> None:
    """One non-blocking send; a peer that went away or does not read loses its answer, nothing more.

    Each connection gets one line of under 200 bytes into an empty socket buffer, so a send that does not
    fail writes it whole: there is no partial answer to keep and no slow reader to wait for.
    """
    import socket

    try:
        conn.send(data, socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0))
    except OSError:
        pass


class _Channel:
    """The holder's side of the control channel: one non-blocking selector loop until release or expiry."""

    def __init__(self, sock: socket.socket, lock: Lock | _PathHolding, name: str, secret: str, lease: float) -> None:
        import selectors

        self._events = selectors.EVENT_READ
        # poll(), not epoll: a few dozen descriptors at most, and no extra descriptor kept by the holder.
        self.sel = selectors.PollSelector()
        self.sock = sock
        self.sel.register(sock, self._events)
        self.conns: dict = {}  # socket -> [bytes so far, deadline]; insertion order is arrival order
        self.lock, self.name, self.secret, self.lease = lock, name, secret, lease
        self.deadline = time.monotonic() + lease
        self.trusted = {os.getuid(), 0}  # whoever could signal the holder anyway
        self.done = False
        self.listener: _Listener | None = None

    def serve(self) -> None:
        while not self.done:
            now = time.monotonic()
            if now >= self.deadline:
                return
            wake = min([self.deadline] + [c[1] for c in self.conns.values()])
            # At most an hour per wait: far inside poll()'s int of milliseconds, whatever the rounding.
            for key, _mask in self.sel.select(min(max(0.0, wake - now), 3600.0)):
                if key.fileobj is self.sock:
                    self._accept()
                else:
                    self._read(key.data)
                if self.done:
                    return
            now = time.monotonic()
            for conn, state in list(self.conns.items()):
                if state[1] <= now:
                    self._drop(conn, b"ERR request not received in time\n")

    def _accept(self) -> None:
        # A bounded round, then back to select: a flood of connects cannot keep the loop from the lease's
        # deadline or from peers already accepted.
        for _round in range(256):
            try:
                conn = self.sock.accept()[0]
            except OSError:  # EAGAIN: drained; ECONNABORTED and the like: that peer's problem
                return
            try:
                uid = peer_uid(conn)
                if uid is not None and uid not in self.trusted:
                    # Not a byte read from another user: say why (never blocks) and hang up.
                    _send_once(conn, b"ERR refused: not the lease holder's user\n")
                    conn.close()
                    continue
                conn.setblocking(False)
                self.sel.register(conn, self._events, conn)  # data: the socket, typed (fileobj is int | HasFileno)
            except (OSError, ValueError):
                conn.close()
                continue
            self.conns[conn] = [b"", time.monotonic() + _REQUEST_SECONDS]
            self._read(conn)  # the client writes right after connect: its request is usually here already
            if self.done:
                return
            while len(self.conns) > _MAX_CONNECTIONS:  # only idle peers stay: drop the oldest, it retries
                self._drop(next(iter(self.conns)), b"BUSY\n")

    def _read(self, conn: socket.socket) -> None:
        state = self.conns.get(conn)
        if state is None:  # dropped earlier in this round
            return
        try:
            data = conn.recv(_MAX_REQUEST + 1 - len(state[0]))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn, None)
            return
        if not data:
            self._drop(conn, None)
            return
        state[0] += data
        if b"\n" not in state[0]:
            if len(state[0]) > _MAX_REQUEST:
                self._drop(conn, b"ERR request too long\n")
            return
        self._forget(conn)
        try:
            answer = self._answer(state[0].split(b"\n", 1)[0])
        except Exception as e:  # noqa: BLE001 - one request failed; the lease lives on
            answer = ("ERR %s\n" % e).replace("\n", " ").strip().encode("utf-8", "replace") + b"\n"
        _send_once(conn, answer)
        conn.close()

    def _answer(self, line: bytes) -> bytes:
        """Check one request and act on it; an authentic request gets an answer proven with the secret."""
        try:
            words = line.decode("ascii").split(" ")
        except UnicodeDecodeError:
            return b"ERR malformed request\n"
        if len(words) != 6 or words[0] != PROTOCOL or len(words[3]) != 32:
            return b"ERR malformed request (or a hostlock of another version)\n"
        verb, name, nonce, arg, given = words[1:]
        expected = proof(self.secret, "request", " ".join(words[:5]))
        # Constant time: the comparison must not tell a guesser how much of the proof was right.
        if not compare_digest(given.encode(), expected.encode()):
            return b"ERR wrong token\n"
        if name != self.name:  # an authentic request, for another lock: the caller mixed up its tokens
            return b"ERR wrong token: it is the lease of another lock, not of this one\n"
        if verb == "release":
            # Unlock first, then answer: when release() returns, the lock is free. Done first: if the
            # unlock fails, the holder still ends (and its exit frees a kernel lock).
            self.done = True
            self.sel.unregister(self.sock)
            if self.listener is not None:
                self.listener.close()  # closed and its file removed before the answer: nothing left behind
            else:
                self.sock.close()
            self.lock.release()
            body = "OK"
        elif verb == "renew":
            try:
                more = self.lease if arg == "-" else check_duration(float(arg), "lease", positive=True)
            except ValueError as e:
                body = "ERR %s" % e
            else:
                expires = time.time() + more
                try:
                    if self.listener is not None:
                        self.listener.mark(expires)
                    self.lock.update_record(lease="%.3f" % expires)
                except (OSError, HostlockError) as e:  # keep the old deadline: the record still shows it
                    body = "ERR cannot renew: %s" % e
                else:
                    self.deadline = time.monotonic() + more
                    body = "OK %.3f" % expires
        else:
            body = "ERR unknown request"
        body = body.replace("\n", " ")
        return ("%s %s\n" % (body, proof(self.secret, "answer", nonce + " " + body))).encode("utf-8", "replace")

    def _forget(self, conn: socket.socket) -> None:
        self.conns.pop(conn, None)
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass

    def _drop(self, conn: socket.socket, say: bytes | None) -> None:
        self._forget(conn)
        if say:
            _send_once(conn, say)
        conn.close()
