"""What the controller says the strategy allows hosts of one machine (plugin_utils/_controller.turns): wait for
each other's lease, or be refused at once naming what works. (The module's verdict: module_utils/test_turns.py.)"""

from __future__ import annotations

import types

import pytest
from ansible_collections.hostlock.core.plugins.plugin_utils import _controller


def _task(strategy: str | None, delegate_to: str | None = None):
    play = types.SimpleNamespace(strategy=strategy)
    block = types.SimpleNamespace(_play=play)
    return types.SimpleNamespace(_parent=block, delegate_to=delegate_to)


@pytest.mark.parametrize(
    ("strategy", "batch", "forks", "wait", "says"),
    [
        ("linear", 2, 5, False, "serial: 1"),
        ("ansible.builtin.free", 2, 5, True, ""),
        ("free", 6, 5, False, "forks 6 or more"),
        ("host_pinned", 60, 5, True, ""),
        ("mitogen_linear", 2, 5, False, "strategy: free"),
    ],
)
def test_what_the_strategy_allows(monkeypatch, strategy, batch, forks, wait, says):
    monkeypatch.setattr(_controller, "_forks", lambda: forks)
    hosts = [f"h{i}" for i in range(batch)]
    got = _controller.turns(_task(strategy), dict(inventory_hostname="h0", ansible_play_batch=hosts))
    assert got["wait"] is wait and set(got["batch"].values()) == set(hosts)
    assert says in "; ".join(got["works"])
    assert "run_once" not in "; ".join(got["works"])


def test_a_delegated_lock_adds_run_once(monkeypatch):
    monkeypatch.setattr(_controller, "_forks", lambda: 5)
    task_vars = dict(inventory_hostname="h0", ansible_play_batch=["h0", "h1"])
    got = _controller.turns(_task("linear", delegate_to="db1"), task_vars)
    assert "run_once: true" in "; ".join(got["works"])
