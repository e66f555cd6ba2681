"""Unit tests for plugins/module_utils/_common.py (wording and check-mode arithmetic)."""

from __future__ import annotations

from ansible_collections.hostlock.core.plugins.module_utils._common import (
    describe_holders,
    holder_summary,
    live_holders,
    would_acquire,
)

EXCL = dict(pid=10, mode="exclusive", stale=False)
SHARED = dict(pid=11, mode="shared", stale=False)
DEAD = dict(pid=12, mode="exclusive", stale=True)


def test_would_acquire_exclusive():
    assert would_acquire([], "exclusive", 1)
    assert not would_acquire([EXCL], "exclusive", 1)
    assert not would_acquire([SHARED], "exclusive", 1)
    assert would_acquire([DEAD], "exclusive", 1), "a stale record blocks nobody"


def test_would_acquire_shared_and_semaphore():
    assert would_acquire([SHARED, SHARED], "shared", 1)
    assert not would_acquire([SHARED, EXCL], "shared", 1)
    assert would_acquire([EXCL], "exclusive", 2)
    assert not would_acquire([EXCL, dict(EXCL, pid=13)], "exclusive", 2)


def test_live_holders_drops_stale():
    assert live_holders([EXCL, DEAD]) == [EXCL]


def test_holder_summary_names_the_job_and_lease():
    text = holder_summary(dict(pid=5, user="root", job_pid=6, job_cmdline="sleep   30",
                               cmdline="hostlock run x sleep 30", label="backup", lease_expires=1e9,
                               acquired_at=1e9 - 5, mode="shared", slot=1))
    assert "pid 5" in text and "job pid 6 'sleep 30'" in text and 'label "backup"' in text
    assert "lease until" in text and "since" in text and "shared" in text and "slot 1" in text
    assert "hostlock run" not in text, "the job is named, not its supervisor's command line"


def test_holder_summary_truncates_and_marks_stale():
    text = holder_summary(dict(pid=7, cmdline="x" * 500, stale=True))
    assert len(text) < 120 and text.endswith("STALE")


def test_describe_holders():
    assert "nobody" in describe_holders([])
    assert describe_holders([EXCL, SHARED]).count("pid") == 2


def test_a_holder_summary_is_one_inert_line_whatever_the_holder_wrote():
    """Another user's command line or label reaches the controller's terminal in task messages."""
    h = dict(pid=7, user="mallory", cmdline="sleep\x1b[2J\x1b[H 600\r\nfake row", label="x\x1b]0;title\x07y")
    line = holder_summary(h)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x07" not in line, repr(line)
    assert "\\x1b[2J" in line and "\\x07" in line, line
