"""Unit tests for core/procstat.py's pidfd(): the engine's modules import `os` as core/oslite, so what pidfd() finds
there decides whether signals to proven holders and waits for exits go through pidfds at all."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from hostlock.core import oslite, procstat


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="os.pidfd_open: Python >= 3.9 on Linux >= 5.3")
def test_a_pidfd_is_opened_where_the_interpreter_has_pidfd_open_and_becomes_readable_at_the_exit():
    assert oslite.pidfd_open is os.pidfd_open
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    fd = procstat.pidfd(child.pid)
    try:
        assert isinstance(fd, int), "pidfd() found no pidfd_open: every caller falls back to the bare pid"
        assert select.select([fd], [], [], 0)[0] == []  # alive: not readable
        child.stdin.close()  # the event that ends it
        child.wait()
        assert select.select([fd], [], [], 30)[0] == [fd]  # readable once it exited
    finally:
        if fd is not None:
            os.close(fd)


def test_no_pidfd_for_a_process_that_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert procstat.pidfd(child.pid) is None
