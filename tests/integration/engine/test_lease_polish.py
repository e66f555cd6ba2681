"""Issue 23 item 7, the lease parts: status's SINCE is when the lock was taken, not its last renewal; a token
used on another lock is called a wrong token, not a lease that was "released meanwhile"."""

from __future__ import annotations

import time

import pytest

import hostlock


def test_renewal_keeps_the_time_the_lock_was_taken(lockdir):
    token = hostlock.hold("since", lease=600, directory=lockdir)
    try:
        (first,) = hostlock.holders("since", lockdir)
        deadline = time.monotonic() + 30
        while time.time() < first.acquired_at + 0.01 and time.monotonic() < deadline:  # a later clock reading
            time.sleep(0.01)
        for lease in (300, 400):
            expires = hostlock.renew("since", token, lease=lease, directory=lockdir)
            (now,) = hostlock.holders("since", lockdir)
            assert now.lease_expires == pytest.approx(expires, abs=0.01)  # the renewal was written...
            assert now.acquired_at == first.acquired_at  # ...and SINCE did not move
    finally:
        hostlock.release("since", token, lockdir)


def test_another_locks_token_is_a_wrong_token(lockdir):
    token = hostlock.hold("mine", lease=600, directory=lockdir)
    try:
        for call in (lambda: hostlock.renew("never-held", token, directory=lockdir),
                     lambda: hostlock.release("never-held", token, lockdir)):
            with pytest.raises(hostlock.TokenError) as e:
                call()
            assert e.value.reason == "refused", e.value
            assert "wrong token" in str(e.value) and "another lock" in str(e.value)
            assert "released" not in str(e.value)
        assert hostlock.holders("mine", lockdir)[0].token_id == token.split(".")[0]  # untouched
    finally:
        hostlock.release("mine", token, lockdir)
