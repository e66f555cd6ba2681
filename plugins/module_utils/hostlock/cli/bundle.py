"""The `hostlock` command's bundle: the whole engine compiled ahead, in one file, for a faster start.

Why: a `hostlock` run imports about 25 of the package's modules. From files, each costs a directory look-up,
a stat, an open and a read of its own .pyc; that is about 2.5 ms of a 20 ms `hostlock run --fleet URL NAME
true` (docs/benchmarks.md). The cli role therefore writes the bundle beside the package (this file run as a
script, by the launcher's interpreter: `python -I -S .../hostlock/cli/bundle.py LIB_DIR`), and the launcher
imports it first. It is two files: `_hostlock_bundle.pyc`, a small module with the table of the package's
modules, and `_hostlock_bundle.code`, every module's marshalled code end to end. Importing the module opens
the code file, keeps it open, and puts a finder first in sys.meta_path that serves the `hostlock` modules
from it: each module's slice is read (one pread), unmarshalled and run only when the module is imported, as
from its own file. Two files, not one: the code inside a .pyc would be copied twice at every start (read,
then unmarshalled into the table), about 0.4 ms for its 0.6 MB. Read as imported, not whole at the start: a
`hostlock run --fleet` needs about half of it, and every page of a buffer read whole is a page fault (the
buffer of 0.6 MB cost ~0.3-0.7 ms a start, docs/benchmarks.md).

Rules (docs/security.md):
- The module is a plain sourceless .pyc, so Python itself refuses another interpreter's (bad magic number)
  and the launcher then imports the sources as before.
- The code file is used only when it is the one built with the table: its length, and the build's stamp
  (a hash of the code) at both its ends. Another build's, a damaged one, a missing one, or anything but a
  plain file there (a symlink is not followed, a FIFO not waited on) means the sources are imported. It is
  opened once, at the start, and held open (close-on-exec: a job never gets it).
- It is used only while every source it was built from is unchanged (size and mtime, as a .pyc is checked):
  a package upgraded, or a module edited, without a new bundle means the sources are imported instead.
- It serves only the `hostlock` package, and only the modules it has: any other name goes to the usual
  finders. It lives in the library directory, which is trusted as a whole like the sources beside it.
- Code served from it comes from the file held open since the start: an import that comes later (the host
  mechanisms a fleet-only command never loads, hostlock.api) opens no file, so it cannot fail after a
  privilege change or pick up an engine replaced in the meantime (a new build replaces the code file by a
  rename; the open one is the old one still). Only a process that closed it itself (the watcher of
  `hostlock run` closes every descriptor but its own when it must act) opens it again, and takes it only if it
  is still the same build; else the import fails rather than mix two builds.

Size is time here (about half of the code file is read at every start): modules are compiled as with -OO (no
docstrings), and the role runs this with `-X no_debug_ranges` (Python 3.11+: no column positions in
tracebacks' carets), about a fifth smaller and 0.3-0.5 ms faster a start than without.

Standard library only and no relative import: the role runs this file directly.
"""

from __future__ import annotations
import __future__

import hashlib
import marshal
import os
import sys

NAME = "_hostlock_bundle"  # the module the launcher imports; the file is NAME + ".pyc" in the library directory
CODE = NAME + ".code"  # the modules' marshalled code, beside it
PACKAGE = "hostlock"
_TABLE = "@hostlock-bundle-table@"  # replaced in the bundle's code by the table of modules (build())
_STAMP = "@hostlock-bundle-stamp@"  # ... by the build's stamp, which begins and ends the code file
_LENGTH = "@hostlock-bundle-length@"  # ... by the code file's length

