"""Unit tests for serialize's recap: what lock and locked tasks report, and the leases a run left held."""

from __future__ import annotations

from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_recap import Recap


def test_leases_left_held_are_tracked():
    recap = Recap()
    lease = dict(name="deploy", event="acquired", waited=0.5, token_id="aaa", lease_expires=4e9)
    recap._account("h1", lease)
    recap._account("h1", dict(lease, token_id="bbb"))
    recap._account("h1", dict(name="deploy", event="released", waited=0, token_id="aaa"))
    assert list(recap.leases[("h1", "deploy")]) == ["bbb"]
    recap._account("h1", dict(name="apt", event="locked", waited=1.0, held=2.0))
    use = recap.uses[("h1", "apt")]
    assert use["uses"] == 1 and use["held"] == 2.0 and use["max_waited"] == 1.0
