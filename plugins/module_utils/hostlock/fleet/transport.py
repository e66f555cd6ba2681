"""The wire under the etcd client (fleet/etcd.py): connections to a cluster's members, the little HTTP/1.1
they need, TLS from the URL's files, and name lookups bounded in time. Nothing here knows etcd's JSON or codes.

Plain sockets, so that every read has a deadline and the command line never imports http.client (and with it
the `email` package): `_Conn` is one kept-alive connection per member and caller (fleet/watch.py's `Watch`
reads the chunked stream of a watch over one of its own).

Mistakes in the URL fail at once with FleetConfigError naming the file or the scheme: a TLS file missing,
unreadable or not PEM; etcd:// to a TLS member or etcds:// to a plain one (found by asking the member once
in the other protocol when it ends a fresh connection without a word).
"""

from __future__ import annotations

import _socket
import _thread
import sys
import time

from ..core.errors import FleetConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    import socket
    import ssl
    from typing import Callable

    from ..core.model import Meanwhile
    from .url import FleetURL

ATTEMPT = 2.5  # at most this long on one member before trying the next (a follower cut off from a dead
# leader holds a request ~6 s before its 503: we ask another member sooner)
MAX_HEAD = 65536  # an answer's head beyond this is not the gateway's (its heads are a few hundred bytes)
MAX_ANSWER = 8 << 20  # bytes buffered from one member at once (one answer, one watch message)


def monotonic() -> float:
    return time.monotonic()


