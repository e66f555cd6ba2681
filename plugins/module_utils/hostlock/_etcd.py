# GENERATED from lib/hostlock/_etcd.py by `make module-utils`: do not edit; edit lib/hostlock instead.
# SPDX-License-Identifier: GPL-3.0-or-later
"""A small etcd v3 client over its documented JSON gateway (/v3/...), standard library only.

The CLI runs on hosts that have only Python 3.8+, so no gRPC and no third-party client: unary calls go through
http.client (one kept-alive connection per member and caller), watches through a raw socket that reads the
chunked stream of newline-delimited JSON ourselves, so that every read has a deadline.

Every call carries the caller's deadline (time.monotonic()): a member that does not answer is given up at the
deadline, never later. A member that refuses (connection refused or reset, HTTP 503 "no leader", a read that
times out) is skipped for the next one in the URL; when every member failed, the calls are retried with
backoff until the deadline, then FleetUnavailable names the members and the last error. (When the leader dies,
a request in flight to a follower blocks ~6 s and then gets HTTP 503: that is why each attempt's socket
timeout is only part of what is left.)
"""

from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import threading
import time

from ._error import FleetUnavailable, HostlockError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    import ssl

    from ._fleet import FleetURL

MIN_TRY = 2.0  # seconds any one operation may take even with a deadline already past (timeout=0 still asks)
ATTEMPT = 2.5  # at most this long on one member before trying the next (a follower cut off from a dead
# leader holds a request ~6 s before its 503: we ask another member sooner)
_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME (counts suspend and the time a stopped process did not run), else monotonic."""
    if _CLOCK is not None:
        return time.clock_gettime(_CLOCK)
    return time.monotonic()  # pragma: no cover - non-Linux


# gRPC codes the gateway returns in {"code": N}: these mean "ask again, maybe elsewhere".
_RETRY_CODES = frozenset((1, 4, 14))  # CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE (no leader, stopping)
_AUTH_CODES = frozenset((7, 16))  # PERMISSION_DENIED, UNAUTHENTICATED
NOT_FOUND = 5


def b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that selects every key starting with `prefix` (last byte + 1, as etcd's clientv3)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"


class EtcdError(HostlockError):
    """etcd answered, and refused the request (not found, compare failed, bad request); `code` is gRPC's."""

    def __init__(self, message: str, *, code: int = 0, path: str | None = None,
                 directory: str | None = None, errno: int | None = None) -> None:
        super().__init__(message, path=path, directory=directory, errno=errno)
        self.code = code


class _Retry(Exception):
    """This member cannot serve the request now; try the next one."""


def monotonic() -> float:
    return time.monotonic()


