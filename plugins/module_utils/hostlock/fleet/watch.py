"""Watch streams on the etcd gateway: /v3/watch, HTTP/1.1 chunked, one JSON message per line, read with
deadlines. A waiter watches the key ahead of it; the keep-alive thread watches each held key. A lock taken
and released at once (`hostlock run NAME true`) opens none, so the command never loads this.
"""

from __future__ import annotations

import _socket
import time

from .b64 import b64, unb64
from .etcd import (
    _AUTH_CODES,
    ATTEMPT,
    MIN_TRY,
    Client,
    _code,
    _message,
    _Retry,
    monotonic,
)
from .transport import _member, _oserror, _permanent
from .wirejson import dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    import socket

# A watch that has said nothing this long is checked, by a waiter (fleet/waiting.py) and a holder's keep-alive
# thread (fleet/keepalive.py) alike: a read through the client, which gives each member CHECK_ATTEMPT before
# it asks the next (every member in turn: the watch's own, which may hang, is often the one asked first). An
# answer from another member than the watch's, or a change the stream did not report, means a new watch where
# the read was answered. So a member that hangs or a link that black-holes costs seconds, whatever the TTL.
CHECK_EVERY = 2.0
CHECK_ATTEMPT = 1.0


def check_deadline(client: Client) -> float:
    """The deadline of a silent watch's check: CHECK_ATTEMPT for each member, so that one answers if any can."""
    return monotonic() + CHECK_ATTEMPT * len(client.endpoints)


def open_watch(client: Client, key: bytes, range_end: bytes | None, start_revision: int, deadline: float,
               filters: tuple = ("NOPUT",), wake: tuple = (), min_try: float = MIN_TRY) -> Watch:
    """A watch stream on key (or [key, range_end)) from start_revision, created by the deadline (at least
    `min_try` from now: the keep-alive thread gives 0, its next keep-alive must not wait for a watch)."""
    req: dict = {"key": b64(key), "start_revision": str(start_revision)}
    if range_end is not None:
        req["range_end"] = b64(range_end)
    if filters:
        req["filters"] = list(filters)
    payload = dumps({"create_request": req}).encode("utf-8")
    deadline = max(deadline, monotonic() + min_try)
    last = "no member tried"
    delay = 0.02
    while True:
        n = len(client.endpoints)
        transient = 0
        for k in range(n):
            i = (client._next + k) % n
            if deadline - monotonic() <= 0:
                break
            w = Watch(client, i, wake)
            try:
                if client.url.user and client._token is None:
                    client._authenticate(i, deadline)
                w.open(payload, deadline)
                return w
            except _Retry as e:
                w.close()
                transient += 1
                last = "%s: %s" % (_member(client.endpoints[i]), e)
            except (OSError, ValueError) as e:
                w.close()
                transient += not _permanent(e)
                last = "%s: %s" % (_member(client.endpoints[i]), _oserror(e))
            except BaseException:
                w.close()
                raise
        left = deadline - monotonic()
        if left <= 0 or not transient:
            raise client._unavailable("etcd unreachable for a watch (%s)" % last)
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
        timeout = max(0.001, min(deadline - monotonic(), ATTEMPT))
        sock = self.client._open(self.i, timeout)
        self.sock = sock
        sock.sendall(self.client._head(self.i, "/v3/watch", len(payload)) + payload)
        while b"\r\n\r\n" not in self._raw:
            try:
                more = self._fill(deadline, wake=False)
            except (WatchClosed, ConnectionResetError) as e:
                if not self._raw:  # closed before a byte of an answer: the URL's scheme may be wrong
                    self.client._diagnose(self.i, e, timeout)
                elif not b"HTTP/".startswith(self._raw[:5]):
                    raise self.client._not_http(self.i, self._raw[:40]) from None
                raise
            if not b"HTTP/".startswith(self._raw[:5]):
                raise self.client._not_http(self.i, self._raw[:40])
            if not more:
                raise _socket.timeout("no answer to the watch request")
        head_bytes, self._raw = self._raw.split(b"\r\n\r\n", 1)
        if not head_bytes.startswith(b"HTTP/"):
            raise self.client._not_http(self.i, head_bytes[:40])
        lines = head_bytes.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if len(lines[0].split()) > 1 else 0
        chunked = any(ln.lower().replace(" ", "") == "transfer-encoding:chunked" for ln in lines[1:])
        if status == 503:
            raise _Retry("HTTP 503")
        if status != 200 or not chunked:
            raise _Retry("watch refused: %s" % lines[0])
        first = self.next_message(deadline, wake=False)
        if first is None:
            raise _socket.timeout("watch not created in time")
        self._check(first)
        if not first.get("created"):
            raise _Retry("unexpected first watch message: %r" % (first,))

    def _check(self, msg: dict) -> None:
        code = _code(msg)
        if code is not None:
            message = _message(msg)[:200] or "error"
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
            import select  # watches only: not on the path of `hostlock run --fleet`

            ready = select.select([sock, *(self.wake if wake else ())], [], [], min(left, 3600.0))[0]
            if sock not in ready:
                return False
        try:
            sock.settimeout(max(0.001, min(deadline - monotonic(), ATTEMPT)))
            data = sock.recv(65536)
        except _socket.timeout:
            return False
        if not data:
            raise WatchClosed("watch stream closed by %s" % _member(self.client.endpoints[self.i]))
        self._raw += data
        return True

    def buffered(self) -> bool:
        """Whether a whole message is here already, read along with an earlier one (etcd may send a watch's
        "created" answer and its first event in one segment): select() on the socket cannot see it, its bytes
        have left the socket. (A stream that ended counts: events() then raises WatchClosed.)"""
        try:
            self._dechunk()
        except WatchClosed:
            return True
        return b"\n" in self._body

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
                    msg = loads(line.decode("utf-8"))
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
                raise WatchClosed("watch failed: %s" % (_message(msg)[:200] or "error"))
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
