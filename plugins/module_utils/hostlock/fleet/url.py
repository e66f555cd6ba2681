"""Fleet locks: the URL that names a fleet (a consensus store shared by many hosts) and the backend seam.

A fleet URL names every member of one etcd cluster, the key prefix and how to connect:

    etcd://[user@]host[:port][,host[:port]...][/prefix]        plain HTTP (port 2379 by default)
    etcds://[user@]host[:port]...[/prefix][?cacert=F&cert=F&key=F]   TLS

The password never appears in a URL (shell history, process lists, logs), nor in any message: it comes from
a password file (`--fleet-password-file FILE`, $HOSTLOCK_FLEET_PASSWORD_FILE; refused when anyone but its
owner may read it, as ssh refuses a readable key) or from $HOSTLOCK_FLEET_PASSWORD, which the command line
removes from its environment so that no job inherits it. fleet.backend(url) picks the store once from the
scheme; everything after that (the Lock's locker, status, list, break, leases) goes through the Backend it
returns (core.model.Backend). Another store (ZooKeeper) would be one more scheme here, its module beside
fleet/lock.py, and its line in fleet.backend.
"""

from __future__ import annotations

from ..core import oslite as os
from ..core.errors import FleetConfigError, InvalidFleetURL

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable, Mapping


DEFAULT_PORT = 2379
DEFAULT_PREFIX = "hostlock/"
PASSWORD_ENV = "HOSTLOCK_FLEET_PASSWORD"
PASSWORD_FILE_ENV = "HOSTLOCK_FLEET_PASSWORD_FILE"
_PASSWORD_MAX = 65536  # a password file larger than this is not a password file
# The command line's credentials, out of its environment (take_credentials): {"password": ..., "file": ...}.
_TAKEN: dict = {}
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
                           % (mask(url), why))


def mask(url: str) -> str:
    """`url` with whatever stands between 'user:' (or 'user%3A') and the last '@' replaced by '***': a password
    put in a URL by mistake is never repeated in a message (cron mail, logs), whatever it holds ('?', '/',
    '@', '#'...). The last '@' of the whole URL, not of its members: a password may hold any of the characters
    that end a member, so a valid URL with an '@' after a port ('h:1/p@x', '?cacert=/a@b') is hidden from
    that port on too (messages only)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    at = rest.rfind("@")
    if at <= 0:
        return url
    head = rest[:at]
    colon = head.find(":")
    encoded = head.lower().find("%3a")  # 'user%3Apassword': a colon, percent-encoded
    if encoded >= 0 and (colon < 0 or encoded < colon):
        return scheme + sep + rest[:encoded] + "%3A***" + rest[at:]
    if colon < 0:
        return url
    return scheme + sep + rest[:colon + 1] + "***" + rest[at:]


def take_credentials(password_file: str | None = None) -> None:
    """The command line's: move $HOSTLOCK_FLEET_PASSWORD out of the environment into this process's memory,
    so that no job, hook or child inherits it, nor reads it in hostlock's own /proc/PID/environ (the password
    file's path is not secret and stays); `password_file` (--fleet-password-file) is used before either
    variable. FleetConfigError when the variable cannot be blanked there: the work stops, never runs with the
    password readable by its job."""
    secret = os.popenv(PASSWORD_ENV)  # also unsetenv()s it for children
    if secret is not None:
        _TAKEN["password"] = secret
        try:
            _blank_initial(os.fsencode(PASSWORD_ENV) + b"=")
        except (OSError, ValueError) as e:
            raise FleetConfigError("$%s cannot be blanked in this process's environment block, where its job "
                                   "could read it (/proc/self/mem: %s): give --fleet-password-file FILE instead"
                                   % (PASSWORD_ENV, getattr(e, "strerror", None) or e)) from None
    if password_file is not None:
        _TAKEN["file"] = password_file


def _blank_initial(prefix: bytes) -> None:
    """Overwrite with NULs every entry of this process's initial environment block that starts with `prefix`
    ('NAME='). unsetenv() only drops the C library's pointer to it: the kernel shows the block the process
    started with in /proc/PID/environ for its whole life (to the same user, so to any job it runs, and to
    root), and every process forked from it shares those bytes. Written through /proc/self/mem (the block's
    bounds: core.procstat's ENV_START and ENV_END); checked by reading it back."""
    from ..core import procstat

    fields = procstat.fields(os.getpid())
    if fields is None or len(fields) <= procstat.ENV_END:
        raise ValueError("no environment bounds in /proc/self/stat")
    start, end = int(fields[procstat.ENV_START]), int(fields[procstat.ENV_END])
    fd = os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC)
    try:
        block = os.pread(fd, end - start, start)
        at = 0
        for entry in block.split(b"\0"):
            if entry.startswith(prefix) and os.pwrite(fd, b"\0" * len(entry), start + at) != len(entry):
                raise ValueError("short write")
            at += len(entry) + 1
        if any(entry.startswith(prefix) for entry in os.pread(fd, end - start, start).split(b"\0")):
            raise ValueError("still there after the write")
    finally:
        os.close(fd)


