"""The etcd fixtures themselves: a member answers, a cluster keeps quorum with one member down and loses it
with two, the proxy forwards and cuts. The fleet tests rely on each of these facts."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest


def _put(endpoint: str, key: str, value: str, timeout: float = 5) -> dict:
    import base64

    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "value": base64.b64encode(value.encode()).decode()}).encode()
    req = urllib.request.Request("http://%s/v3/kv/put" % endpoint, data=body, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def _put_retrying(endpoint: str, key: str, value: str, within: float = 60) -> dict:
    """A write that may first meet a leader election: etcd answers 503 (or times out) for a proposal that was
    in flight to a dead leader; a client retries, as hostlock's does."""
    deadline = time.monotonic() + within
    while True:
        try:
            return _put(endpoint, key, value)
        except OSError:
            if time.monotonic() > deadline:
                raise


def test_single_member_answers_the_json_gateway(etcd):
    assert "revision" in _put(etcd.endpoint, "k", "v")["header"]
    r = etcd.etcdctl("get", "k", "--print-value-only")
    assert r.returncode == 0 and r.stdout.strip() == "v"


def test_cluster_keeps_quorum_with_one_member_down_and_loses_it_with_two(etcd_cluster):
    a, b, c = etcd_cluster.members
    c.kill()
    assert _put_retrying(a.endpoint, "k", "1")["header"]
    b.kill()
    # No quorum: a write cannot commit; the gateway answers an error or the request times out.
    with pytest.raises(Exception):  # noqa: B017,PT011 - urllib raises HTTPError or a timeout, either is "no"
        _put(a.endpoint, "k", "2", timeout=3)
    b.start()
    c.start()
    a.wait_ready()
    b.wait_ready()
    assert _put_retrying(a.endpoint, "k", "3")["header"]


def test_proxy_forwards_then_cuts_then_heals(etcd, proxy_to):
    p = proxy_to(etcd.endpoint)
    assert _put(p.endpoint, "k", "through")["header"]
    p.cut()
    with pytest.raises(OSError):
        _put(p.endpoint, "k", "cut", timeout=1)
    p.heal()
    assert _put(p.endpoint, "k", "healed")["header"]
    assert etcd.etcdctl("get", "k", "--print-value-only").stdout.strip() == "healed"
