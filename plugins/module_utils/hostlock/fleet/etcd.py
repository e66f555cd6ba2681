"""A small etcd v3 client over its documented JSON gateway (/v3/...), standard library only: etcd's side of
the calls (failover, retries, its error codes, authentication); the connections, HTTP/1.1, TLS and name
lookups under them are fleet/transport.py's.

The CLI runs on hosts that have only Python 3.8+, so no gRPC and no third-party client: unary calls here, and
watches (fleet/watch.py: the chunked stream of newline-delimited JSON).

Every call carries the caller's deadline (time.monotonic()): a member that does not answer is given up at the
deadline, never later. A member that refuses (connection refused or reset, HTTP 503 "no leader", a read that
times out) is skipped for the next one in the URL; when every member failed, the calls are retried with
backoff until the deadline, then FleetUnavailable names the members and the last error. (When the leader dies,
a request in flight to a follower blocks ~6 s and then gets HTTP 503: that is why each attempt's socket
timeout is only part of what is left.)
"""

from __future__ import annotations

import time

from ..core.clock import boottime
from ..core.errors import FleetConfigError, FleetRefused, FleetUnavailable
from .transport import (
    ATTEMPT,
    Connections,
    Pending,
    _Conn,
    _member,
    _NotHTTP,
    _oserror,
    _permanent,
    _Silent,
    monotonic,
)
from .wirejson import dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

    from ..core.model import Meanwhile
    from .url import FleetURL