class Client:
    """The gateway of one cluster: unary calls with failover, and watches. Safe to share between threads."""

    def __init__(self, url: FleetURL) -> None:
        self.url = url
        self.endpoints = list(url.endpoints)
        self._ssl: ssl.SSLContext | None = None
        self._mutex = threading.Lock()
        self._idle: list = []  # (member index, HTTPConnection) ready for reuse
        self._next = 0  # the member that answered last: asked first
        self._token: str | None = None
        self._token_for: str | None = None  # the token the last auth failure was seen with

    @property
    def answering(self) -> int:
        """The index of the member that answered the last call: calls ask it first, watches open there."""
        return self._next

    # -- connections --------------------------------------------------------------------------------------
    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            import ssl

            ctx = ssl.create_default_context(cafile=self.url.cacert)
            if self.url.cert:
                ctx.load_cert_chain(self.url.cert, self.url.key)
            self._ssl = ctx
        return self._ssl

    def _connection(self, i: int, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._mutex:
            for k, (j, conn) in enumerate(self._idle):
                if j == i:
                    del self._idle[k]
                    if conn.sock is not None:
                        conn.sock.settimeout(timeout)
                    conn.timeout = timeout
                    return conn, True
        host, port = self.endpoints[i]
        if self.url.tls:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context()), False
        return http.client.HTTPConnection(host, port, timeout=timeout), False

    def _keep(self, i: int, conn: http.client.HTTPConnection) -> None:
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
        self._mutex = threading.Lock()

    # -- unary calls --------------------------------------------------------------------------------------
    def _headers(self) -> dict:
        h = {"Content-Type": "application/json"}
        if self._token:
            h["Authorization"] = self._token
        return h

    def _post(self, i: int, path: str, payload: bytes, timeout: float) -> tuple[int, dict]:
        """One request to member i: (HTTP status, JSON body). OSError/HTTPException when it fails."""
        conn, reused = self._connection(i, timeout)
        try:
            try:
                conn.request("POST", path, payload, self._headers())
                resp = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                # A kept-alive connection the member closed while idle: the request never reached it.
                conn.close()
                conn, reused = self._connection_fresh(i, timeout)
                conn.request("POST", path, payload, self._headers())
                resp = conn.getresponse()
            data = resp.read()
            status = resp.status
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            self._keep(i, conn)
        try:
            body = json.loads(data.decode("utf-8")) if data else {}
        except ValueError:
            body = {"error": data[:200].decode("utf-8", "replace"), "code": 14 if status == 503 else 2}
        return status, body if isinstance(body, dict) else {}

    def _connection_fresh(self, i: int, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        host, port = self.endpoints[i]
        if self.url.tls:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context()), False
        return http.client.HTTPConnection(host, port, timeout=timeout), False

    def call(self, path: str, body: dict, deadline: float, min_try: float = MIN_TRY, attempt: float = ATTEMPT,
             sent: list | None = None) -> dict:
        """POST `body` to /v3/`path`; the reply as a dict. FleetUnavailable when no member serves it by the
        deadline (at least `min_try` from now); EtcdError when etcd answers with a refusal. One member gets
        at most `attempt` seconds before the next is asked. `sent[0]` is set to the boottime() at which the
        attempt that succeeded was sent (a lease's TTL runs from after that moment)."""
        payload = json.dumps(body, separators=(",", ":")).encode("utf-8")
        deadline = max(deadline, monotonic() + min_try)
        last = "no member tried"
        delay = 0.02
        authed = False
        while True:
            n = len(self.endpoints)
            transient = 0
            for k in range(n):
                i = (self._next + k) % n
                left = deadline - monotonic()
                if left <= 0:
                    break
                try:
                    if self.url.user and self._token is None:
                        self._authenticate(i, deadline)
                    if sent is not None:
                        sent[:] = [boottime()]
                    status, reply = self._post(i, "/v3/" + path, payload, min(left, attempt))
                    code = _code(reply)
                    if status == 200 and code is None:
                        self._next = i
                        return reply
                    message = _message(reply) or "HTTP %d" % status
                    if status == 503 or code in _RETRY_CODES:
                        raise _Retry(message)
                    if code in _AUTH_CODES or status == 401 or "user name is empty" in message:
                        if self.url.user and not authed and "auth token" in message:
                            # Simple tokens expire (--auth-token-ttl, 300 s idle): log in again, once.
                            self._token, authed = None, True
                            raise _Retry(message)
                        if "user name is empty" in message:
                            message = "authentication required: give a user (etcd://USER@host)"
                        raise self._unavailable("etcd refused access (%s)" % message)
                    raise EtcdError("etcd refused %s: %s" % (path, message), code=code or 0)
                except _Retry as e:
                    transient += 1
                    last = "%s: %s" % (_member(self.endpoints[i]), e)
                except (OSError, http.client.HTTPException) as e:
                    transient += not _permanent(e)
                    last = "%s: %s" % (_member(self.endpoints[i]), _oserror(e))
            left = deadline - monotonic()
            if left <= 0 or not transient:
                raise self._unavailable("etcd unreachable (%s)" % last)
            time.sleep(min(delay, left))  # every member failed just now: back off before the next round
            delay = min(delay * 2, 0.5)

    def _unavailable(self, why: str) -> FleetUnavailable:
        return FleetUnavailable("fleet %s: %s" % (self.url.members, why), endpoints=self.url.members)

    def _authenticate(self, i: int, deadline: float) -> None:
        password = self.url.password
        if password is None:
            raise self._unavailable("user %r needs a password: set $HOSTLOCK_FLEET_PASSWORD" % self.url.user)
        payload = json.dumps({"name": self.url.user, "password": password}).encode("utf-8")
        status, reply = self._post(i, "/v3/auth/authenticate", payload,
                                   max(0.001, min(deadline - monotonic(), ATTEMPT)))
        token = reply.get("token")
        if status == 200 and isinstance(token, str) and token:
            self._token = token
            return
        message = _message(reply) or "HTTP %d" % status
        if status == 503 or _code(reply) in _RETRY_CODES:
            raise _Retry(message)
        raise self._unavailable("etcd refused user %r (%s)" % (self.url.user, message))

    # -- watches ------------------------------------------------------------------------------------------
    def watch(self, key: bytes, range_end: bytes | None, start_revision: int, deadline: float,
              filters: tuple = ("NOPUT",), wake: tuple = ()) -> Watch:
        """A watch stream on key (or [key, range_end)) from start_revision, created by the deadline."""
        req: dict = {"key": b64(key), "start_revision": str(start_revision)}
        if range_end is not None:
            req["range_end"] = b64(range_end)
        if filters:
            req["filters"] = list(filters)
        payload = json.dumps({"create_request": req}).encode("utf-8")
        deadline = max(deadline, monotonic() + MIN_TRY)
        last = "no member tried"
        delay = 0.02
        while True:
            n = len(self.endpoints)
            transient = 0
            for k in range(n):
                i = (self._next + k) % n
                if deadline - monotonic() <= 0:
                    break
                w = Watch(self, i, wake)
                try:
                    if self.url.user and self._token is None:
                        self._authenticate(i, deadline)
                    w.open(payload, deadline)
                    return w
                except _Retry as e:
                    w.close()
                    transient += 1
                    last = "%s: %s" % (_member(self.endpoints[i]), e)
                except (OSError, ValueError) as e:
                    w.close()
                    transient += not _permanent(e)
                    last = "%s: %s" % (_member(self.endpoints[i]), _oserror(e))
                except BaseException:
                    w.close()
                    raise
            left = deadline - monotonic()
            if left <= 0 or not transient:
                raise self._unavailable("etcd unreachable for a watch (%s)" % last)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)


