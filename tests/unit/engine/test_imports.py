"""Every module of the engine imports on the interpreter running the tests (make test-pythons runs this file on
each CPython 3.8-3.13): a name the standard library lacks there, or syntax newer than it, fails here, also in
the modules no other test of that interpreter loads (the command line's, fleet/'s)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import hostlock

# `python -m hostlock` runs the command: not imported as a module.
NOT_IMPORTED = {"hostlock.__main__"}


def test_every_engine_module_imports_on_this_interpreter():
    names = sorted(m.name for m in pkgutil.walk_packages(hostlock.__path__, "hostlock.") if m.name not in NOT_IMPORTED)
    assert len(names) > 40, names  # the walk itself found the package
    # In a child: importing the command line's modules must not change this process (signal masks, hooks).
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
