"""Default options never let a lost fleet lock's job overlap the next holder (issue 24 item 4), even a job
that takes its time on SIGTERM: hostlock sends SIGTERM --kill-after before the lease can end (by its own
clock: last answered keep-alive + TTL - margin) and SIGKILL at that deadline, so the job is dead before etcd
can hand the lock on. Proven by timestamps the two jobs write, on one clock."""

from __future__ import annotations

import fleet_etcd
import pytest
from cli_support import wait_file
from test_cli_fleet import controller, wait_waiters


@pytest.fixture
def proxy(etcd):
    p = fleet_etcd.TcpProxy(etcd.endpoint)
    yield p
    p.close()


STUBBORN = ("trap 'echo term >> {t}' TERM; echo ready > {r}; "
            "while :; do date +%s.%N >> {a}; sleep 0.05; done")  # keeps going after SIGTERM


def partitioned_holder_and_next(cli, etcd, proxy, *extra):
    alive, term, ready, began = (cli.tmp / n for n in ("alive", "term", "ready", "began"))
    a = cli.start("run", "--fleet", proxy.url, "--ttl", "4s", *extra, "deploy", "-c",
                  STUBBORN.format(t=term, r=ready, a=alive), env=controller(cli, "a"))
    wait_file(ready)
    b = cli.start("run", "--fleet", etcd.url, "-w", "2m", "deploy", "-c", "date +%%s.%%N > %s" % began,
                  env=controller(cli, "b"))
    wait_waiters(cli, etcd.url, "deploy", 1)
    proxy.cut()  # the holder is cut off from etcd: it cannot renew; etcd ends its lease after the TTL
    assert b.wait(timeout=120) == 0, b.stderr.read()
    assert a.wait(timeout=120) == 79, a.stderr.read()
    last = max(float(x) for x in alive.read_text().split())
    return last, float(began.read_text()), term, a.stderr.read()


def test_a_partitioned_holders_stubborn_job_is_dead_before_the_next_holder_starts(cli, etcd, proxy):
    last, began, term, err = partitioned_holder_and_next(cli, etcd, proxy)
    assert term.read_text() == "term\n"  # it was asked first, and ignored it
    assert last < began, "the old job wrote %.3f s after the next holder began" % (last - began)
    assert "lost lock 'deploy'" in err and "job stopped, killed by signal 9 (SIGKILL)" in err, err


def test_a_kill_after_the_ttl_cannot_honour_is_refused(cli, etcd):
    r = cli.run("run", "--fleet", etcd.url, "--ttl", "4s", "--kill-after", "3s", "deploy", "true",
                env=controller(cli, "a"))
    assert r.returncode == 64 and r.stderr.count("\n") == 1 and "--kill-after 3s" in r.stderr, r.stderr