MIN_TRY = 2.0  # seconds any one operation may take even with a deadline already past (timeout=0 still asks)
# gRPC codes the gateway returns in {"code": N}: these mean "ask again, maybe elsewhere".
_RETRY_CODES = frozenset((1, 4, 14))  # CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE (no leader, stopping)
_EXHAUSTED = 8  # RESOURCE_EXHAUSTED: "too many requests" passes (etcd sheds load); "database space exceeded" not
_AUTH_CODES = frozenset((7, 16))  # PERMISSION_DENIED, UNAUTHENTICATED
NOT_FOUND = 5


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that selects every key starting with `prefix` (last byte + 1, as etcd's clientv3)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"


class EtcdError(FleetRefused):
    """etcd answered, and refused the request (not found, compare failed, bad request); `code` is gRPC's."""

    def __init__(self, message: str, *, code: int = 0, path: str | None = None,
                 directory: str | None = None, errno: int | None = None) -> None:
        super().__init__(message, path=path, directory=directory, errno=errno)
        self.code = code


class _Retry(Exception):
    """This member cannot serve the request now; try the next one."""


class Client(Connections):
    """The gateway of one cluster: unary calls with failover, and watches. Safe to share between threads."""

    def __init__(self, url: FleetURL) -> None:
        super().__init__(url)
        self._token: str | None = None
        self._token_for: str | None = None  # the token the last auth failure was seen with

    # -- unary calls --------------------------------------------------------------------------------------
    def _head(self, i: int, path: str, length: int) -> bytes:
        host, port = self.endpoints[i]
        head = "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
            path, _member((host, port)), length)
        if self._token:
            head += "Authorization: %s\r\n" % self._token
        return (head + "\r\n").encode("latin-1")

    def _post(self, i: int, path: str, payload: bytes, timeout: float,
              meanwhile: Meanwhile | None = None) -> tuple[int, dict]:
        """One request to member i: (HTTP status, JSON body). OSError when it fails."""
        conn, reused = self._conn(i, timeout)
        try:
            try:
                status, data, close = conn.exchange(self._head(i, path, len(payload)) + payload, timeout,
                                                    meanwhile)
            except (_Silent, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if reused:
                    # A kept-alive connection the member closed while idle: the request never reached it.
                    conn, reused = _Conn(self._open(i, timeout)), False
                    try:
                        status, data, close = conn.exchange(self._head(i, path, len(payload)) + payload, timeout,
                                                            meanwhile)
                    except (_Silent, ConnectionResetError) as again:
                        self._diagnose(i, again, timeout)
                        raise
                else:
                    self._diagnose(i, e, timeout)
                    raise
        except _NotHTTP as e:
            conn.close()
            raise self._not_http(i, e.first) from None
        except BaseException:
            conn.close()
            raise
        if close:
            conn.close()
        else:
            self._keep(i, conn)
        try:
            if not data and status != 200:
                raise ValueError("no body")  # etcd's gateway answers every error with JSON
            body = loads(data.decode("utf-8")) if data else {}
        except ValueError:
            # Not the gateway's JSON: a proxy's error page (5xx: ask again), or not etcd's v3 API at all (4xx:
            # a mistake, see _not_etcd). Its text is never repeated: a service that echoes the request would
            # put the password of auth/authenticate, or the token of the Authorization header, in a message.
            body = {"error": "HTTP %d, not etcd's JSON" % status, "code": 14 if status >= 500 else 2, "raw": True}
        return status, body if isinstance(body, dict) else {}

    def call(self, path: str, body: dict, deadline: float, min_try: float = MIN_TRY, attempt: float = ATTEMPT,
             sent: list | None = None, meanwhile: Meanwhile | None = None, refused_ends: bool = False) -> dict:
        """POST `body` to /v3/`path`; the reply as a dict. FleetUnavailable when no member serves it by the
        deadline (at least `min_try` from now); EtcdError when etcd answers with a refusal. One member gets
        at most `attempt` seconds before the next is asked. `sent[0]` is set to the boottime() at which the
        attempt that succeeded was sent (a lease's TTL runs from after that moment). `meanwhile()` is called
        once a request is sent, before its answer is read (on each attempt: the caller makes it run once),
        so that the caller's own work overlaps etcd's. It may not raise an Exception (an OSError would pass
        for the member's). `refused_ends`: give up as soon as every member refused the connection in one round
        (no etcd process listens anywhere: nothing to wait for, e.g. a revoke of a lease nobody renews)."""
        payload = dumps(body).encode("utf-8")
        deadline = max(deadline, monotonic() + min_try)
        last = "no member tried"
        refusal = ""  # a member's TLS refusal (see _tls_refused): named in preference to `last`
        delay = 0.02
        authed = False
        while True:
            n = len(self.endpoints)
            transient = refused = 0
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
                    status, reply = self._post(i, "/v3/" + path, payload, min(left, attempt), meanwhile)
                    code = _code(reply)
                    if status == 200 and code is None:
                        wrong = _unshaped(path, reply)
                        if wrong:
                            # JSON, but not etcd's (every answer of its gateway has a header): another service.
                            raise self._not_etcd(i, status, path, wrong)
                        self._next = i
                        return reply
                    message = self._scrub(_message(reply)) or "HTTP %d" % status
                    if reply.get("raw") and status < 500:
                        raise self._not_etcd(i, status, path)
                    if status == 503 or code in _RETRY_CODES or _shedding(status, code, message):
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
                except OSError as e:
                    if _permanent(e):
                        refusal = refusal or self._tls_refused(i, e)
                    else:
                        transient += 1
                    refused += isinstance(e, ConnectionRefusedError)
                    last = "%s: %s" % (_member(self.endpoints[i]), _oserror(e))
            left = deadline - monotonic()
            if left <= 0 or not transient or (refused_ends and refused == n):
                raise self._unavailable(refusal or "etcd unreachable (%s)" % last)
            time.sleep(min(delay, left))  # every member failed just now: back off before the next round
            delay = min(delay * 2, 0.5)

    def send_first(self, path: str, body: dict, deadline: float, sent: list) -> Pending | None:
        """The first half of two_in_turn(): POST `body` to /v3/`path` on a connection to the member asked first,
        its answer left unread; None when it could not be written (the member that failed is then asked last,
        as call() asks the next after a failure). Nothing is raised but a FleetConfigError of the URL's
        credentials. `sent[0]` is the boottime() at which it was sent. As in call(), the member has at least
        MIN_TRY: a deadline already past (-n) gave it a millisecond, and a member slower than that to answer (any,
        on a busy machine) was skipped: `etcd://TLS,PLAIN` then took the lock from the plain one."""
        n = len(self.endpoints)
        i = self._next % n
        deadline = max(deadline, monotonic() + MIN_TRY)
        timeout = min(deadline - monotonic(), ATTEMPT)
        end = monotonic() + timeout
        try:
            if self.url.user and self._token is None:
                self._authenticate(i, deadline)
            conn, reused = self._conn(i, timeout)
        except (_Retry, OSError):
            self._next = (i + 1) % n
            return None
        try:
            payload = dumps(body).encode("utf-8")
            sent[:] = [boottime()]
            conn.buf = b""
            conn.send(self._head(i, "/v3/" + path, len(payload)) + payload, timeout)
        except OSError:
            conn.close()
            self._next = (i + 1) % n
            return None
        return Pending(conn, i, end, reused)

    def two_in_turn(self, path: str, body: dict, then: Callable[[], tuple[str, dict]], deadline: float, sent: list,
                    meanwhile: Meanwhile | None = None,
                    between: Callable[[dict], None] | None = None,
                    pending: Pending | None = None) -> tuple[dict | None, dict | None]:
        """Two requests on one connection to the member asked first: POST `body` to /v3/`path` (the lease's
        grant), and once etcd has answered it, the request `then()` builds (path, body: the queue transaction
        that puts our key on that lease), then run `meanwhile()` while the second is on its way: the caller's
        work overlaps etcd's. `between(reply)` runs once the first is answered, after `meanwhile` (before the
        second's answer is read; at once when the second is not written). `sent[0]` is the
        boottime() at which the first was sent. `pending`: the first, sent already by send_first() (then `path`
        and `body` are not sent again; None there: it could not be): the command line sends the grant as soon as
        its options are read, so its answer is there when the lock's modules have loaded, and the second costs
        no wait for it.

        Why the second waits for the first's answer, though etcd would answer both in order: a grant we gave up
        on (a path that delivers bytes late: a congested link, a proxy that buffers) may reach etcd after the
        command is done and has revoked that lease id, and etcd then grants it anew; a transaction written
        behind it would then put a key nobody holds in the queue, for a whole TTL. Written only after the
        grant's answer, a transaction that arrives late finds our lease revoked ("requested lease not found")
        or our key there (its compare fails): nothing.

        Each reply is a dict when etcd answered it with success (HTTP 200, no error code, etcd's header), else
        None: the caller then does that request (and the second, when the first is None) with call(), whose
        retries, errors and messages are the only ones a caller sees; `meanwhile` too is left to the caller
        when the second was not written. Network failures give None too: nothing is raised but what
        `meanwhile`, `then` or `between` raise, or a FleetConfigError (a mistake in the URL, found as call()
        finds it: the member's first answer not etcd's, or the other protocol); the member that
        failed is then asked last, as call() asks the next after a failure (a member that hangs costs one
        attempt's time, not two)."""
        if pending is None:
            pending = self.send_first(path, body, deadline, sent)
            if pending is None:
                return None, None
        n = len(self.endpoints)
        conn, i, end = pending.conn, pending.i, pending.end
        try:
            first, close = self._clean(*conn.answer(end), mistake=(i, path))
        except _NotHTTP as e:
            conn.close()
            raise self._not_http(i, e.first) from None
        except (_Silent, ConnectionResetError) as e:
            # As call() does: a fresh connection ended without a word may be the other protocol (etcd:// to a
            # TLS member): a mistake in the URL for every command alike, not a member skipped by some.
            conn.close()
            if not pending.reused:
                self._diagnose(i, e, ATTEMPT)
            self._next = (i + 1) % n
            return None, None
        except OSError:
            conn.close()
            self._next = (i + 1) % n
            return None, None
        except BaseException:
            conn.close()
            raise
        if first is None:
            conn.close()
            return None, None
        self._next = i
        written = False
        try:  # what then, meanwhile and between raise is the caller's, never a member's
            if not close:
                path2, body2 = then()
                payload = dumps(body2).encode("utf-8")
                try:
                    conn.send(self._head(i, "/v3/" + path2, len(payload)) + payload, max(0.001, end - monotonic()))
                    written = True
                except OSError:
                    self._next = (i + 1) % n
            if written and meanwhile is not None:
                meanwhile()
            if between is not None:
                # After the caller's work: the session it starts (a thread) is not on the way of the second's
                # write nor of the forks `meanwhile` may make.
                between(first)
        except BaseException:
            conn.close()
            raise
        if not written:
            conn.close()
            return first, None
        try:
            second, close = self._clean(*conn.answer(end))
        except OSError:
            conn.close()
            self._next = (i + 1) % n
            return first, None
        except BaseException:
            conn.close()
            raise
        if close or second is None:
            conn.close()
        else:
            self._keep(i, conn)
        return first, second

    def _clean(self, status: int, data: bytes, close: bool,
               mistake: tuple | None = None) -> tuple[dict | None, bool]:
        """An answer two_in_turn read: (its JSON, whether the connection ends) if a success, else (None, True).
        `mistake` (member index, path): what call() would take for a mistake in the URL (an answer below HTTP
        500 that is not etcd's JSON, JSON without etcd's header) raises FleetConfigError, as call() does."""
        try:
            if not data and status != 200:
                raise ValueError("no body")
            reply = loads(data.decode("utf-8")) if data else {}
        except ValueError:
            if mistake is not None and status < 500:
                raise self._not_etcd(mistake[0], status, mistake[1]) from None
            return None, True
        if mistake is not None and status == 200 and isinstance(reply, dict) and _code(reply) is None:
            wrong = _unshaped(mistake[1], reply)
            if wrong:
                raise self._not_etcd(mistake[0], status, mistake[1], wrong)
        if status != 200 or not isinstance(reply, dict) or _code(reply) is not None or "header" not in reply:
            return None, True
        return reply, close

    def _not_etcd(self, i: int, status: int, path: str, what: str = "not etcd's JSON") -> FleetConfigError:
        """A member that answers HTTP, but not as etcd's v3 gateway does (HTTP 4xx, no JSON; JSON without
        etcd's header): another service, the peer port, etcd before 3.4. A mistake in the URL, never retried;
        its answer is not repeated."""
        return FleetConfigError("fleet %s: member %s has no etcd v3 gateway (HTTP %d for /v3/%s, %s): is that "
                                "etcd's client port (2379 by default, not the peer port 2380), etcd 3.4 or later?"
                                % (self.url.members, _member(self.endpoints[i]), status, path, what))

    def _unavailable(self, why: str) -> FleetUnavailable:
        return FleetUnavailable("fleet %s: %s" % (self.url.members, why), endpoints=self.url.members)

    def _authenticate(self, i: int, deadline: float) -> None:
        password = self.url.password
        if password is None:
            raise FleetConfigError("fleet %s: user %r needs a password: give --fleet-password-file FILE, or set "
                                   "$HOSTLOCK_FLEET_PASSWORD_FILE or $HOSTLOCK_FLEET_PASSWORD"
                                   % (self.url.members, self.url.user))
        payload = dumps({"name": self.url.user, "password": password}).encode("utf-8")
        status, reply = self._post(i, "/v3/auth/authenticate", payload,
                                   max(0.001, min(deadline - monotonic(), ATTEMPT)))
        token = reply.get("token")
        if status == 200 and isinstance(token, str) and token:
            self._token = token
            return
        message = self._scrub(_message(reply)) or "HTTP %d" % status
        if status == 503 or _code(reply) in _RETRY_CODES or _shedding(status, _code(reply), message):
            raise _Retry(message)
        if reply.get("raw"):
            raise self._not_etcd(i, status, "auth/authenticate")
        raise self._unavailable("etcd refused user %r (%s)" % (self.url.user, message))

    def _scrub(self, message: str) -> str:
        """A member's message, unless it repeats a secret of ours (the password, the token, in any of the
        spellings a JSON echo gives them): a service that echoes requests inside JSON would print it."""
        for secret in (self.url.password, self._token):
            if secret and any(form and form in message for form in (secret, dumps(secret)[1:-1])):
                return "its answer repeats our request, not shown"
        return message[:200]  # cut after the look: a cut could leave the start of a secret in view


def _code(reply: dict) -> int | None:
    code = reply.get("code")
    if code is None and "error" in reply:
        return 2
    try:
        return int(code) if code is not None and int(code) != 0 else None
    except (TypeError, ValueError):
        return 2


def _shedding(status: int, code: int | None, message: str) -> bool:
    """etcd answering "too many requests" (HTTP 429, gRPC RESOURCE_EXHAUSTED): it sheds load for a moment, so
    the request is asked again within the wait, as for a member without a leader."""
    return status == 429 or (code == _EXHAUSTED and "too many requests" in message)


def _message(reply: dict) -> str:
    """A member's message, whole: Client._scrub looks for our secrets in it before cutting it."""
    m = reply.get("message") or reply.get("error") or ""
    return str(m)


def _unshaped(path: str, reply: dict) -> str | None:
    """What makes a successful answer not etcd's, or None. Every answer of etcd's gateway has a header naming
    the cluster and member (a stream's messages a result), its numbers are strings of digits, its lists are
    lists of objects: another service's JSON must fail here (78), not deep in the lock as a KeyError (65),
    nor pass as "no locks"."""
    if "result" in reply:
        return None
    header = reply.get("header")
    if not isinstance(header, dict) or not any(k in header for k in ("cluster_id", "member_id", "revision")):
        return "JSON without etcd's header"
    numbers = [header.get("revision")] + ([reply.get("ID"), reply.get("TTL")] if path == "lease/grant" else [])
    if path == "lease/grant" and reply.get("ID") is None:
        return "a lease grant without an ID"
    for n in numbers:
        if n is not None and not (isinstance(n, int) or (isinstance(n, str) and n.lstrip("-").isdigit())):
            return "JSON not shaped as etcd's"
    for name in ("kvs", "responses"):
        items = reply.get(name)
        if items is not None and not (isinstance(items, list) and all(isinstance(x, dict) for x in items)):
            return "JSON not shaped as etcd's"
    return None
