"""A fleet lock's --kill-after comes out of its TTL (issue 24 item 4): default TTL/4 (at most the host lock
default), an explicit one up to TTL/2, more refused (usage, before any I/O); host locks keep 10 s."""

from __future__ import annotations

import pytest

from hostlock.cli import common as c
from hostlock.cli import options

URL = "etcd://127.0.0.1:1"


@pytest.fixture(autouse=True)
def no_fleet_env(monkeypatch):
    monkeypatch.delenv(c.FLEET_ENV, raising=False)


def parse(*args):
    return options.parse(list(args), cron=False)


@pytest.mark.parametrize(("args", "expected"), [
    ((), 2.5), (("--ttl", "8s"), 2.0), (("--ttl", "2m"), 10.0), (("--ttl", "8s", "--kill-after", "4s"), 4.0),
    (("--kill-after", "0"), 0.0),
])
def test_a_fleet_locks_kill_after(args, expected):
    assert parse("--fleet", URL, *args, "n", "true").kill_after == expected


def test_host_locks_keep_the_default():
    assert parse("n", "true").kill_after == 10.0


@pytest.mark.parametrize("args", [("--kill-after", "6s"), ("--ttl", "4s", "--kill-after", "3s")])
def test_more_than_half_the_ttl_is_refused(args):
    with pytest.raises(c.UsageError, match="--kill-after .* cannot be honoured"):
        parse("--fleet", URL, *args, "n", "true")
