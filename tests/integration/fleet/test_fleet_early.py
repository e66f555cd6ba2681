"""A lease grant sent early (fleet/grant.py send_early: `hostlock run --fleet` sends it as soon as its options are
read, before the modules that take the lock load), against a real etcd: the first lock on its URL with its TTL
takes it over (the queue transaction goes behind it on its connection), any other lock grants its own, and a
grant no lock took is revoked (drop). It never raises: whatever is wrong is the acquisition's to say."""

from __future__ import annotations

import contextlib

import pytest

import hostlock
from hostlock.fleet import grant

GUARD = 60  # seconds: a hang guard, never a measured bound


def leases(etcd):
    r = etcd.etcdctl("lease", "list")
    assert r.returncode == 0, r.stderr
    return sorted(int(x, 16) for x in r.stdout.split("\n", 1)[1].split())


@pytest.fixture(autouse=True)
def no_early_left():
    yield
    grant.drop()
    assert grant._EARLY == []


@contextlib.contextmanager
def held(etcd, name, ttl):
    """A fleet lock on `etcd` with `ttl`, held for the block, released after it."""
    lock = hostlock.Lock(name, fleet=etcd.url, ttl=ttl)
    assert lock.acquire(timeout=GUARD)
    try:
        yield lock
    finally:
        lock.release()


def test_the_first_lock_on_its_url_and_ttl_takes_the_early_grant(etcd):
    grant.send_early(etcd.url, 7.0)
    (early,) = grant._EARLY
    with held(etcd, "early", 7.0) as lock:
        assert grant._EARLY == []
        assert leases(etcd) == [early.lid]  # one lease: the one sent early, the key on it
        assert lock.fence is not None
    assert leases(etcd) == []


def test_a_lock_with_another_ttl_grants_its_own_and_drop_revokes_the_early_one(etcd):
    grant.send_early(etcd.url, 5.0)
    (early,) = grant._EARLY
    with held(etcd, "other-ttl", 9.0):
        assert grant._EARLY == [early]  # not this lock's: still waiting
        ours = [lid for lid in leases(etcd) if lid != early.lid]
        assert len(ours) == 1
    grant.drop()
    assert grant._EARLY == [] and leases(etcd) == []  # revoked, not left to expire


def test_an_early_grant_no_lock_takes_is_revoked(etcd):
    grant.send_early(etcd.url, 10.0)
    grant.send_early(etcd.url, 10.0)  # at most one
    assert len(grant._EARLY) == 1
    grant.drop()
    assert grant._EARLY == [] and leases(etcd) == []


@pytest.mark.parametrize("url", ["etcd://127.0.0.1:1", "etcd://", "http://127.0.0.1:2379", "etcd://u:p@127.0.0.1:1"])
def test_a_url_that_cannot_take_a_grant_leaves_nothing_and_raises_nothing(url):
    grant.send_early(url, 10.0)
    assert grant._EARLY == []


RUN = """
import sys
from hostlock.cli import main
from hostlock.fleet import grant, session

sent, taken = [], []
send, take = grant.send_early, session.take_early
grant.send_early = lambda url, ttl: (sent.append((url, ttl)), send(url, ttl))[1]
session.take_early = lambda client, ttl: (lambda got: (taken.append(got is not None), got)[1])(take(client, ttl))
code = main(["run", "--fleet", sys.argv[1], "early-run", "sh", "-c", 'test -n "$HOSTLOCK_FENCE"'])
print(sent == [(sys.argv[1], 10.0)], taken == [True], code)
"""


def test_hostlock_run_sends_its_grant_early_and_its_lock_takes_it(etcd):
    """`hostlock run --fleet` itself: it sends the grant with the default TTL before the lock exists, the lock
    takes it, the job runs with its fence, and once the command is done no lease is left in etcd."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", RUN, etcd.url], capture_output=True, text=True, timeout=GUARD,
                       check=False)
    assert (r.returncode, r.stdout) == (0, "True True 0\n"), r.stderr
    assert leases(etcd) == []
