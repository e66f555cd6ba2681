"""Helpers shared by the engine tests (unit and integration): real child processes with hostlock importable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LIB = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "lib"))
if LIB not in sys.path:
    sys.path.insert(0, LIB)

MECHANISMS = ["ofd", "flock", "record"]


@pytest.fixture
def lockdir(tmp_path):
    d = tmp_path / "locks"
    d.mkdir(mode=0o700)
    return str(d)


@pytest.fixture(params=MECHANISMS)
def mechdir(request, tmp_path):
    """A lock directory bound to one mechanism (the directory's marker fixes it for every process)."""
    import hostlock

    d = tmp_path / request.param
    d.mkdir(mode=0o700)
    hostlock.Lock("init", directory=str(d), mechanism=request.param).close()
    return str(d)


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = LIB + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn(code: str, *args: str, **kw) -> subprocess.Popen:
    """Start a real Python child running `code` (dedented) with hostlock importable."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_line(proc: subprocess.Popen, expected: str, timeout: float = 10.0) -> str:
    """Read the child's stdout until a line starting with `expected` (the child says it is ready)."""
    import select
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = select.select([proc.stdout], [], [], 0.1)[0]
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(expected):
                return line.strip()
    err = proc.stderr.read() if proc.poll() is not None else "(running)"
    raise AssertionError("child never printed %r; stderr: %s" % (expected, err))
