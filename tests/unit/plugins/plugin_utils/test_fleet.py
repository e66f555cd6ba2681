"""Unit tests for the controller-side fleet helpers (plugin_utils/_fleet.py): option resolution and the
rule that decides when a run's own holders make a wait hopeless. The real etcd runs are in
tests/integration/ansible/test_fleet_*.py."""

from __future__ import annotations

from ansible_collections.hostlock.core.plugins.plugin_utils import _fleet


def test_fleet_option_then_controller_environment(monkeypatch):
    monkeypatch.setenv("HOSTLOCK_FLEET", "etcd://env:2379")
    assert _fleet.fleet_of({}) == "etcd://env:2379"
    assert _fleet.fleet_of({"fleet": None}) == "etcd://env:2379"
    assert _fleet.fleet_of({"fleet": "etcd://opt:2379"}) == "etcd://opt:2379"
    assert _fleet.fleet_of({"fleet": ""}) is None, "fleet: '' means host locks even with HOSTLOCK_FLEET set"
    monkeypatch.delenv("HOSTLOCK_FLEET")
    assert _fleet.fleet_of({}) is None


def test_controller_options_never_reach_the_host():
    args = {"name": "x", "fleet": "", "ttl": 5, "lease": 10}
    assert _fleet.host_args(args) == {"name": "x", "lease": 10}


def test_own_leases_that_fill_the_lock_block_and_others_do_not():
    run = "[run abc123]"
    lease = dict(label=f"ansible: play 'p', task 't' {run}", mode="exclusive")
    task = dict(label="ansible: play 'p', task 'u' [run abc123 task]", mode="exclusive")
    other = dict(label="ansible: play 'p', task 't' [run fff000]", mode="exclusive")
    assert _fleet.own_blockers([lease], run, "exclusive", 1) == [lease]
    assert _fleet.own_blockers([task], run, "exclusive", 1) == [], "a locked task of the run ends by itself"
    assert _fleet.own_blockers([other], run, "exclusive", 1) == []
    assert _fleet.own_blockers([lease], run, "exclusive", 2) == [], "a free slot is left: no self-wait"
    assert _fleet.own_blockers([lease, dict(lease)], run, "exclusive", 2) != []
    assert _fleet.own_blockers([dict(lease, stale=True)], run, "exclusive", 1) == []
    shared = dict(lease, mode="shared")
    assert _fleet.own_blockers([shared], run, "shared", 1) == []
    assert _fleet.own_blockers([lease], run, "shared", 1) == [lease]


def test_messages_are_one_line():
    assert _fleet.one_line(ValueError("etcd said:\n  no leader\n")) == "etcd said: no leader"
    assert _fleet.one_line(ValueError("")) == "ValueError"
