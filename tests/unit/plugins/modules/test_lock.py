"""Unit tests for the hostlock.core.lock and lock_info modules, run in-process on real locks."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.hostlock.core.plugins.module_utils import hostlock
from ansible_collections.hostlock.core.plugins.modules import lock_host as lock
from ansible_collections.hostlock.core.plugins.modules import lock_info


def run(module, capsys, **args) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
        module.main()
    out = json.loads(capsys.readouterr().out)
    out["_rc"] = exit_info.value.code
    return out


@pytest.fixture
def lockdir(tmp_path):
    d = tmp_path / "locks"
    d.mkdir(mode=0o700)
    return str(d)


def test_acquire_release_cycle(capsys, lockdir):
    taken = run(lock, capsys, name="u1", lease=30, directory=lockdir, label="unit")
    assert taken["changed"] and taken["acquired"] and taken["_rc"] == 0
    token = taken["token"]
    assert taken["token_id"] == token.partition(".")[0]
    (holder,) = [h for h in hostlock.holders("u1", directory=lockdir) if not h.stale]
    assert holder.label == "unit" and holder.token_id == taken["token_id"]
    assert taken["hostlock"] == dict(name="u1", event="acquired", waited=taken["waited"], token_id=taken["token_id"],
                                     lease_expires=taken["lease_expires"])

    renewed = run(lock, capsys, name="u1", lease=60, token=token, directory=lockdir)
    assert renewed["changed"] and renewed["lease_expires"] > taken["lease_expires"] + 20

    released = run(lock, capsys, name="u1", state="released", token=token, directory=lockdir)
    assert released["changed"] and not released["acquired"]
    assert not [h for h in hostlock.holders("u1", directory=lockdir) if not h.stale], "released but still held"

    again = run(lock, capsys, name="u1", state="released", token=token, directory=lockdir)
    assert not again["changed"] and again["_rc"] == 0 and "released already" in json.dumps(again["warnings"])


def test_check_mode_takes_nothing(capsys, lockdir):
    predicted = run(lock, capsys, name="u2", lease=30, directory=lockdir, _ansible_check_mode=True)
    assert predicted["changed"] and predicted["free"] and "token" not in predicted
    assert not hostlock.holders("u2", directory=lockdir)


def test_conflict_fails_naming_the_holder_or_skips(capsys, lockdir):
    with hostlock.Lock("u3", directory=lockdir, label="someone else"):
        failed = run(lock, capsys, name="u3", lease=30, timeout=0.2, directory=lockdir)
        assert failed["failed"] and "someone else" in failed["msg"] and failed["waited"] >= 0.2
        skipped = run(lock, capsys, name="u3", lease=30, timeout=0, on_conflict="skip", directory=lockdir)
        assert skipped["skipped"] and not skipped["acquired"] and skipped["_rc"] == 0
        busy = run(lock, capsys, name="u3", lease=30, directory=lockdir, _ansible_check_mode=True)
        assert not busy["free"] and not busy["changed"] and "someone else" in busy["msg"]
        refused = run(lock, capsys, name="u3", state="released", directory=lockdir)
        assert refused["failed"] and "force=true" in refused["msg"]


def test_bad_input(capsys, lockdir):
    assert "slots=2" in run(lock, capsys, name="u4", lease=5, slots=2, mode="shared", directory=lockdir)["msg"]
    assert "lease" in run(lock, capsys, name="u4", lease=-1, directory=lockdir)["msg"]
    assert "timeout" in run(lock, capsys, name="u4", lease=5, timeout=-2, directory=lockdir)["msg"]
    bad = run(lock, capsys, name="a/b", lease=5, directory=lockdir)
    assert bad["failed"] and "a/b" in bad["msg"]
    malformed = run(lock, capsys, name="u4", state="released", token="nonsense", directory=lockdir)
    assert malformed["failed"] and "malformed" in malformed["msg"]


def test_lock_info(capsys, lockdir):
    token = hostlock.hold("i1", lease=30, directory=lockdir)
    try:
        one = run(lock_info, capsys, name="i1", directory=lockdir)
        assert not one["changed"] and one["directory"] == lockdir
        (entry,) = one["locks"]
        assert entry["name"] == "i1" and entry["holders"][0]["token_id"] == token.partition(".")[0]
        every = run(lock_info, capsys, directory=lockdir)
        assert [s["name"] for s in every["locks"]] == ["i1"]
    finally:
        hostlock.release("i1", token, directory=lockdir)


def test_force_breaks_a_lease_whoever_holds_it(capsys, lockdir):
    token = hostlock.hold("u5", lease=30, directory=lockdir, label="stuck")
    predicted = run(lock, capsys, name="u5", state="released", force=True, directory=lockdir, _ansible_check_mode=True)
    assert predicted["changed"] and "stuck" in predicted["msg"]
    assert [h for h in hostlock.holders("u5", directory=lockdir) if not h.stale], "check mode broke the lock"
    broken = run(lock, capsys, name="u5", state="released", force=True, directory=lockdir)
    assert broken["changed"] and broken["released"][0]["label"] == "stuck", broken
    with hostlock.Lock("u5", directory=lockdir).acquire(timeout=5):
        pass  # the lease holder is gone
    again = run(lock, capsys, name="u5", state="released", token=token, directory=lockdir)
    assert not again["changed"] and again["_rc"] == 0
