"""proc/marks.py: the scan for processes carrying a mark, and the wait for them to end (leases' in-flight work,
the serialize callback's wait). Real processes, each holding until the test writes a line to its stdin; the waits
end on those events, never on a sleep."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hostlock.core import procstat
from hostlock.proc import marks

HOLD = "import sys; print('ready', flush=True); sys.stdin.readline()"
MARK = "HOSTLOCK_TEST_MARK"


@pytest.fixture
def start():
    """start(*entries, argv=None): a process whose environment holds `entries` (KEY=VALUE) besides ours, ready."""
    procs = []

    def _start(*entries: str, argv: list | None = None) -> subprocess.Popen:
        env = dict(os.environ, **dict(e.split("=", 1) for e in entries))
        proc = subprocess.Popen(argv or [sys.executable, "-c", HOLD], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline() == "ready\n"
        return proc

    yield _start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(params=["pidfd", "polling"])
def waits(request, monkeypatch):
    """Both ways the wait waits: on pidfds (Python 3.9+, Linux 5.3+), or scanning every `poll` seconds. The pidfds
    are os.pidfd_open's here: procstat.pidfd looks for it in core.oslite, which has none (so it always polls)."""
    opener = getattr(os, "pidfd_open", None)
    if request.param == "polling":
        monkeypatch.setattr(procstat, "pidfd", lambda pid: None)
    elif opener is None:
        pytest.skip("no os.pidfd_open (Python < 3.9)")
    else:
        def pidfd(pid: int) -> int | None:
            try:
                return opener(pid)
            except OSError:
                return None

        monkeypatch.setattr(procstat, "pidfd", pidfd)
    return request.param


def _entry(name: str, value: str) -> bytes:
    return f"{name}={value}".encode()


def test_shown_cmdline_is_one_printable_ascii_line_cut_to_its_limit(start):
    proc = start(argv=[sys.executable, "-c", HOLD, "\x1b[2J\x1b[Hfake\rline", "caf\u00e9", "x" * 300])
    shown = marks.shown_cmdline(proc.pid)
    assert shown.startswith(f"{sys.executable} -c {HOLD} ?[2J?[Hfake?line caf? xxx"), shown
    assert len(shown) == 200 and shown.endswith("x")
    assert marks.shown_cmdline(proc.pid, limit=10) == sys.executable[:10]
    proc.communicate("\n")
    assert marks.shown_cmdline(proc.pid) == ""  # gone


def test_a_wait_sees_the_mark_unless_the_other_entry_too(start, waits):
    mark = _entry(MARK, str(os.getpid()))
    other = start(f"{MARK}={os.getpid()}", "HOSTLOCK_TEST_RUN=earlier")
    start(f"{MARK}={os.getpid()}", "HOSTLOCK_TEST_RUN=ours")
    start(f"{MARK}={os.getpid()}x")  # a longer value: not the mark
    seen = []
    uid = os.getuid()
    assert marks.wait_unmarked(mark, uid, unless=b"HOSTLOCK_TEST_RUN=ours", timeout=0, seen=seen.append) is False
    assert seen == [[other.pid]]
    assert marks.wait_unmarked(mark, uid + 1, unless=b"HOSTLOCK_TEST_RUN=ours", timeout=0) is True  # not of its uid


def test_a_wait_calls_seen_once_and_ends_with_the_last_marked_process(start, waits):
    mark = _entry(MARK, f"end-{os.getpid()}")
    procs = [start(mark.decode()), start(mark.decode())]
    calls = []

    def seen(pids: list) -> None:  # the first scan found them: end them now, the wait must see it
        calls.append(sorted(pids))
        for proc in procs:
            proc.communicate("\n")

    assert marks.wait_unmarked(mark, os.getuid(), poll=0.01, seen=seen) is True
    assert calls == [sorted(p.pid for p in procs)]


def test_a_wait_with_nothing_marked_returns_at_once_without_calling_seen(waits):
    assert marks.wait_unmarked(_entry(MARK, f"none-{os.getpid()}"), os.getuid(), timeout=0,
                               seen=pytest.fail) is True


def test_a_timed_wait_gives_up_after_its_time(start, waits):
    mark = _entry(MARK, f"time-{os.getpid()}")
    start(mark.decode())
    assert marks.wait_unmarked(mark, os.getuid(), poll=0.01, timeout=0.05) is False