class WatchClosed(OSError):
    """The watch stream ended (member down, connection cut); open a new one from the last revision seen."""


class Watch:
    """One watch stream on one member: HTTP/1.1 chunked, one JSON message per line, read with deadlines."""

    def __init__(self, client: Client, i: int, wake: tuple = ()) -> None:
        self.client, self.i = client, i
        self.wake = wake  # descriptors that end a wait early when readable (a lost lease, a stop request)
        self.sock: socket.socket | None = None
        self._raw = b""  # bytes received, not yet de-chunked
        self._body = b""  # de-chunked bytes, not yet a whole line
        self.revision = 0  # the newest revision the stream reported (header of the last message)

    def open(self, payload: bytes, deadline: float) -> None:
        host, port = self.client.endpoints[self.i]
        sock = socket.create_connection((host, port), timeout=max(0.001, min(deadline - monotonic(), ATTEMPT)))
        if self.client.url.tls:
            sock = self.client._context().wrap_socket(sock, server_hostname=host)
        self.sock = sock
        head = ["POST /v3/watch HTTP/1.1", "Host: %s:%d" % (host, port), "Content-Type: application/json",
                "Content-Length: %d" % len(payload)]
        if self.client._token:
            head.append("Authorization: %s" % self.client._token)
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
        while b"\r\n\r\n" not in self._raw:
            if not self._fill(deadline, wake=False):
                raise socket.timeout("no answer to the watch request")
        head_bytes, self._raw = self._raw.split(b"\r\n\r\n", 1)
        lines = head_bytes.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if len(lines[0].split()) > 1 else 0
        chunked = any(ln.lower().replace(" ", "") == "transfer-encoding:chunked" for ln in lines[1:])
        if status == 503:
            raise _Retry("HTTP 503")
        if status != 200 or not chunked:
            raise _Retry("watch refused: %s" % lines[0])
        first = self.next_message(deadline, wake=False)
        if first is None:
            raise socket.timeout("watch not created in time")
        self._check(first)
        if not first.get("created"):
            raise _Retry("unexpected first watch message: %r" % (first,))

    def _check(self, msg: dict) -> None:
        code = _code(msg)
        if code is not None:
            message = _message(msg) or "error"
            if code in _AUTH_CODES:
                if "auth token" in message:
                    self.client._token = None
                    raise _Retry(message)
                raise self.client._unavailable("etcd refused access (%s)" % message)
            raise _Retry(message)

    def _fill(self, deadline: float, wake: bool = True) -> bool:
        """Read more bytes; False when the deadline passed first. WatchClosed when the stream ended."""
        sock = self.sock
        if sock is None:
            raise WatchClosed("watch closed")
        pending = getattr(sock, "pending", None)
        if not (pending and pending()):
            left = deadline - monotonic()
            if left <= 0:
                return False
            # select first: the socket's own timeout would leave a half-read TLS record or chunk behind.
            ready = select.select([sock, *(self.wake if wake else ())], [], [], min(left, 3600.0))[0]
            if sock not in ready:
                return False
        try:
            sock.settimeout(max(0.001, min(deadline - monotonic(), ATTEMPT)))
            data = sock.recv(65536)
        except socket.timeout:
            return False
        if not data:
            raise WatchClosed("watch stream closed by %s" % _member(self.client.endpoints[self.i]))
        self._raw += data
        return True

    def _dechunk(self) -> None:
        while True:
            end = self._raw.find(b"\r\n")
            if end < 0:
                return
            try:
                size = int(self._raw[:end].split(b";")[0], 16)
            except ValueError:
                raise WatchClosed("malformed chunk in the watch stream") from None
            if size == 0:
                raise WatchClosed("watch stream ended")
            if len(self._raw) < end + 2 + size + 2:
                return
            self._body += self._raw[end + 2:end + 2 + size]
            self._raw = self._raw[end + 2 + size + 2:]

    def next_message(self, deadline: float, wake: bool = True) -> dict | None:
        """The next message's "result" (or error) dict, or None when the deadline passed first."""
        while True:
            self._dechunk()
            nl = self._body.find(b"\n")
            if nl >= 0:
                line, self._body = self._body[:nl], self._body[nl + 1:]
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line.decode("utf-8"))
                except ValueError:
                    raise WatchClosed("malformed message in the watch stream") from None
                if not isinstance(msg, dict):
                    continue
                if "error" in msg and "result" not in msg:
                    err = msg["error"]
                    if not isinstance(err, dict):
                        return {"code": 2, "message": str(err)}
                    return {"code": err.get("grpc_code") or err.get("code") or 2, "message": err.get("message")}
                result = msg.get("result") or {}
                rev = (result.get("header") or {}).get("revision")
                if rev:
                    self.revision = max(self.revision, int(rev))
                return result
            if not self._fill(deadline, wake):
                return None

    def events(self, deadline: float) -> list | None:
        """The next batch of events: [(type, key bytes, kv dict)]; None on deadline. WatchClosed when the
        stream ended or was cancelled (compaction: re-read, then watch again from the current revision)."""
        while True:
            msg = self.next_message(deadline)
            if msg is None:
                return None
            if _code(msg) is not None:
                raise WatchClosed("watch failed: %s" % (_message(msg) or "error"))
            if msg.get("canceled"):
                raise WatchClosed("watch cancelled (%s)" % (msg.get("cancel_reason") or "compacted"))
            evs = msg.get("events")
            if evs:
                return [(e.get("type") or "PUT", unb64((e.get("kv") or {}).get("key")), e.get("kv") or {})
                        for e in evs]

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _code(reply: dict) -> int | None:
    code = reply.get("code")
    if code is None and "error" in reply:
        return 2
    try:
        return int(code) if code is not None and int(code) != 0 else None
    except (TypeError, ValueError):
        return 2


def _message(reply: dict) -> str:
    m = reply.get("message") or reply.get("error") or ""
    return str(m)[:200]


def _member(ep: tuple) -> str:
    host, port = ep
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def _permanent(e: BaseException) -> bool:
    """An error that asking again cannot fix: a certificate that does not verify, a TLS setup mistake."""
    import sys

    ssl = sys.modules.get("ssl")  # loaded only when the URL is etcds://
    return ssl is not None and isinstance(e, ssl.SSLError) and not isinstance(e, (ssl.SSLWantReadError,
                                                                                  ssl.SSLEOFError))


def _oserror(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "no answer in time"
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return text