# The bundle module's own code, compiled by build() with the constants above replaced. It names nothing from
# this package (it runs before the package exists) and imports only built-in modules (marshal, posix).
_BOOT = '''\
import marshal as _marshal
import posix as _posix
import sys as _sys

_ModuleSpec = type(__spec__)
_LIB = __file__.rpartition("/")[0]


class BundleFinder:
    """Specs and code of the hostlock modules in the bundle; None (the usual finders) for anything else."""

    PINNED = True  # hostlock.api: code served from here comes from a file held open since the start

    def __init__(self, modules):
        self.modules = modules  # name -> (is_package, source path, start, end of its code in the code file)

    def find_spec(self, name, path=None, target=None):
        entry = self.modules.get(name)
        if entry is None:
            return None
        # Not has_location: importlib would then work out a __cached__ path per module (~10 us each) that
        # nothing reads; exec_module sets __file__ (the source, as for a module imported from it) itself.
        spec = _ModuleSpec(name, self, origin=entry[1], is_package=entry[0])
        if entry[0]:
            spec.submodule_search_locations = [entry[1].rpartition("/")[0]]
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        entry = self.modules[module.__spec__.name]
        module.__file__ = entry[1]
        exec(_marshal.loads(_read(entry[2], entry[3])), module.__dict__)


_FILE = [-1, 0, 0]  # the code file held open: descriptor, st_dev, st_ino


def _open():
    """Open the code file and keep it (close-on-exec) when it is the one built with this table: a plain file,
    of the built length, the build's stamp at both ends. False (nothing kept) when it is not."""
    try:
        fd = _posix.open(_LIB + "/@code-name@", _posix.O_RDONLY | _posix.O_CLOEXEC | _posix.O_NOFOLLOW
                         | _posix.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = _posix.fstat(fd)
        if (st.st_mode & 0o170000 == 0o100000 and st.st_size == _LENGTH and _posix.pread(fd, 16, 0) == _STAMP
                and _posix.pread(fd, 16, _LENGTH - 16) == _STAMP):
            _FILE[:] = [fd, st.st_dev, st.st_ino]
            fd = -1
            return True
    except OSError:
        pass
    finally:
        if fd >= 0:
            _posix.close(fd)
    return False


def _read(start, end):
    """One module's code, read from the code file held open since the start (replacing the file since, by a
    new build, changes nothing here). Its descriptor closed by this process (a forked watcher closes all but
    its own), or its number now another file's: the file is opened again, and must be the same build."""
    try:
        st = _posix.fstat(_FILE[0])
        held = (st.st_dev, st.st_ino) == (_FILE[1], _FILE[2])
    except OSError:
        held = False
    if not held and not _open():
        raise ImportError("the hostlock bundle's code file is not the one it started with")
    data = _posix.pread(_FILE[0], end - start, start)
    if len(data) != end - start:
        raise ImportError("the hostlock bundle's code file is shorter than built")
    return data


def _fresh(table):
    """name -> entry when every source is as the bundle was built from it; None (use the sources) if not."""
    modules = {}
    for name, package, rel, mtime_ns, size, start, end in table:
        path = _LIB + "/" + rel
        try:
            st = _posix.stat(path)
        except OSError:
            return None
        if st.st_mtime_ns != mtime_ns or st.st_size != size:
            return None
        modules[name] = (package, path, start, end)
    return modules


def _install(table):
    if "hostlock" in _sys.modules:
        return False  # too late: the package came from somewhere else; never mix two copies
    if not _open():
        return False
    modules = _fresh(table)
    if modules is None:
        _posix.close(_FILE[0])
        _FILE[0] = -1
        return False
    finder = BundleFinder(modules)
    # First: the built-in and frozen importers ask every name too (they never have a hostlock module), and this
    # one answers any name but its own modules' with a dict miss. With the two above, 0.3-0.4 ms of the ~4 ms
    # a `run --fleet` imports.
    _sys.meta_path.insert(0, finder)
    return True


_STAMP = "@hostlock-bundle-stamp@"  # filled by build(), as the table below
_LENGTH = "@hostlock-bundle-length@"
INSTALLED = _install("@hostlock-bundle-table@")
'''


_FUTURE = b"\nfrom __future__ import annotations\n"


