"""Unit tests for the hostlock.core.serialize callback's naming, lock ordering and lease accounting."""

from __future__ import annotations

import pytest
from ansible.plugins.loader import callback_loader
from ansible_collections.hostlock.core.plugins.module_utils import hostlock


@pytest.fixture
def callback(tmp_path):
    d = tmp_path / "ctl"
    d.mkdir(mode=0o700)
    cb = callback_loader.get("hostlock.core.serialize")
    cb.set_options(direct=dict(directory=str(d), timeout=1.0))
    cb.lockdir = str(d)
    return cb


def _held(cb) -> list:
    return sorted(k[2] for k in cb._held if k[2])


def test_locks_follow_the_plays_in_sorted_order(callback):
    callback._lock_hosts(["b", "c"], "one")
    assert _held(callback) == ["b", "c"]
    # a new host sorting below held ones, free: taken at once out of order (no wait, so no deadlock); b kept,
    # c (not in this play) released
    callback._lock_hosts(["a", "b"], "two")
    assert _held(callback) == ["a", "b"]
    other = hostlock.Lock("ansible-host@c", directory=callback.lockdir)
    other.acquire(timeout=0)  # c was released
    other.release()
    callback._lock_hosts(["a"], "three")
    assert _held(callback) == ["a"]
    free = hostlock.Lock("ansible-host@b", directory=callback.lockdir)
    free.acquire(timeout=0)  # b was released
    free.release()
    callback.v2_playbook_on_stats(None)
    assert _held(callback) == []


def test_a_busy_host_sorting_below_held_ones_releases_them_and_takes_all_in_order(callback, capsys):
    callback._lock_hosts(["b", "c"], "one")
    with hostlock.Lock("ansible-host@a", directory=callback.lockdir, label="other run"):
        with pytest.raises(SystemExit) as ended:  # a is busy: release b and c, then wait for a (timeout 1 s)
            callback._lock_hosts(["a", "b"], "two")
    assert ended.value.code == 75 and _held(callback) == []
    assert "releasing those to take every lock in order" in capsys.readouterr().err


def test_busy_host_ends_the_run_after_the_timeout(callback, capsys):
    with hostlock.Lock("ansible-host@x", directory=callback.lockdir, label="other run"):
        with pytest.raises(SystemExit) as ended:
            callback._lock_hosts(["w", "x"], "play")
    assert ended.value.code == 75
    assert _held(callback) == [], "a run that gives up holds nothing"


def test_a_large_play_and_a_small_play_exclude_each_other(tmp_path, monkeypatch):
    """A large play's exclusive bucket lock and a small play's host lock must never both be held."""
    from ansible_collections.hostlock.core.plugins.callback import serialize

    d = tmp_path / "ctl"
    d.mkdir(mode=0o700)
    large = callback_loader.get("hostlock.core.serialize")
    large.set_options(direct=dict(directory=str(d), timeout=0.0))
    monkeypatch.setattr(serialize, "fd_budget", lambda: 1)  # every play counts as large
    large._lock_hosts(["web1", "web2"], "large")
    assert not [k for k in large._held if k[2]], "a large play takes no host locks"
    monkeypatch.setattr(serialize, "fd_budget", lambda: 256)
    small = callback_loader.get("hostlock.core.serialize")
    small.set_options(direct=dict(directory=str(d), timeout=0.0))
    with pytest.raises(SystemExit) as ended:
        small._lock_hosts(["web2"], "small")
    assert ended.value.code == 75
    large.v2_playbook_on_stats(None)
    small._lock_hosts(["web2"], "small")  # free now
    assert [k[2] for k in small._held if k[2]] == ["web2"]
    small.v2_playbook_on_stats(None)


