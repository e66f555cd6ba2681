"""Helpers the command-line tests import (conftest.py holds only fixtures: a module named conftest exists in
several test directories, so importing from it depends on which one was loaded first)."""

import os
import signal
import sys
import time
from pathlib import Path

import cli_install
from engine_helpers import LIB as _LIB
from engine_helpers import readable_copy

ROOT = Path(__file__).resolve().parents[3]
# A copy of the hostlock package readable by every user (engine_helpers.readable_copy): launchers run as others too.
LIB = Path(_LIB)
# The real interpreter (.venv/bin/python resolves to it); never the pyenv shim (~100 ms a start).
PYTHON = os.path.realpath(sys.executable)


def make_launcher(directory: Path, python: str = PYTHON) -> Path:
    """The cli role's launcher (its template, rendered) for `python`, LIB's bundle built for it: the command
    exactly as installed. Another interpreter gets its own copy of the package in `directory` (LIB's bundle
    is PYTHON's), bundled for it."""
    lib = LIB if python == PYTHON else readable_copy(str(LIB))
    return cli_install.install(directory / "hostlock", python, lib)


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_file(path: Path, timeout=10.0) -> str:
    wait_until(lambda: path.exists() and path.read_text().endswith("\n"), timeout, f"{path}")
    return path.read_text()


def kill_quietly(pids) -> None:
    """SIGKILL each pid, skipping those already gone: teardown of whatever a failed test left running."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def fd_links(pid: int) -> dict:
    """fd -> what /proc/PID/fd/FD names ('pipe:[N]', 'socket:[N]', a path)."""
    out = {}
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            out[int(fd)] = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:  # closed meanwhile
            pass
    return out
