"""The lease token formats (core/tokens.py): the one parser the engine and the Ansible plugins share."""

from hostlock.core import tokens


def test_fence_from_a_fleet_token():
    assert tokens.fence_of("hostlock-etcd.694d9c7a1b2c3d4e.4711") == 4711
    assert tokens.fence_of("not-a-token") is None
    assert tokens.fence_of("3f1c2e5a9b07.bd2a6c0f5e8a4d2b9c1e7f30a6d4c2b1") is None, "a host token has no fence"
