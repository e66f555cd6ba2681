"""A detached process (a lease's holder, the controller's heartbeat), and closing every descriptor but some.

A process that must outlive its caller leaves the caller's session (a hangup, a signal to the caller's group
or session misses it), is not the caller's child (a double fork: init adopts it, nobody must reap it), and holds
none of the caller's descriptors open (its pipes reach EOF, an SSH connection can close): standard streams on
/dev/null, everything else closed but what it was given.
"""

from __future__ import annotations

from ..core import oslite as os

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable, Iterable


def descriptors() -> list[int]:
    """Every open descriptor of this process (from /proc/self/fd; without /proc every possible one, bounded)."""
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(min(os.sysconf("SC_OPEN_MAX"), 65536)))


def close_all_but(keep: Iterable[int], sockets: bool = False) -> None:
    """Close every descriptor of this process but `keep` (and, with `sockets`, every socket: a connection plugin
    may hold its session in one)."""
    wanted = set(keep)
    for fd in descriptors():
        if fd in wanted:
            continue
        try:
            if not (sockets and os.fstat(fd).st_mode & 0o170000 == 0o140000):  # S_IFSOCK
                os.close(fd)
        except OSError:
            pass


def null_stdio() -> None:
    """Standard input, output and error on /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)


def detached(body: Callable[[int], object], keep: Iterable[int] = (), sockets: bool = False) -> tuple[int, int]:
    """Run body(w) in a detached process: a new session, a double fork, standard streams on /dev/null, every
    descriptor closed but `keep`, `w` (and, with `sockets`, every socket). Its first line on `w` is "PID N\\n",
    before anything else runs there; body may write more and closes `w` when it likes (its exit does).

    Returns (the read end of that pipe, the daemon's pid); the intermediate process is reaped already.
    """
    import warnings

    keep = set(keep)
    r, w = os.pipe()
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns about fork in a threaded process; the child runs body
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:  # pragma: no cover - runs in the child; covered through the lease and heartbeat tests
        try:
            os.close(r)
            os.setsid()
            if os.fork() == 0:
                os.write(w, b"PID %d\n" % os.getpid())
                null_stdio()
                close_all_but(keep | {0, 1, 2, w}, sockets)
                body(w)
        finally:
            os._exit(0)
    os.close(w)
    daemon = 0
    try:
        os.waitpid(pid, 0)
        first = b""
        while not first.endswith(b"\n"):
            chunk = os.read(r, 1)  # one byte at a time: what follows the line is the caller's to read
            if not chunk:
                break
            first += chunk
        if first.startswith(b"PID ") and first[4:-1].isdigit():
            daemon = int(first[4:-1])
    except BaseException:
        os.close(r)
        raise
    return r, daemon
