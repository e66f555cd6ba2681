"""Unit tests for the hostlock.core.serialize callback's naming, lock ordering and lease accounting."""

from __future__ import annotations

import pytest
from ansible.plugins.loader import callback_loader
from ansible_collections.hostlock.core.plugins.callback.serialize import lock_name
from ansible_collections.hostlock.core.plugins.module_utils import hostlock


def test_lock_name_is_valid_and_distinct():
    assert lock_name("ansible-host@", "web1.example.com") == "ansible-host@web1.example.com"
    odd = [lock_name("ansible-host@", h) for h in ("fe80::1", "fe80__1", "a b", "x" * 200)]
    for name in odd:
        hostlock.validate_name(name)
    assert len(set(odd)) == len(odd), "hosts whose names need changes must not collide"


@pytest.fixture
def callback(tmp_path):
    d = tmp_path / "ctl"
    d.mkdir(mode=0o700)
    cb = callback_loader.get("hostlock.core.serialize")
    cb.set_options(direct=dict(directory=str(d), timeout=1.0))
    cb.lockdir = str(d)
    return cb


def _held(cb) -> list:
    return sorted(cb._held)


def test_locks_follow_the_plays_in_sorted_order(callback):
    callback._lock_hosts(["b", "c"], "one")
    assert _held(callback) == ["b", "c"]
    # a new host sorting below held ones: release them and take all in order (no deadlock)
    callback._lock_hosts(["a", "b"], "two")
    assert _held(callback) == ["a", "b"]
    callback._lock_hosts(["a"], "three")
    assert _held(callback) == ["a"]
    free = hostlock.Lock("ansible-host@b", directory=callback.lockdir)
    free.acquire(timeout=0)  # b was released
    free.release()
    callback.v2_playbook_on_stats(None)
    assert _held(callback) == []


def test_busy_host_ends_the_run_after_the_timeout(callback, capsys):
    with hostlock.Lock("ansible-host@x", directory=callback.lockdir, label="other run"):
        with pytest.raises(SystemExit) as ended:
            callback._lock_hosts(["w", "x"], "play")
    assert ended.value.code == 75
    assert _held(callback) == [], "a run that gives up holds nothing"


def test_leases_left_held_are_tracked(callback):
    lease = dict(name="deploy", event="acquired", waited=0.5, token_id="aaa", lease_expires=4e9)
    callback._account("h1", lease)
    callback._account("h1", dict(lease, token_id="bbb"))
    callback._account("h1", dict(name="deploy", event="released", waited=0, token_id="aaa"))
    assert list(callback._leases[("h1", "deploy")]) == ["bbb"]
    callback._account("h1", dict(name="apt", event="locked", waited=1.0, held=2.0))
    use = callback._uses[("h1", "apt")]
    assert use["uses"] == 1 and use["held"] == 2.0 and use["max_waited"] == 1.0
