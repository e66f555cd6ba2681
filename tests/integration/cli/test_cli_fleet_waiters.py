"""Every way a waiter for a fleet lock ends removes its key from the queue before it exits (issue 24 item 2),
and a waiter that loses its place queues again while its wait lasts (item 3).

Every lease here has a TTL of 60 s, so a key left behind would hold up the waiter behind it for a minute: the
proof is that the waiter's key is already gone from etcd the moment its process has exited (read then, no
wait), and that the next waiter is served when the holder releases, with a hang guard below that TTL.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from cli_support import LIB, PYTHON, wait_file, wait_until
from engine_helpers import default_signals, signum
from test_cli_fleet import controller, gated, status, wait_waiters

TTL = "60s"
GUARD = 45  # seconds: a hang guard, below the TTL a key left behind would cost


def keys(etcd, name="deploy"):
    r = etcd.etcdctl("get", "--prefix", "hostlock/%s/" % name, "--keys-only", "--sort-by=CREATE")
    assert r.returncode == 0, r.stderr
    return [k for k in r.stdout.split() if k]


def leases(etcd):
    """The ids of etcd's live leases ('found N leases' and then one id a line)."""
    r = etcd.etcdctl("lease", "list")
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n", 1)[1].split()


def waiter(cli, etcd, tag, *extra, wrap=()):
    """A waiter whose job appends TAG to the order file."""
    order = cli.tmp / "order"
    argv = cli.argv("run", "--fleet", etcd.url, "--ttl", TTL, *extra, "deploy", "-c", "echo %s >> %s" % (tag, order))
    env = controller(cli, tag)
    p = subprocess.Popen([*wrap, *argv], text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=default_signals)
    cli.procs.append(p)
    return p


