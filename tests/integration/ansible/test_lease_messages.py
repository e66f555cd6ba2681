"""Issue 23 item 7 through a real ansible-playbook run: another lock's token is called a wrong token."""

from __future__ import annotations


def test_renewing_a_never_held_lock_with_another_locks_token_says_wrong_token(ansible, engine):
    run = ansible.play("lease_wrong_lock.yml")
    assert run.rc == 0, run.out  # the expected failure is ignored
    r = run.results()
    wrong = r["Renew a lock never held with the token of mine"]["loc"]
    assert wrong["_status"] == "failed", wrong
    assert "wrong token" in wrong["msg"] and "another lock" in wrong["msg"], wrong["msg"]
    assert "released meanwhile" not in wrong["msg"], wrong["msg"]
    assert r["Release mine"]["loc"]["changed"], r["Release mine"]
    assert not engine.holders("wrong-lock-mine", directory=str(ansible.lockdir))