def password_of(env: Mapping[str, str] | None = None) -> str | None:
    """The password to log in with: --fleet-password-file, else $HOSTLOCK_FLEET_PASSWORD_FILE, else
    $HOSTLOCK_FLEET_PASSWORD (both variables set: FleetConfigError, which one was meant is unclear)."""
    environ: Mapping[str, str] = os.environ() if env is None else env
    path = _TAKEN.get("file")
    if path is not None:
        return read_password_file(path, "--fleet-password-file")
    secret = environ.get(PASSWORD_ENV)
    if secret is None and env is None:
        secret = _TAKEN.get("password")
    path = environ.get(PASSWORD_FILE_ENV)
    if path:
        if secret is not None:
            raise FleetConfigError("both $%s and $%s are set: unset one" % (PASSWORD_FILE_ENV, PASSWORD_ENV))
        return read_password_file(path, "$" + PASSWORD_FILE_ENV)
    return secret


def read_password_file(path: str, source: str) -> str:
    """The password in `path` (its first line), refused unless it is a regular file of the caller's (or
    root's) that nobody else may read or write: a symlink, a FIFO, a device, group/other bits all fail
    with FleetConfigError naming the file, before any connection."""
    import errno
    import stat

    def bad(why: str) -> FleetConfigError:
        return FleetConfigError("fleet password file %s (%s) %s" % (path, source, why))

    try:
        # O_NOFOLLOW: a symlink planted at the path is refused, not followed; O_NONBLOCK: a FIFO cannot
        # hang the open (it is refused just below as not a regular file).
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise bad("is a symbolic link: give the file itself") from None
        raise bad("cannot be opened: %s" % (e.strerror or e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad("is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise bad("belongs to uid %d, not to you (uid %d) or root" % (st.st_uid, os.geteuid()))
        if st.st_mode & 0o077:
            raise bad("may be read or written by other users (mode %04o): chmod 600 it, as ssh wants of a "
                      "key" % stat.S_IMODE(st.st_mode))
        _no_one_else_can_swap(fd, bad)
        try:
            data = os.read(fd, _PASSWORD_MAX + 1)
        except OSError as e:
            raise bad("cannot be read: %s" % (e.strerror or e)) from None
    finally:
        os.close(fd)
    if len(data) > _PASSWORD_MAX:
        raise bad("is larger than %d bytes: not a password" % _PASSWORD_MAX)
    try:
        text = data.decode("utf-8").split("\n", 1)[0].rstrip("\r")
    except UnicodeDecodeError:
        raise bad("is not UTF-8 text") from None
    if not text:
        raise bad("holds no password (its first line is empty)")
    return text


def _no_one_else_can_swap(fd: int, bad: Callable[[str], FleetConfigError]) -> None:
    """Refuse a password file whose directory, or a directory above it, another user owns or may write
    (unless sticky, as /tmp is): they could put their own file in its place, as ssh's StrictModes reasons.
    The directories of the file as opened (/proc/self/fd), so no symlink on the way is walked twice."""
    import os as _os
    import stat

    euid = os.geteuid()
    try:
        path = _os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return  # no /proc: the file's own checks stand (its owner, its mode, no symlink)
    if not path.startswith("/"):
        return  # not a path in this file system view (e.g. a deleted file)
    d = path
    while d != "/":
        d = d.rsplit("/", 1)[0] or "/"
        try:
            st = _os.stat(d)
        except OSError:
            return
        if st.st_uid not in (euid, 0):
            raise bad("is in %s, a directory of uid %d, who could replace the file: keep it in a directory of "
                      "yours or root's" % (d, st.st_uid))
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise bad("is in %s, a directory other users may write (mode %04o), who could replace the file: "
                      "chmod go-w it" % (d, stat.S_IMODE(st.st_mode)))


def parse(url: object, environ: dict | None = None) -> FleetURL:
    """Parse a fleet URL; InvalidFleetURL (a ValueError) says what is wrong with it, in one line."""
    try:
        return _parse(url, environ)
    except InvalidFleetURL:
        if isinstance(url, str) and mask(url) != url:
            # 'user:pa/ss@host' fails elsewhere first ("port 'pa'"): never a detail that quotes the secret.
            raise _bad(url, "never put a password in the URL: use --fleet-password-file FILE or $%s"
                       % PASSWORD_FILE_ENV) from None
        raise


def _parse(url: object, environ: dict | None) -> FleetURL:
    if not isinstance(url, str):
        raise InvalidFleetURL("fleet URL must be a string, not %r" % (url,))
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise _bad(url, "it contains spaces or control characters")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise _bad(url, "the scheme must be etcd:// or etcds:// (TLS)")
    if "://" in rest:
        raise _bad(url, "one scheme for the whole URL, before the first member (etcd://h1,h2: no scheme after a comma)")
    rest, _q, query = rest.partition("?")
    hosts, _slash, path = rest.partition("/")
    user = None
    if "@" in hosts:
        user, _at, hosts = hosts.rpartition("@")
        if ":" in user or "%3a" in user.lower():
            raise _bad(url, "never put a password in the URL: use --fleet-password-file FILE or $%s"
                       % PASSWORD_FILE_ENV)
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
            if "\0" in files[k]:
                raise _bad(url, "option %r names a file with a NUL byte" % k)
        if scheme != "etcds":
            raise _bad(url, "cacert=, cert= and key= need TLS: use etcds://")
        if ("cert" in files) != ("key" in files):
            raise _bad(url, "a client certificate needs both cert= and key=")
    if user is None and "file" in _TAKEN:
        raise FleetConfigError("--fleet-password-file %s is given, but the fleet URL %s names no user to log in as "
                               "(etcd://USER@host)" % (_TAKEN["file"], mask(url)))
    password = password_of(environ) if user else None
    return FleetURL(scheme, endpoints, prefix, files.get("cacert"), files.get("cert"), files.get("key"), user,
                    password, url)


def _endpoint(url: str, part: str) -> tuple:
    if not part:
        raise _bad(url, "an empty member")
    if part.startswith("["):  # IPv6 literal: [::1]:2379
        host, close, tail = part[1:].partition("]")
        if not close or not host or (tail and not tail.startswith(":")):
            raise _bad(url, "malformed IPv6 member %r" % part)
        if not _ipv6(host):
            raise _bad(url, "%r is not an IPv6 address" % host)
        port_text = tail[1:] if tail else None
    else:
        host, colon, port_text = part.partition(":")
        if not host or ":" in port_text:
            raise _bad(url, "malformed member %r" % part)
        if not all(c.isalnum() or c in "-._" for c in host) or not host.isascii():
            raise _bad(url, "malformed host %r" % host)
        # What getaddrinfo and TLS's name check take: labels of 1 to 63 characters, 253 in all.
        if len(host.rstrip(".")) > 253 or any(not 0 < len(label) < 64 for label in host.rstrip(".").split(".")):
            raise _bad(url, "malformed host %r (an empty or over-long label)" % host)
        if any(label[0] == "-" or label[-1] == "-" for label in host.rstrip(".").split(".")):
            raise _bad(url, "malformed host %r (a label begins or ends with '-')" % host)  # RFC 1123
        port_text = port_text if colon else None
    if port_text is None:
        return (host, DEFAULT_PORT)
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        raise _bad(url, "port %r is not a number from 1 to 65535" % port_text)
    return (host, int(port_text))


def _ipv6(text: str) -> bool:
    import _socket

    try:
        _socket.inet_pton(_socket.AF_INET6, text.partition("%")[0])  # 'fe80::1%eth0': a zone after '%'
    except (OSError, ValueError):
        return False
    return text.isascii()


def _unquote(text: str) -> str:
    """A file name of the query, %XX-decoded to the bytes it names (surrogateescape, as the file system's
    names are decoded), never with a byte replaced by another."""
    from urllib.parse import unquote

    return unquote(text, errors="surrogateescape")
