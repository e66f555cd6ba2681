"""core/forks.py: the engine's work in a forked child runs from one hook, in every child but exec_fork()'s, and
the engine's parts that hold descriptors, leases or threads all name theirs there."""

from __future__ import annotations

import os
import threading

import pytest

from hostlock.core import forks


def _child_says(fork) -> bytes:
    """What a child forked by `fork()` writes: b"hook" if the test's hook ran in it, then b"." as it exits."""
    r, w = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            if os.environ.get("_FORKS_TEST_RAN") == "1":
                os.write(w, b"hook")
            os.write(w, b".")
        finally:
            os._exit(0)
    os.close(w)
    with open(r, "rb") as f:
        got = f.read()
    assert os.waitpid(pid, 0)[1] == 0
    return got


@pytest.fixture
def hook(monkeypatch):
    """A hook that marks the child's environment; removed again after the test."""

    def mark() -> None:
        os.environ["_FORKS_TEST_RAN"] = "1"

    monkeypatch.delenv("_FORKS_TEST_RAN", raising=False)
    forks.in_child(mark)
    yield
    forks._HOOKS.remove(mark)


def test_a_hook_runs_in_a_plain_forks_child_not_in_the_parent(hook):
    assert _child_says(os.fork) == b"hook."
    assert "_FORKS_TEST_RAN" not in os.environ


def test_no_hook_runs_in_exec_forks_child_and_the_next_fork_has_them_again(hook):
    assert _child_says(forks.exec_fork) == b"."
    assert forks._exec_forker is None
    assert _child_says(os.fork) == b"hook."


def test_another_threads_fork_during_an_exec_fork_keeps_its_hooks(hook, monkeypatch):
    """The skip belongs to the forking thread: a fork from another thread at that moment runs every hook."""
    monkeypatch.setattr(forks, "_exec_forker", threading.get_ident())
    got: list = []
    t = threading.Thread(target=lambda: got.append(_child_says(os.fork)))
    t.start()
    t.join()
    assert got == [b"hook."]


def test_the_engines_parts_name_their_child_work_here():
    """Lock objects (api), host locks' detached waits and timer (host/kernel, host/waiting) and fleet sessions
    (fleet/session): each registered through forks, none straight with the interpreter (exec_fork would miss it)."""
    from hostlock import api
    from hostlock.fleet import session as fleet_session
    from hostlock.host import kernel, waiting

    for hook in (api._after_fork_in_child, kernel._close_detached_in_child, waiting._forget_alarm,
                 fleet_session._forget_sessions):
        assert hook in forks._HOOKS, hook