class Connections:
    """The connections to one cluster's members (fleet.etcd.Client makes its calls over them): kept-alive ones
    for reuse, the TLS context, which member to ask first. Safe to share between threads."""

    def __init__(self, url: FleetURL) -> None:
        self.url = url
        self.endpoints = list(url.endpoints)
        self._ssl: ssl.SSLContext | None = None
        self._mutex = _thread.allocate_lock()
        self._idle: list = []  # (member index, _Conn) ready for reuse
        self._next = 0  # the member that answered last: asked first

    @property
    def answering(self) -> int:
        """The index of the member that answered the last call: calls ask it first, watches open there."""
        return self._next

    def _context(self) -> ssl.SSLContext:
        """The TLS context of etcds://, its files checked first: a file missing, unreadable or not PEM is a
        configuration mistake (FleetConfigError naming the file), never retried as if the member were down."""
        if self._ssl is None:
            import ssl

            url = self.url
            for what, path in (("cacert", url.cacert), ("cert", url.cert), ("key", url.key)):
                if path is not None:
                    _readable(what, path)
            try:
                ctx = ssl.create_default_context(cafile=url.cacert)
            except (ssl.SSLError, ValueError) as e:
                raise FleetConfigError("fleet TLS: cacert file %s holds no usable CA certificate (%s)"
                                       % (url.cacert, _ssl_reason(e))) from None
            if url.cert:
                try:
                    # password=: OpenSSL would otherwise ask for a key's passphrase on the terminal (a
                    # command that waits for ever, even with -n) or fail with a bare EINVAL.
                    ctx.load_cert_chain(url.cert, url.key, password=_no_passphrase)
                except _Encrypted:
                    raise FleetConfigError("fleet TLS: key file %s is encrypted (it has a passphrase): hostlock "
                                           "cannot ask for one; give a key without it, readable by its user only"
                                           % url.key) from None
                except (ssl.SSLError, ValueError, OSError) as e:
                    raise FleetConfigError("fleet TLS: cert file %s and key file %s are not a certificate and "
                                           "its private key in PEM (%s)" % (url.cert, url.key, _ssl_reason(e))
                                           ) from None
            self._ssl = ctx
        return self._ssl

    def _open(self, i: int, timeout: float) -> socket.socket:
        """A new connection to member i (TLS for etcds://), blocking with `timeout` per operation.

        A member that ends the connection before saying anything is asked once in the other protocol: a TLS
        member reached with etcd:// (it closes on plain HTTP) or a plain one reached with etcds:// (it resets
        on a TLS hello) is a mistake in the URL (FleetConfigError), not a member that is down."""
        host, port = self.endpoints[i]
        ctx = self._context() if self.url.tls else None  # its files first: a mistake there needs no network
        sock = _connect(host, port, timeout)
        try:
            # Requests are one small write each; without this, Nagle would hold one back.
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            if ctx is not None:
                try:
                    return ctx.wrap_socket(sock, server_hostname=host)
                except (ConnectionResetError, BrokenPipeError) as e:
                    self._diagnose(i, e, timeout)
                    raise
                except OSError as e:
                    if type(e).__name__ in ("SSLEOFError", "SSLZeroReturnError") or _ssl_reason(e) in (
                            "WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING", "HTTP_REQUEST"):
                        self._diagnose(i, e, timeout)
                    raise
            return sock
        except BaseException:
            sock.close()
            raise

    def _diagnose(self, i: int, e: BaseException, timeout: float) -> None:
        """Member i ended a fresh connection before answering: FleetConfigError when it speaks the other
        protocol (asked once, within `timeout`); returns when it does not (then `e` is what it is)."""
        host, port = self.endpoints[i]
        member = _member(self.endpoints[i])
        import ssl  # before _connect: the TLS probe needs a socket.socket (an error path only)

        try:
            probe = _connect(host, port, min(timeout, ATTEMPT))
            try:
                if self.url.tls:
                    probe.sendall(b"GET /version HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                                  % member.encode("ascii"))
                    answer = probe.recv(5)
                    if answer.startswith(b"HTTP/"):
                        raise FleetConfigError("fleet %s: member %s speaks plain HTTP, not TLS: use etcd://, "
                                               "not etcds://" % (self.url.members, member)) from None
                    return
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE  # only asks "is this TLS?": nothing is sent over it
                try:
                    ctx.wrap_socket(probe, server_hostname=host).close()
                except ssl.SSLError as tls:
                    if isinstance(tls, (ssl.SSLEOFError, ssl.SSLZeroReturnError)) or \
                            _ssl_reason(tls) == "WRONG_VERSION_NUMBER":
                        return
                raise FleetConfigError("fleet %s: member %s speaks TLS: use etcds:// (with ?cacert=FILE), "
                                       "not etcd://" % (self.url.members, member)) from None
            finally:
                probe.close()
        except OSError:
            return

    def _not_http(self, i: int, first: bytes) -> FleetConfigError:
        member = _member(self.endpoints[i])
        if first[:1] in (b"\x15", b"\x16") and first[1:2] == b"\x03":  # a TLS record: alert or handshake
            return FleetConfigError("fleet %s: member %s speaks TLS: use etcds:// (with ?cacert=FILE), not "
                                    "etcd://" % (self.url.members, member))
        return FleetConfigError("fleet %s: member %s does not answer HTTP (it sent %r): is that etcd's client "
                                "port (2379 by default)?" % (self.url.members, member, first[:24]))

    def _conn(self, i: int, timeout: float) -> tuple[_Conn, bool]:
        """A kept-alive connection to member i if one is idle, else a new one; (connection, reused)."""
        with self._mutex:
            for k, (j, conn) in enumerate(self._idle):
                if j == i:
                    del self._idle[k]
                    return conn, True
        return _Conn(self._open(i, timeout)), False

    def _keep(self, i: int, conn: _Conn) -> None:
        with self._mutex:
            if len(self._idle) < 8:
                self._idle.append((i, conn))
                return
        conn.close()

    def close(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, []
        for _i, conn in idle:
            conn.close()

    def forget(self) -> None:
        """After fork, in the child: drop the parent's connections without touching them."""
        self._idle = []
        self._mutex = _thread.allocate_lock()

    def _tls_refused(self, i: int, e: BaseException) -> str:
        """What a TLS failure that asking again cannot fix says, in one line naming the file to check: the
        member's certificate against our CA file (or the system's), or our client certificate refused."""
        member = _member(self.endpoints[i])
        ssl = sys.modules["ssl"]
        if isinstance(e, ssl.SSLCertVerificationError):
            against = ("cacert file %s" % self.url.cacert if self.url.cacert else
                       "the system's CA certificates (no ?cacert=FILE given)")
            return "etcd refused TLS: member %s's certificate does not verify against %s: %s" % (
                member, against, e.verify_message or _ssl_reason(e))
        reason = _ssl_reason(e)
        if "ALERT" in reason.upper() and "CERTIFICATE" in reason.upper():
            mine = "cert file %s" % self.url.cert if self.url.cert else "no client certificate (give cert= and key=)"
            return "etcd refused TLS: member %s refused our client certificate (%s; %s)" % (member, mine, reason)
        return "etcd refused TLS: member %s (%s)" % (member, reason)


class _Silent(ConnectionError):
    """The member closed a connection before any byte of an answer."""


class _NotHTTP(ConnectionError):
    """What answered is not HTTP (a TLS record, an SSH banner): a mistake in the URL, not a member down."""

    def __init__(self, first: bytes) -> None:
        super().__init__("not an HTTP answer")
        self.first = first


class Pending:
    """A request written by Client.send_first() whose answer is still to be read (Client.two_in_turn reads it)."""

    __slots__ = ("conn", "i", "end", "reused")

    def __init__(self, conn: _Conn, i: int, end: float, reused: bool = False) -> None:
        self.conn, self.i, self.end = conn, i, end  # the connection, its member's index, the attempt's end
        self.reused = reused  # a kept-alive connection (one a member may have closed while idle)

    def abandon(self) -> None:
        """Its answer will never be read: the connection is closed (never reused with an answer pending)."""
        self.conn.close()


class _Conn:
    """One HTTP/1.1 connection to a member, kept alive between requests.

    Just what the gateway needs (a POST with Content-Length; an answer with Content-Length, chunked, or up
    to the close) over the socket: http.client would cost the CLI its `email` package at every start."""

    __slots__ = ("sock", "buf")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _more(self, end: float, started: bool) -> bool:
        """Read more into buf; False at the end of the stream. _socket.timeout when `end` passed and nothing
        more is there: what came in time is read even when we look late (the command still loading its modules
        on a busy machine while the early grant's answer waits in the socket)."""
        self.sock.settimeout(max(end - monotonic(), 0.001))
        data = self.sock.recv(65536)
        if not data:
            if not started:
                raise _Silent("connection closed without an answer")
            return False
        self.buf += data
        if len(self.buf) > MAX_ANSWER:
            # Not etcd's (a lock's prefix answers in kilobytes): an endless body must not fill the memory.
            raise ConnectionResetError("an answer of more than %d MiB" % (MAX_ANSWER >> 20))
        return True

    def exchange(self, request: bytes, timeout: float,
                 meanwhile: Meanwhile | None = None) -> tuple[int, bytes, bool]:
        """Send one request, read its answer: (status, body, whether the connection must be closed).
        `meanwhile()` runs between the two (see Client.call)."""
        end = monotonic() + timeout
        self.buf = b""
        self.send(request, timeout)
        if meanwhile is not None:
            meanwhile()
        return self.answer(end)

    def send(self, request: bytes, timeout: float) -> None:
        self.sock.settimeout(timeout)
        self.sock.sendall(request)

    def answer(self, end: float) -> tuple[int, bytes, bool]:
        """Read the next answer (monotonic deadline `end`): (status, body, whether the connection must be
        closed). What follows it (a next request's answer) stays in buf."""
        while True:
            while b"\r\n\r\n" not in self.buf:
                more = self._more(end, bool(self.buf))
                if not b"HTTP/".startswith(self.buf[:5]) or len(self.buf) > MAX_HEAD:
                    raise _NotHTTP(self.buf[:40])
                if not more:
                    raise ConnectionResetError("connection closed in the middle of an answer")
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            status_line = lines[0].split(None, 2)
            if len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isdigit():
                raise _NotHTTP(head[:40])
            status = int(status_line[1])
            if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
                continue
            break
        fields = {}
        for line in lines[1:]:
            k, _colon, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
        close = status_line[0] == "HTTP/1.0" or fields.get("connection", "").lower() == "close"
        if "chunked" in fields.get("transfer-encoding", "").lower():
            return status, self._chunked(end), close
        if "content-length" in fields:
            try:
                n = int(fields["content-length"])
            except ValueError:
                raise ConnectionResetError("bad Content-Length") from None
            while len(self.buf) < n:
                if not self._more(end, True):
                    raise ConnectionResetError("connection closed in the middle of an answer")
            body, self.buf = self.buf[:n], self.buf[n:]
            return status, body, close
        while self._more(end, True):  # neither: the body runs to the close
            pass
        return status, self.buf, True

    def _chunked(self, end: float) -> bytes:
        body: list[bytes] = []
        while True:
            while b"\r\n" not in self.buf:
                if not self._more(end, True):
                    raise ConnectionResetError("connection closed in the middle of an answer")
            line, rest = self.buf.split(b"\r\n", 1)
            try:
                size = int(line.split(b";")[0], 16)
            except ValueError:
                raise ConnectionResetError("malformed chunk") from None
            if size == 0:  # the last chunk, then trailers up to an empty line
                self.buf = rest
                while not (self.buf.startswith(b"\r\n") or b"\r\n\r\n" in self.buf):
                    if not self._more(end, True):
                        break
                return b"".join(body)
            while len(rest) < size + 2:
                if not self._more(end, True):
                    raise ConnectionResetError("connection closed in the middle of an answer")
                line, rest = self.buf.split(b"\r\n", 1)
            body.append(rest[:size])
            self.buf = rest[size + 2:]


def _member(ep: tuple) -> str:
    host, port = ep
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def _permanent(e: BaseException) -> bool:
    """An error that asking again cannot fix: a certificate that does not verify, a TLS setup mistake."""
    ssl = sys.modules.get("ssl")  # loaded only when the URL is etcds://
    return ssl is not None and isinstance(e, ssl.SSLError) and not isinstance(e, (ssl.SSLWantReadError,
                                                                                  ssl.SSLEOFError))


def _oserror(e: BaseException) -> str:
    if isinstance(e, _socket.timeout):
        return "no answer in time"
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return text


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """socket.create_connection on `_socket`: the `socket` module costs the CLI ~2 ms of imports (enum);
    ssl, for etcds://, needs a socket.socket and imports that module anyway. The name is looked up within
    `timeout` (_resolve)."""
    err: OSError | None = None
    found = _resolve(host, port, timeout)
    make: Callable[..., object] = _socket.socket
    if sys.modules.get("ssl") is not None:
        import socket

        make = socket.socket
    for family, kind, proto, _name, address in found:
        sock: socket.socket = make(family, kind, proto)  # type: ignore[assignment]  # _socket's has what is used
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            err = e
    raise err or OSError("getaddrinfo returned nothing for %s" % host)


RESOLVED_FOR = 30.0  # seconds a name's addresses are reused: one lookup per command, not one per connection
_resolved: dict = {}  # (host, port) -> (monotonic time, getaddrinfo's list)


def _resolve(host: str, port: int, timeout: float) -> list:
    """getaddrinfo, bounded by `timeout`: against a resolver that does not answer, glibc takes 10 s a lookup
    and a command makes several, so `-n` took 40 s. An address is not looked up; a name is, on a thread of
    its own (left to finish by itself when the time is up), and kept RESOLVED_FOR. The host goes to getaddrinfo
    as bytes (validated ASCII by the URL's parser): a str would load the idna codec."""
    try:
        name = host.encode("ascii")
    except UnicodeError:  # the URL's parser lets none through: a Lock given endpoints some other way
        raise FleetConfigError("fleet member %r: a host name must be ASCII" % host) from None
    for family in (_socket.AF_INET, _socket.AF_INET6):
        try:
            _socket.inet_pton(family, host.split("%", 1)[0])
        except OSError:
            continue
        return _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM)  # an address: nothing to look up
    now = monotonic()
    hit = _resolved.get((host, port))
    if hit is not None and now - hit[0] < RESOLVED_FOR:
        return hit[1]
    box: list = []
    done = _thread.allocate_lock()
    done.acquire()

    def look() -> None:
        try:
            box.append(_socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM))
        except BaseException as e:  # noqa: BLE001  # handed to the caller
            box.append(e)
        finally:
            done.release()

    import _signal

    # Started with every signal blocked, so none meant for the main thread (a job's, forwarded) lands here.
    old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    try:
        _thread.start_new_thread(look, ())
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old)
    if not done.acquire(True, max(0.001, timeout)):
        raise _socket.timeout("no answer in time from the name service for %s" % host)
    got = box[0]
    if isinstance(got, BaseException):
        raise got
    _resolved[(host, port)] = (now, got)
    return got


def _readable(what: str, path: str) -> None:
    """FleetConfigError naming the file when `path` (a TLS file of the URL) is not a regular file we can read.
    Opened without blocking: a FIFO there would hang the command forever (no deadline covers an open)."""
    import stat

    from ..core import oslite as os

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError) as e:
        raise FleetConfigError("fleet TLS: cannot read %s file %s: %s"
                               % (what, path, getattr(e, "strerror", None) or e)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FleetConfigError("fleet TLS: %s file %s is not a regular file" % (what, path))
    finally:
        os.close(fd)


class _Encrypted(Exception):
    """The client key has a passphrase (see _no_passphrase)."""


def _no_passphrase() -> bytes:
    raise _Encrypted()


def _ssl_reason(e: BaseException) -> str:
    return str(getattr(e, "reason", None) or getattr(e, "strerror", None) or e)