def _table(lib: str) -> tuple[tuple, bytes]:
    """The table of every module of lib's package, sorted by name: (name, is_package, path relative to lib,
    mtime_ns, size, start, end of its marshalled code in the code file), and the code file's bytes. The same
    sources give the same files, byte for byte."""
    top = os.path.join(lib, PACKAGE)
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            path = os.path.join(dirpath, filename)
            rel = os.path.relpath(path, lib)
            parts = rel[:-3].split(os.sep)
            package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if package else parts)
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                source = f.read()
            # As with -OO: no docstrings (the command reads none; nor are there asserts: ansible-test's no-assert).
            # `from __future__ import annotations` as the compiler flag it stands for, the line left blank: the
            # same code, without importing __future__ at run time (0.15 ms of every start).
            flags = 0
            if source.count(_FUTURE) == 1:
                source, flags = source.replace(_FUTURE, b"\n\n"), __future__.annotations.compiler_flag
            code = compile(source, path, "exec", flags=flags, dont_inherit=True, optimize=2)
            found.append((name, package, rel.replace(os.sep, "/"), st.st_mtime_ns, st.st_size, marshal.dumps(code)))
    if not any(r[0] == PACKAGE for r in found):
        raise FileNotFoundError("no %s package in %s" % (PACKAGE, lib))
    found.sort()
    body = b"".join(r[5] for r in found)
    stamp = hashlib.sha256(body).digest()[:16]
    rows, at = [], len(stamp)
    for name, package, rel, mtime_ns, size, marshalled in found:
        rows.append((name, package, rel, mtime_ns, size, at, at + len(marshalled)))
        at += len(marshalled)
    return tuple(rows), stamp + body + stamp


def build(lib: str) -> tuple[bytes, bytes]:
    """The bytes of LIB/_hostlock_bundle.pyc for this interpreter, and of its code file, from lib's package."""
    from importlib.util import MAGIC_NUMBER

    boot = compile(_BOOT.replace("@code-name@", CODE), os.path.join(lib, NAME + ".py"), "exec", dont_inherit=True)
    table, code = _table(lib)
    fill = {_TABLE: table, _STAMP: code[:16], _LENGTH: len(code)}
    consts = tuple(fill.get(c, c) if isinstance(c, str) else c for c in boot.co_consts)
    if sum(c is not d for c, d in zip(consts, boot.co_consts)) != len(fill):
        raise AssertionError("the bundle's code lacks a value to fill")  # a broken _BOOT: never ship it
    # A sourceless .pyc (PEP 552 header: magic, flags 0, then a timestamp and size nobody checks).
    return MAGIC_NUMBER + bytes(12) + marshal.dumps(boot.replace(co_consts=consts)), code


def _replace(path: str, data: bytes) -> bool:
    """Write `path` (mode 0644, atomically); False when it was already that, byte for byte."""
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o644)  # whatever the umask
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def write(lib: str) -> list[str]:
    """Write LIB/_hostlock_bundle.code, then LIB/_hostlock_bundle.pyc; returns those that changed. In this
    order, a command starting meanwhile reads a code file and a table of two builds at worst: their stamps
    differ, and it imports the sources."""
    boot, code = build(lib)
    return [path for path, data in ((os.path.join(lib, CODE), code), (os.path.join(lib, NAME + ".pyc"), boot))
            if _replace(path, data)]


def main(argv: list[str]) -> int:
    """`python -I -S bundle.py LIB_DIR`: prints "wrote PATH" when the bundle changed (the role's
    changed_when); exit 64 for bad usage, 1 (one line, no traceback) when it cannot be built."""
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write("usage: python -I -S bundle.py LIB_DIR (the directory that holds the hostlock package)\n")
        return 64
    lib = os.path.abspath(argv[0])
    try:
        changed = write(lib)
    except (OSError, SyntaxError, ValueError) as e:
        sys.stderr.write("hostlock bundle: cannot write %s: %s\n" % (os.path.join(lib, NAME + ".pyc"), e))
        return 1
    for path in changed:
        sys.stdout.write("wrote %s\n" % path)
    return 0


if __name__ == "__main__":  # not when merely imported (e.g. by ansible-test's import sanity test)
    raise SystemExit(main(sys.argv[1:]))
