"""Unit tests for serialize's planning: lock names, buckets, the plan of a play within the descriptor budget."""

from __future__ import annotations

from ansible_collections.hostlock.core.plugins.module_utils import hostlock
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_plan import BUCKETS, bucket_name, lock_name, plan


def test_lock_name_is_valid_and_distinct():
    assert lock_name("ansible-host@", "web1.example.com") == "ansible-host@web1.example.com"
    odd = [lock_name("ansible-host@", h) for h in ("fe80::1", "fe80__1", "a b", "x" * 200)]
    for name in odd:
        hostlock.validate_name(name)
    assert len(set(odd)) == len(odd), "hosts whose names need changes must not collide"


def test_bucket_and_host_names_never_collide():
    buckets = {bucket_name("ansible-host@", b) for b in range(BUCKETS)}
    for name in buckets:
        hostlock.validate_name(name)
    # a host literally named like a bucket gets a hashed name, never the bucket's
    assert lock_name("ansible-host@", ".bucket-07") not in buckets


def test_plan_stays_within_the_descriptor_budget():
    small = plan(["a", "b", "c"], budget=256)
    assert sorted(small.values()).count("exclusive") == 3  # one per host; the buckets are shared
    assert all(mode == "shared" for (b, kind, h), mode in small.items() if kind == 0)
    large = plan([f"h{i}" for i in range(10_000)], budget=256)
    assert len(large) == BUCKETS and set(large.values()) == {"exclusive"}
    for bucket, kind, host in small:  # in key order a bucket's lock comes before its hosts' locks
        assert kind == 0 or (bucket, 0, "") < (bucket, kind, host)