def holder(cli, etcd):
    script, started, go = gated(cli, "a")
    a = cli.start("run", "--fleet", etcd.url, "--ttl", TTL, "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    return a, go


def serve_the_rest(cli, a, go, *waiters):
    go.write_text("")
    assert a.wait(timeout=GUARD) == 0
    for w in waiters:
        assert w.wait(timeout=GUARD) == 0, w.stderr.read()
    return (cli.tmp / "order").read_text().split()


# Every signal that ends a process does (hostlock.core.signals): those named in issue 24 and others a user or a
# supervisor sends (kill -s, timeout -s, systemd's KillSignal=, RLIMIT_CPU), a real-time one among them.
@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP", "QUIT", "USR1", "PWR", "RTMIN+3"])
def test_a_signalled_waiter_takes_its_key_with_it(cli, etcd, sig):
    a, go = holder(cli, etcd)
    w1 = waiter(cli, etcd, "w1", "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 1)
    w2 = waiter(cli, etcd, "w2", "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 2)
    assert len(keys(etcd)) == 3
    os.kill(w1.pid, signum(sig))
    assert w1.wait(timeout=GUARD) == 128 + signum(sig), w1.stderr.read()
    assert len(keys(etcd)) == 2  # gone already: the holder's key and w2's
    assert serve_the_rest(cli, a, go, w2) == ["w2"]


def test_a_run_waiter_holds_a_sigalrm_for_its_job(cli, etcd):
    """The one exception: SIGALRM is a fleet `run`'s (and `cron`'s) own wake-up from its keep-alive thread, blocked
    while it waits. Sent then, it stays pending, and reaches the job once that runs (exit 142), as documented."""
    a, go = holder(cli, etcd)
    argv = cli.argv("run", "--fleet", etcd.url, "--ttl", TTL, "-w", "5m", "deploy", "sleep", "30")
    w1 = subprocess.Popen(argv, text=True, env=controller(cli, "w1"), stderr=subprocess.PIPE, start_new_session=True,
                          preexec_fn=default_signals)
    cli.procs.append(w1)
    wait_waiters(cli, etcd.url, "deploy", 1)
    os.kill(w1.pid, signal.SIGALRM)
    go.write_text("")
    assert a.wait(timeout=GUARD) == 0
    assert w1.wait(timeout=GUARD) == 128 + signal.SIGALRM, w1.stderr.read()  # its job, killed by it at once
    assert keys(etcd) == []


# The command in-process, with the last call it makes between the end of its wait and the job's start (`run`:
# fence_env; `cron`: _capture_file) sending it a signal first: a signal that lands in that window, after the
# lock is held.
AS_THE_WAIT_ENDS = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from hostlock.cli import cron, main, run
module = {"run": run, "cron": cron}[sys.argv[2]]
name = sys.argv[3]
real = getattr(module, name)

def signalled_first(*args):
    os.kill(os.getpid(), signal.SIGUSR1)
    return real(*args)

setattr(module, name, signalled_first)
sys.exit(main(sys.argv[2:3] + sys.argv[4:]))
"""


@pytest.mark.parametrize("command, window, args", [
    ("run", "fence_env", ["deploy", "sleep", "30"]),
    ("cron", "_capture_file", ["--name", "deploy", "sleep", "30"]),
])
def test_a_signal_as_the_wait_ends_reaches_the_job_and_the_lock_is_released(cli, etcd, command, window, args):
    """Once the lock is held a signal is the job's: blocked before the wait's handlers go, it waits for the
    supervisor, which forwards it (the job dies of it: 128+N), and the lock is released as the job ends.
    Without that, hostlock died of it there, and its key stayed for the lease's whole TTL."""
    r = subprocess.run([PYTHON, "-c", AS_THE_WAIT_ENDS, str(LIB), command, window, "--fleet", etcd.url, "--ttl", TTL,
                        *args], capture_output=True, text=True, timeout=GUARD, env=controller(cli, "w"),
                       preexec_fn=default_signals, check=False)
    assert r.returncode == 128 + signal.SIGUSR1, (r.returncode, r.stderr)
    assert keys(etcd) == []


def test_a_waiter_under_timeout_1_takes_its_key_with_it(cli, etcd):
    """timeout(1) ends its command with SIGTERM (here: forwarded as timeout does when it is itself told to
    stop, so the waiter is surely queued first; at expiry it sends the same signal the same way)."""
    a, go = holder(cli, etcd)
    w1 = waiter(cli, etcd, "w1", "-w", "5m", wrap=("timeout", "600"))
    wait_waiters(cli, etcd.url, "deploy", 1)
    w2 = waiter(cli, etcd, "w2", "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 2)
    os.kill(w1.pid, signal.SIGTERM)
    assert w1.wait(timeout=GUARD) == 128 + signal.SIGTERM  # timeout passes on its command's status
    assert len(keys(etcd)) == 2
    assert serve_the_rest(cli, a, go, w2) == ["w2"]


def test_a_waiter_whose_wait_runs_out_takes_its_key_with_it(cli, etcd):
    a, go = holder(cli, etcd)
    w2 = waiter(cli, etcd, "w2", "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 1)
    w1 = waiter(cli, etcd, "w1", "-w", "2s")
    assert w1.wait(timeout=GUARD) == 75
    assert len(keys(etcd)) == 2
    assert serve_the_rest(cli, a, go, w2) == ["w2"]


def test_a_waiter_that_loses_its_lease_queues_again_and_leaves_no_key(cli, etcd):
    """Its lease revoked (as an outage longer than its TTL ends it): the waiter queues again, behind those who
    came after it, instead of exiting; the next waiter is served first, then it."""
    a, go = holder(cli, etcd)
    w1 = waiter(cli, etcd, "w1", "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 1)
    w2 = waiter(cli, etcd, "w2", "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 2)
    first = keys(etcd)
    lease = first[1].rsplit("/", 1)[1]
    assert etcd.etcdctl("lease", "revoke", lease).returncode == 0
    wait_until(lambda: len(keys(etcd)) == 3 and keys(etcd)[:2] == [first[0], first[2]], GUARD,
               "w1 queued again behind w2")
    assert w1.poll() is None
    assert serve_the_rest(cli, a, go, w2, w1) == ["w2", "w1"]


def test_a_waiter_waits_its_whole_wait_through_an_outage_longer_than_its_ttl(cli, etcd):
    """etcd down longer than the waiter's TTL: its lease ends, and with time left it queues again (it used to
    exit 76 the moment etcd was back). The holder (a longer TTL) gives its lock up during the outage: once it
    has, the waiter's lease (2 s TTL, kept alive up to the outage like the holder's) has ended too."""
    script, started, _go = gated(cli, "a")
    a = cli.start("run", "--fleet", etcd.url, "--ttl", "4s", "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    order = cli.tmp / "order"
    w = cli.start("run", "--fleet", etcd.url, "--ttl", "2s", "-w", "3m", "deploy", "-c", "echo w >> %s" % order,
                  env=controller(cli, "w"))
    wait_waiters(cli, etcd.url, "deploy", 1)
    etcd.stop()
    assert a.wait(timeout=120) == 79
    etcd.start().wait_ready()
    assert w.wait(timeout=150) == 0, w.stderr.read()
    assert order.read_text() == "w\n"
    assert status(cli, etcd.url, "deploy")["locks"][0]["holders"] == []


# -- hostlock hold: its wait runs on a kept-alive lease of 10 s, its key in the same queue -----------------


def hold_waiter(cli, etcd, *extra, wrap=()):
    """`hostlock hold` waiting for the lock (the token it would print is on its stdout)."""
    argv = cli.argv("hold", "--fleet", etcd.url, "--lease", "5m", *extra, "deploy")
    p = subprocess.Popen([*wrap, *argv], text=True, env=controller(cli, "h"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True, preexec_fn=default_signals)
    cli.procs.append(p)
    return p


def queued_hold(cli, etcd, *extra, wrap=()):
    """A holder, a waiting `hold`, and a `run` waiter behind it: three keys."""
    a, go = holder(cli, etcd)
    h = hold_waiter(cli, etcd, "-w", "5m", *extra, wrap=wrap)
    wait_waiters(cli, etcd.url, "deploy", 1)
    w2 = waiter(cli, etcd, "w2", "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 2)
    assert len(keys(etcd)) == 3
    return a, go, h, w2


@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP", "QUIT", "USR2", "ALRM", "RTMIN+3"])
def test_a_signalled_hold_waiter_takes_its_key_with_it(cli, etcd, sig):
    """Without the clean-up its key stayed for the wait lease's 10 s TTL (SIGTERM, SIGHUP, SIGQUIT)."""
    a, go, h, w2 = queued_hold(cli, etcd)
    os.kill(h.pid, signum(sig))
    assert h.wait(timeout=GUARD) == 128 + signum(sig), h.stderr.read()
    assert h.stdout.read() == ""  # no token: nothing is held
    assert "Traceback" not in h.stderr.read()
    assert len(keys(etcd)) == 2  # gone already: the holder's key and w2's
    assert serve_the_rest(cli, a, go, w2) == ["w2"]


def test_a_hold_waiter_under_timeout_1_takes_its_key_with_it(cli, etcd):
    a, go, h, w2 = queued_hold(cli, etcd, wrap=("timeout", "600"))
    os.kill(h.pid, signal.SIGTERM)  # timeout(1) passes it on to hold, as it does at expiry
    assert h.wait(timeout=GUARD) == 128 + signal.SIGTERM
    assert h.stdout.read() == ""
    assert len(keys(etcd)) == 2
    assert serve_the_rest(cli, a, go, w2) == ["w2"]


def test_a_hold_waiter_whose_wait_runs_out_takes_its_key_with_it(cli, etcd):
    a, go = holder(cli, etcd)
    w2 = waiter(cli, etcd, "w2", "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 1)
    h = hold_waiter(cli, etcd, "-w", "2s")
    assert h.wait(timeout=GUARD) == 75, h.stderr.read()
    assert h.stdout.read() == ""
    assert len(keys(etcd)) == 2
    assert serve_the_rest(cli, a, go, w2) == ["w2"]


def test_a_hold_that_got_the_lock_keeps_it_on_its_lease_alone(cli, etcd):
    """The counterpart: a hold served after its wait prints the token, and its key (moved onto the --lease
    lease) stays after it exited; the wait's own lease is revoked, not left to expire."""
    a, go = holder(cli, etcd)
    h = hold_waiter(cli, etcd, "-w", "5m")
    wait_waiters(cli, etcd.url, "deploy", 1)
    go.write_text("")
    assert a.wait(timeout=GUARD) == 0
    assert h.wait(timeout=GUARD) == 0, h.stderr.read()
    token = h.stdout.read().strip()
    assert token.startswith("hostlock-etcd.")
    assert len(keys(etcd)) == 1
    assert len(leases(etcd)) == 1  # the --lease one: the wait's lease was revoked, not left to expire
    r = cli.run("release", "--fleet", etcd.url, "deploy", token, env=controller(cli, "h"))
    assert r.returncode == 0, r.stderr
    assert keys(etcd) == []
