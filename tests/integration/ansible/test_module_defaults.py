"""`module_defaults: group/hostlock.core.hostlock` reaches lock, lock_info and locked (meta/runtime.yml)."""

from __future__ import annotations


def test_group_module_defaults_reach_every_hostlock_task(ansible, engine):
    grouped = ansible.work / "grouped"
    grouped.mkdir(mode=0o700)
    run = ansible.play("module_defaults.yml", extra_vars=dict(target="loc", lock="grouped", grouped_dir=str(grouped)))
    assert run.rc == 0, run.out
    results = {name: hosts["loc"] for name, hosts in run.results().items()}
    taken = results["Take the lock in the group's directory"]
    assert taken["directory"] == str(grouped), taken
    assert taken["acquired"] is True, taken
    info = results["Read the group's directory"]
    assert info["directory"] == str(grouped), info
    (held,) = info["locks"]
    assert held["name"] == "grouped" and len(held["holders"]) == 1, held
    wrapped = results["Run a task under a second lock in the group's directory"]
    assert wrapped["changed"] is True and wrapped["hostlock"]["name"] == "grouped-wrapped", wrapped
    # The engine's own view: both locks live in the group's directory, none in the play's default one.
    assert sorted(s.name for s in engine.list_locks(str(grouped))) == ["grouped", "grouped-wrapped"]
    assert [s.name for s in engine.list_locks(str(ansible.lockdir))] == []
    assert engine.status("grouped", str(grouped)).holders == []
