"""Fleet locks: the URL that names a fleet (a consensus store shared by many hosts) and the backend seam.

A fleet URL names every member of one etcd cluster, the key prefix and how to connect:

    etcd://[user@]host[:port][,host[:port]...][/prefix]        plain HTTP (port 2379 by default)
    etcds://[user@]host[:port]...[/prefix][?cacert=F&cert=F&key=F]   TLS

The password never appears in a URL (shell history, process lists, logs): it comes from
$HOSTLOCK_FLEET_PASSWORD. `backend(url)` picks the engine once from the scheme; everything after that
(the Lock's locker, status, list, break, leases) goes through the Backend it returns, so another store
(ZooKeeper) would be one more scheme here and one more module, nothing else.
"""

from __future__ import annotations

import os

from ._error import InvalidFleetURL

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable, Protocol

    from ._api import LockStatus
    from ._lockers import Locker

    class Backend(Protocol):
        """What a fleet store implements; the engine's module functions call only these."""

        url: FleetURL

        def locker(self, name: str, slots: int, ttl: float,
                   on_lost: Callable[[], object] | None) -> Locker: ...

        def status(self, name: str) -> LockStatus: ...

        def list_locks(self) -> list: ...

        def break_lock(self, name: str, force: bool) -> list: ...

        def hold(self, name: str, lease: float, mode: str, slots: int, label: str | None,
                 timeout: float | None) -> str: ...

        def renew(self, name: str, token: str, lease: float | None) -> float: ...

        def release(self, name: str, token: str) -> None: ...

DEFAULT_PORT = 2379
DEFAULT_PREFIX = "hostlock/"
PASSWORD_ENV = "HOSTLOCK_FLEET_PASSWORD"
SCHEMES = ("etcd", "etcds")
_QUERY_KEYS = ("cacert", "cert", "key")
_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+@-/")


class FleetURL:
    """A parsed fleet URL: endpoints [(host, port)], key prefix (ends with '/'), TLS files, user, password."""

    __slots__ = ("scheme", "endpoints", "prefix", "tls", "cacert", "cert", "key", "user", "password", "text")

    def __init__(self, scheme: str, endpoints: list, prefix: str, cacert: str | None = None,
                 cert: str | None = None, key: str | None = None, user: str | None = None,
                 password: str | None = None, text: str = "") -> None:
        self.scheme, self.endpoints, self.prefix = scheme, endpoints, prefix
        self.tls = scheme == "etcds"
        self.cacert, self.cert, self.key = cacert, cert, key
        self.user, self.password = user, password
        self.text = text

    @property
    def members(self) -> str:
        """host:port of every member, comma-separated: what error messages name."""
        return ",".join(_hostport(h, p) for h, p in self.endpoints)

    def display(self, name: str | None = None) -> str:
        """What users see (no password, no query): etcd://h1:2379,h2:2379/hostlock/[NAME/]."""
        return "%s://%s/%s%s" % (self.scheme, self.members, self.prefix, name + "/" if name else "")

    def __repr__(self) -> str:
        return "FleetURL(%r)" % self.display()


def _hostport(host: str, port: int) -> str:
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def _bad(url: str, why: str) -> InvalidFleetURL:
    return InvalidFleetURL("invalid fleet URL %r: %s (expected etcd://host:port[,host:port...][/prefix])"
                           % (url, why))


def parse(url: object, environ: dict | None = None) -> FleetURL:
    """Parse a fleet URL; InvalidFleetURL (a ValueError) says what is wrong with it, in one line."""
    if not isinstance(url, str):
        raise InvalidFleetURL("fleet URL must be a string, not %r" % (url,))
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise _bad(url, "it contains spaces or control characters")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise _bad(url, "the scheme must be etcd:// or etcds:// (TLS)")
    rest, _q, query = rest.partition("?")
    hosts, _slash, path = rest.partition("/")
    user = None
    if "@" in hosts:
        user, _at, hosts = hosts.rpartition("@")
        if ":" in user:
            raise _bad(url, "never put a password in the URL: set $%s" % PASSWORD_ENV)
        if not user:
            raise _bad(url, "empty user name before '@'")
    endpoints = []
    for part in hosts.split(","):
        endpoints.append(_endpoint(url, part))
    prefix = path.strip("/")
    if prefix:
        if not set(prefix) <= _PREFIX_CHARS or "//" in prefix or any(s in (".", "..") for s in prefix.split("/")):
            raise _bad(url, "the prefix may use A-Z a-z 0-9 _ . + @ - and single slashes")
        prefix += "/"
    else:
        prefix = DEFAULT_PREFIX
    files: dict = {}
    if query:
        for item in query.split("&"):
            k, eq, v = item.partition("=")
            if k not in _QUERY_KEYS or not eq or not v:
                raise _bad(url, "unknown or empty option %r (cacert=, cert=, key= take a file)" % item)
            if k in files:
                raise _bad(url, "option %r given twice" % k)
            files[k] = _unquote(v)
        if scheme != "etcds":
            raise _bad(url, "cacert=, cert= and key= need TLS: use etcds://")
        if ("cert" in files) != ("key" in files):
            raise _bad(url, "a client certificate needs both cert= and key=")
    env = os.environ if environ is None else environ
    password = env.get(PASSWORD_ENV) if user else None
    return FleetURL(scheme, endpoints, prefix, files.get("cacert"), files.get("cert"), files.get("key"), user,
                    password, url)


def _endpoint(url: str, part: str) -> tuple:
    if not part:
        raise _bad(url, "an empty member")
    if part.startswith("["):  # IPv6 literal: [::1]:2379
        host, close, tail = part[1:].partition("]")
        if not close or not host or (tail and not tail.startswith(":")):
            raise _bad(url, "malformed IPv6 member %r" % part)
        port_text = tail[1:] if tail else ""
    else:
        host, _colon, port_text = part.partition(":")
        if not host or ":" in port_text:
            raise _bad(url, "malformed member %r" % part)
        if not all(c.isalnum() or c in "-._" for c in host) or not host.isascii():
            raise _bad(url, "malformed host %r" % host)
    if not port_text:
        return (host, DEFAULT_PORT)
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        raise _bad(url, "port %r is not a number from 1 to 65535" % port_text)
    return (host, int(port_text))


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def backend(url: str) -> Backend:
    """The Backend for a fleet URL, chosen once from its scheme (only etcd is built)."""
    parsed = parse(url)
    from ._etcd_lock import EtcdBackend  # imported only when a fleet is used: host locks never load it

    return EtcdBackend(parsed)