def test_local_error_ends_the_run_without_try_again(tmp_path):
    """A lock directory that is a file: a local error with its own exit code, never 75."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    cb = callback_loader.get("hostlock.core.serialize")
    cb.set_options(direct=dict(directory=str(not_a_dir), timeout=0.0))
    with pytest.raises(SystemExit) as ended:
        cb._lock_hosts(["a"], "play")
    assert ended.value.code not in (0, 75)
    assert cb._held == {}


def test_messages_go_to_stderr_never_stdout(callback, capsys):
    with hostlock.Lock("ansible-host@x", directory=callback.lockdir, label="other run"):
        with pytest.raises(SystemExit):
            callback._lock_hosts(["x"], "play")
    callback._lock_hosts(["y"], "play")
    callback.v2_playbook_on_stats(None)
    out, err = capsys.readouterr()
    assert out == "", out
    assert "host x is busy" in err and "HOSTLOCK RECAP" in err, err


def test_fleet_lock_set_id_ignores_the_local_directory_and_endpoint_spelling(tmp_path):
    """With a fleet, runs on other control nodes (other local directories, endpoints listed differently)
    must find the same in-flight marks on the hosts; another key prefix is another lock set."""
    ids = []
    for directory, fleet in (("a", "etcd://h1:2379,h2:2379/team"), ("b", "etcd://h2:2379,h1:2379/team/"),
                             ("a", "etcd://h1:2379/other"), ("a", None)):
        cb = callback_loader.get("hostlock.core.serialize")
        cb.set_options(direct=dict(directory=str(tmp_path / directory), fleet=fleet))
        ids.append(cb._scope())
    assert ids[0] == ids[1]
    assert len({ids[0], ids[2], ids[3]}) == 3


def test_a_lost_fleet_lock_ends_the_run_before_the_next_task(callback):
    callback._check_lost()  # nothing lost: nothing happens
    callback._lost.append("ansible-host@web1")
    with pytest.raises(SystemExit) as ended:
        callback.v2_playbook_on_task_start(None, False)
    assert ended.value.code == 79


@pytest.mark.parametrize("result,outlives", [
    (dict(rc=0), False),
    (dict(failed=True, msg="boom"), False),  # the module ended, with a failure
    (dict(ansible_job_id="j1", started=1, finished=0), True),  # async, poll: 0
    (dict(ansible_job_id="j1", finished=1, rc=0), False),  # async, polled to its end
    (dict(failed=True, timedout=dict(period=1)), True),  # the timeout keyword ended it on the controller
    (dict(unreachable=True), True),
    (dict(results=[dict(rc=0), dict(ansible_job_id="j2", finished=0)]), True),  # one item of a loop
])
def test_a_result_whose_work_may_outlive_it_keeps_the_host_dirty(result, outlives):
    from ansible_collections.hostlock.core.plugins.callback.serialize import _may_outlive

    assert _may_outlive(result) is outlives


def test_every_documented_option_is_known_to_the_misspelling_check():
    """A key or variable naming no option stops the run: the list it checks against is the documented one."""
    import yaml
    from ansible_collections.hostlock.core.plugins.callback import serialize
    from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_plan import OPTIONS

    assert sorted(yaml.safe_load(serialize.DOCUMENTATION)["options"]) == sorted(OPTIONS)


def test_a_misspelt_section_key_or_variable_is_named(tmp_path, monkeypatch):
    from ansible_collections.hostlock.core.plugins.plugin_utils import _serialize_config as config
    from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_plan import OPTIONS

    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\nx = 1\n[hostlock-serialize]\ntimeout = 1\n[hostlock_serialize]\ntimout = 1\n"
                   "timeout = 2\n[hostlock]\ny = 2\n")
    monkeypatch.setattr(config, "config_file", lambda: str(cfg))
    found = config.setting_mistakes(OPTIONS, {"HOSTLOCK_SERIALIZE_TIMOUT": "1", "HOSTLOCK_SERIALIZE_HOST": "x",
                                              "HOSTLOCK_SERIALIZE_FLEET": ""})
    assert len(found) == 3, found
    assert "section [hostlock-serialize]" in found[0] and "did you mean timeout?" in found[1], found
    assert found[2].startswith("environment variable HOSTLOCK_SERIALIZE_TIMOUT"), found
