"""`os` without importing `os`: the calls the command line's start-up path makes, for modules that import
this module as `os` (cli/, fleet/, api.py, core/owner.py and core/procstat.py).

Why: `import os` is about 1 ms of every `hostlock run` (1.0 ms on Debian's python3.11, 1.3 ms on a pyenv
build; `hostlock run --fleet URL NAME true` must start as fast as `etcdctl lock NAME true`, ~18 ms): `os`
imports `_collections_abc` (some forty abstract classes built), `stat` and `posixpath`, and decodes the
environment into `os.environ`. Every system call here is `posix`'s, the built-in module `os` re-exports
(the same functions, not copies); what `os` writes in Python (`fsencode`, the environment) is written here
the same way. A module that needs anything else (`os.path`, `os.makedirs`) imports `os` where it needs it.

The environment: `posix.environ` is the dict `os.environ` keeps its data in (bytes, as the process got
them; `os.environ` changes it and calls putenv/unsetenv), so reading it is reading `os.environ`, whether
something imported `os` or not; `popenv` removes a variable from it and from the C environment children
inherit, as `os.environ.pop` does. tests/unit/engine/test_oslite.py proves each against `os`, and
tests/integration/cli/test_cli_fleet.py that `hostlock run --fleet` never imports `os`.
"""

from __future__ import annotations

import posix as _posix
import sys
from posix import (
    O_CLOEXEC,
    O_NOCTTY,
    O_NOFOLLOW,
    O_NONBLOCK,
    O_RDONLY,
    O_RDWR,
    WEXITSTATUS,
    WIFSIGNALED,
    WNOHANG,
    WTERMSIG,
    _exit,
    close,
    dup,
    dup2,
    execve,
    fork,
    fstat,
    geteuid,
    getpgid,
    getpgrp,
    getpid,
    getppid,
    getuid,
    kill,
    killpg,
    listdir,
    open,
    pipe,
    pread,
    pwrite,
    read,
    set_blocking,
    setpgid,
    setsid,
    stat,
    stat_result,
    strerror,
    sysconf,
    tcgetpgrp,
    uname,
    unlink,
    urandom,
    waitpid,
    write,
)

# Linux >= 5.3 with Python >= 3.9 only: core/procstat.pidfd() looks for it here, and without it every signal to a
# proven holder (break, --replace) and every wait for a process's exit fell back to the pid and to polling.
if hasattr(_posix, "pidfd_open"):
    pidfd_open = getattr(_posix, "pidfd_open")  # noqa: B009 - Python 3.8's posix has none: mypy checks as 3.8

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Mapping

# The calls the start-up path makes, as `os` has them (re-exported from posix), and what is written here.
__all__ = [
    "close",
    "defpath",
    "devnull",
    "dup",
    "dup2",
    "environ",
    "environb",
    "execve",
    "_exit",
    "fork",
    "fsdecode",
    "fsencode",
    "fstat",
    "getenv",
    "geteuid",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getuid",
    "kill",
    "killpg",
    "listdir",
    "O_CLOEXEC",
    "O_NOCTTY",
    "O_NOFOLLOW",
    "O_NONBLOCK",
    "O_RDONLY",
    "O_RDWR",
    "open",
    "pipe",
    "popenv",
    "pread",
    "pwrite",
    "read",
    "set_blocking",
    "setpgid",
    "setsid",
    "stat",
    "stat_result",
    "strerror",
    "sysconf",
    "tcgetpgrp",
    "uname",
    "unlink",
    "urandom",
    "waitpid",
    "WEXITSTATUS",
    "WIFSIGNALED",
    "WNOHANG",
    "write",
    "WTERMSIG",
]

devnull = "/dev/null"
defpath = "/bin:/usr/bin"  # posixpath.defpath: PATH when the environment has none
_ENCODING = sys.getfilesystemencoding()
_ERRORS = sys.getfilesystemencodeerrors()


def fsencode(name: str | bytes) -> bytes:
    """os.fsencode: a str as the file system's bytes (undecodable bytes came in as surrogates, go out as they were)."""
    return name.encode(_ENCODING, _ERRORS) if isinstance(name, str) else name


def fsdecode(name: str | bytes) -> str:
    """os.fsdecode."""
    return name.decode(_ENCODING, _ERRORS) if isinstance(name, bytes) else name


def environb() -> Mapping[bytes, bytes]:
    """The process environment as bytes (os.environb); read it, never change it (see popenv)."""
    return _posix.environ


def environ() -> Mapping[str, str]:
    """The process environment as str, as os.environ shows it (a copy: changing it changes nothing)."""
    return {fsdecode(k): fsdecode(v) for k, v in _posix.environ.items()}


def getenv(name: str) -> str | None:
    """os.environ.get(name)."""
    value = _posix.environ.get(fsencode(name))
    return None if value is None else fsdecode(value)


def popenv(name: str) -> str | None:
    """os.environ.pop(name, None): out of the environment, and of every child's (unsetenv); its value."""
    key = fsencode(name)
    value = _posix.environ.pop(key, None)
    if value is None:
        return None
    _posix.unsetenv(key)
    return fsdecode(value)
