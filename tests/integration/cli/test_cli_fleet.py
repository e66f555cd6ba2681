"""`hostlock --fleet`: the command line on fleet locks, against a real etcd (the `etcd` fixture, conftest.py).

Each "controller" is a `hostlock` process with its own lock directory ($HOSTLOCK_DIR): they share nothing but
the fleet URL. Every wait is on an event (a file the job writes, a waiter etcd lists, a process ending),
never on a sleep being long enough; nothing asserts on timings.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import time

import pytest
from cli_support import PYTHON, fd_links, kill_quietly, pid_alive, wait_file, wait_until
from engine_helpers import signum

from hostlock.core import procstat
from hostlock.core.signals import ENDING

HOST = os.uname().nodename


def c_quote(word):
    from hostlock.cli.common import quote

    return quote(word)


def controller(cli, name):
    """The environment of one controller: its own lock directory, no fleet unless given."""
    d = cli.tmp / ("dir-" + name)
    d.mkdir(mode=0o700, exist_ok=True)
    env = dict(cli.env, HOSTLOCK_DIR=str(d))
    env.pop("HOSTLOCK_FLEET", None)
    return env


def gated(cli, tag, extra=""):
    """A job that says it started (its fence), then runs until the test creates go-TAG."""
    started = cli.tmp / ("started-" + tag)
    go = cli.tmp / ("go-" + tag)
    script = '%s echo "$HOSTLOCK_FENCE" > %s; while [ ! -e %s ]; do sleep 0.02; done' % (extra, started, go)
    return script, started, go


def status(cli, url, name=None, env=None):
    r = cli.run("status", "--fleet", url, "--json", *([name] if name else []), env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_waiters(cli, url, name, count):
    wait_until(lambda: status(cli, url, name)["locks"][0]["waiters"] >= count, 60, "%d waiter(s)" % count)


def wait_job_recorded(cli, url, name):
    def recorded():
        hs = status(cli, url, name)["locks"][0]["holders"]
        return hs if hs and all(h["job_pid"] for h in hs) else None

    wait_until(recorded, 60, "the job's pid in the owner record")
    return recorded()


def test_two_controllers_with_their_own_directories_take_turns(cli, etcd):
    inside = cli.tmp / "inside"  # an overlap detector of its own: mkdir fails while another job is inside
    jobs = {}
    for tag in ("a", "b"):
        script, started, go = gated(cli, tag, "mkdir %s || exit 99;" % inside)
        jobs[tag] = (script + "; rmdir %s" % inside, started, go)
    a = cli.start("run", "--fleet", etcd.url, "deploy", "-c", jobs["a"][0], env=controller(cli, "a"))
    wait_file(jobs["a"][1])
    b = cli.start("run", "--fleet", etcd.url, "-w", "5m", "deploy", "-c", jobs["b"][0], env=controller(cli, "b"))
    wait_waiters(cli, etcd.url, "deploy", 1)
    assert not jobs["b"][1].exists()  # queued behind a, which still runs
    jobs["a"][2].write_text("")
    assert a.wait(timeout=60) == 0, a.stderr.read()
    wait_file(jobs["b"][1])
    jobs["b"][2].write_text("")
    assert b.wait(timeout=60) == 0, b.stderr.read()
    assert int(jobs["b"][1].read_text()) > int(jobs["a"][1].read_text())
    # Neither controller's own directory holds any lock: the lock was in etcd alone.
    for tag in ("a", "b"):
        assert not list((cli.tmp / ("dir-" + tag)).glob("*.lock"))


def test_busy_lock_names_the_holder_on_its_host(cli, etcd):
    script, started, go = gated(cli, "a")
    a = cli.start("run", "--fleet", etcd.url, "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    wait_job_recorded(cli, etcd.url, "deploy")
    r = cli.run("run", "--fleet", etcd.url, "-n", "deploy", "true", env=controller(cli, "b"))
    assert r.returncode == 75
    assert r.stderr.startswith("hostlock: lock deploy is busy: held by pid %d on %s running job pid" % (a.pid, HOST))
    assert r.stderr.count("\n") == 1
    r = cli.run("run", "--fleet", etcd.url, "-w", "300ms", "-E", "3", "deploy", "true", env=controller(cli, "b"))
    assert r.returncode == 3 and "(waited 300ms)" in r.stderr
    # The waiter that gave up left nothing behind: only the holder's key is there.
    assert status(cli, etcd.url, "deploy")["locks"][0]["waiters"] == 0
    go.write_text("")
    assert a.wait(timeout=60) == 0


def test_the_job_gets_an_increasing_fence_and_the_fleet(cli, etcd):
    env = dict(controller(cli, "a"), HOSTLOCK_FLEET=etcd.url)  # the fleet from the environment
    seen = []
    for _run in range(3):
        r = cli.run("run", "deploy", "-c", 'echo "$HOSTLOCK_FENCE $HOSTLOCK_FLEET"', env=env)
        assert r.returncode == 0, r.stderr
        fence, fleet = r.stdout.split()
        assert fleet == etcd.url
        seen.append(int(fence))
    assert seen == sorted(set(seen))
    # --fleet '' forces a host lock whatever the environment says: no fence, a lock file in HOSTLOCK_DIR.
    r = cli.run("run", "--fleet", "", "deploy", "-c", 'echo "fence=${HOSTLOCK_FENCE-none}"', env=env)
    assert (r.returncode, r.stdout) == (0, "fence=none\n")
    assert (cli.tmp / "dir-a" / "deploy.lock").exists()


def test_the_job_is_named_in_the_record_its_pid_a_moment_later(cli, etcd):
    """The queue transaction's record (written before the job's process is forked, which happens while etcd
    answers) names hostlock and the job's command; the job's pid is added 0.1 s later by the keep-alive thread
    (version 2). `status` shows the job either way."""
    script, started, go = gated(cli, "a", "echo $$ > %s;" % (cli.tmp / "job-pid"))
    a = cli.start("run", "--fleet", etcd.url, "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    job = int((cli.tmp / "job-pid").read_text())

    def record():
        r = etcd.etcdctl("get", "--prefix", "hostlock/deploy/", "-w", "json")
        assert r.returncode == 0, r.stderr
        [kv] = json.loads(r.stdout)["kvs"]
        return kv["version"], base64.b64decode(kv["value"])

    wait_until(lambda: record()[0] == 2, 60, "the job's pid in the record")
    value = record()[1]
    assert b"|pid=%d|" % a.pid in value and b"|jpid=%d|" % job in value and b"|jcmd=/bin/sh -c " in value
    assert [h["job_pid"] for h in status(cli, etcd.url, "deploy")["locks"][0]["holders"]] == [job]
    go.write_text("")
    assert a.wait(timeout=60) == 0, a.stderr.read()


@pytest.mark.parametrize("mode", [(), ("--slots", "2"), ("--shared",)])
def test_status_says_since_when_a_waiter_holds_not_since_it_queued(cli, etcd, mode):
    """A waiter's record is written when it queues; once it holds, status's SINCE (`acquired_at`) must be the
    moment it took the lock, as for a host lock (the keep-alive thread rewrites it 0.1 s into the hold)."""
    holders = 2 if mode == ("--slots", "2") else 1
    held_as = ("--exclusive",) if mode == ("--shared",) else mode  # what makes the waiter wait
    gates = []
    for k in range(holders):
        script, started, go = gated(cli, "a%d" % k)
        gates.append((cli.start("run", "--fleet", etcd.url, *held_as, "deploy", "-c", script,
                                env=controller(cli, "a%d" % k)), go))
        wait_file(started)
    script, started, go = gated(cli, "w")
    w = cli.start("run", "--fleet", etcd.url, *mode, "-w", "5m", "deploy", "-c", script, env=controller(cli, "w"))
    wait_waiters(cli, etcd.url, "deploy", 1)
    released = time.time()
    for a, a_go in gates:
        a_go.write_text("")
        assert a.wait(timeout=60) == 0, a.stderr.read()
    wait_file(started)

    def since():
        [holder] = [h for h in status(cli, etcd.url, "deploy")["locks"][0]["holders"] if h["pid"] == w.pid]
        return holder["acquired_at"]

    wait_until(lambda: since() >= released, 60, "SINCE after the release, not the time the waiter queued")
    go.write_text("")
    assert w.wait(timeout=60) == 0, w.stderr.read()


def test_a_short_fleet_job_costs_etcd_two_writes(cli, etcd):
    """`hostlock run --fleet URL NAME true`: the queue transaction's put and the lease's revoke, and no record
    rewrite (the job's pid would be written 0.1 s into the job). etcd's revision counts its writes."""

    def revision():
        r = etcd.etcdctl("get", "nothing-here", "-w", "json")
        assert r.returncode == 0, r.stderr
        return int(json.loads(r.stdout)["header"]["revision"])

    before = revision()
    t0 = time.monotonic()
    r = cli.run("run", "--fleet", etcd.url, "deploy", "true", env=controller(cli, "a"))
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    # Taken, run and released within 0.1 s, it wrote twice; a busy machine's slower run may add the record.
    assert revision() - before in ((2,) if took < 0.1 else (2, 3))


def _processes_with(word):
    """Pids of the processes whose command line holds `word` (ours excluded)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/%s/cmdline" % name, "rb") as f:
                    if word.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def _wait_gone(pids, within=60):
    """Wait for each pid to exit (its pidfd becomes readable): an event, bounded only against a hang."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            assert select.select([fd], [], [], within)[0], "pid %d still running" % pid
        finally:
            os.close(fd)


def test_a_run_refused_the_lock_never_runs_its_job_and_leaves_no_process(cli, etcd):
    """The job's process and its watcher are forked before the lock is held: a run that does not get it
    (here -n on a held lock) sends them away, the job never runs, and nothing of that run is left."""
    script, started, go = gated(cli, "a")
    a = cli.start("run", "--fleet", etcd.url, "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    marker = cli.tmp / "the-refused-job-ran"
    r = cli.run("run", "--fleet", etcd.url, "-n", "deploy", "-c", "touch %s" % marker, env=controller(cli, "b"))
    assert r.returncode == 75, r.stderr
    _wait_gone(_processes_with(str(marker)))  # its watcher leaves on its own once told; the job's process
    assert _processes_with(str(marker)) == []  # was reaped before the run exited
    assert not marker.exists()
    assert status(cli, etcd.url, "deploy")["locks"][0]["waiters"] == 0
    go.write_text("")
    assert a.wait(timeout=60) == 0


def test_run_fleet_loads_no_lease_code_and_no_heavy_module(cli, etcd):
    """What `hostlock run --fleet` imports, from the command's own -X importtime (its forked processes
    included): the fleet engine, never the lease code (issue 25), nor the standard library's heavier modules
    (socket, json, re, importlib and warnings, math, threading, ctypes...), nor `os` (core/oslite.py: ~1 ms),
    `__future__` (the bundle compiles its flag instead) or `_json` (fleet/wirejson.py); nor the read side,
    watches or waiting (queries, core.holder, fleet.watch, fleet.waiting, fleet.admin: a lock free at once, taken
    and released, needs none of them), nor the lease's upkeep (fleet.keepalive: its thread loads it 0.1 s in).
    Installed the role's way (the engine from its bundle, cli/bundle.py), not the host mechanisms either, nor
    the fcntl and struct they use: the policy imports them with itself only when its code comes from files (a
    process that drops its privileges after importing hostlock must still take host locks,
    tests/integration/engine/test_hostile.py); the bundle's is in memory already."""
    r = subprocess.run([PYTHON, "-I", "-S", "-X", "importtime", cli.launcher, "run", "--fleet", etcd.url,
                        "imports", "true"], capture_output=True, text=True, env=controller(cli, "a"), timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    loaded = {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
    assert {"_hostlock_bundle", "hostlock.api", "hostlock.fleet.lock", "hostlock.cli.supervise"} <= loaded
    assert sorted(m for m in loaded if m.startswith("hostlock.host") or m in ("fcntl", "struct", "_struct")) == []
    heavy = {"hostlock.lease", "hostlock.core.tokens", "hostlock.host.record", "hostlock.host.channel", "socket",
             "json", "re", "base64", "enum", "ssl", "email", "http.client", "urllib.parse", "argparse", "importlib",
             "warnings", "math", "threading", "typing", "ctypes", "subprocess", "signal", "psutil", "os",
             "posixpath", "_collections_abc", "stat", "__future__", "_json", "hostlock.queries", "hostlock.core.holder",
             "hostlock.fleet.watch", "hostlock.fleet.waiting", "hostlock.fleet.admin", "hostlock.fleet.keepalive"}
    assert sorted(m for m in loaded if m in heavy) == []


def _field(pid, index):
    """Field `index` of /proc/PID/stat (procstat.STATE, PPID...), None once the process is gone."""
    fields = procstat.fields(pid)
    return None if fields is None else fields[index].decode()


def _state(pid):
    return _field(pid, procstat.STATE) or "gone"


def _children(pid):
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and _field(int(d), procstat.PPID) == str(pid)]


def _start_sleeping_job(cli, etcd, name):
    """`run --fleet URL NAME` of a job that writes its pid, then sleeps: (hostlock's Popen, the job's pid)."""
    pidfile = cli.tmp / ("%s-job" % name)
    a = cli.start("run", "--fleet", etcd.url, name, "-c",
                  "echo $$ > %s.tmp && mv %s.tmp %s && exec sleep 300" % (pidfile, pidfile, pidfile),
                  env=controller(cli, "a"))
    return a, int(wait_file(pidfile))


def test_a_fleet_job_freezes_when_hostlock_and_its_watcher_die_together(cli, etcd):
    """The job's process of `run --fleet` is forked before the lock is held, with the prctl hostlock made for
    it, and sets its PR_SET_PDEATHSIG at once: it still has it when it execs. Killed
    together (`pkill -9 hostlock` would), hostlock and its watcher leave the job frozen (SIGSTOP), or dead:
    stopped in a process group that hostlock's death orphaned, it also gets the kernel's SIGHUP (which ends
    `sleep`) and SIGCONT. Without the prctl it would run on, unlocked."""
    a, job = _start_sleeping_job(cli, etcd, "freeze")
    try:
        children = _children(a.pid)
        watcher = [pid for pid in children if pid != job]
        assert len(watcher) == 1 and job in children, (children, job)
        os.kill(watcher[0], signal.SIGKILL)  # first: it would kill the job once hostlock is gone
        wait_until(lambda: _state(watcher[0]) in ("Z", "gone"), 20, "the watcher to die")
        assert _state(job) in ("S", "R")  # the watcher's death alone changes nothing for the job
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=20)
        wait_until(lambda: _state(job) in ("T", "Z", "gone"), 20, "PR_SET_PDEATHSIG to stop the job")
    finally:
        kill_quietly([job])


def test_the_watcher_holds_no_caller_stream_and_waits_on_a_socket_without_select(cli, etcd):
    """The watcher of a fleet job lets go of hostlock's standard streams at once (`out=$(hostlock run ...)` never
    waits for it) and keeps the rest it inherited until it must act. Its channel, which must also time out at
    the lease's deadline, is a socket pair read with `_socket`'s timeout: no `select` loaded in it, a shared
    library on many builds (CPU taken from etcd and hostlock as the job starts). The job holds neither end."""
    a, job = _start_sleeping_job(cli, etcd, "watched")
    try:
        (watcher,) = [pid for pid in _children(a.pid) if pid != job]
        theirs = fd_links(watcher)
        caller = {link for fd, link in fd_links(a.pid).items() if fd in (0, 1, 2)}
        assert not set(theirs) & {0, 1, 2} and not set(theirs.values()) & caller, (theirs, caller)
        assert any(link.startswith("socket:") for link in theirs.values()), theirs
        assert not any(link.startswith("socket:") for link in fd_links(job).values())
        builtin = subprocess.run([PYTHON, "-I", "-S", "-c", "import sys; print('select' in sys.builtin_module_names)"],
                                 capture_output=True, text=True, check=True).stdout.strip() == "True"
        if not builtin:
            with open("/proc/%d/maps" % watcher) as f:
                assert "/select." not in f.read()
        a.send_signal(signal.SIGKILL)  # it still acts: the job dies with hostlock
        a.wait(timeout=20)
        wait_until(lambda: _state(job) in ("Z", "gone") and _state(watcher) in ("Z", "gone"), 20,
                   "the watcher to kill the job, then leave")
    finally:
        kill_quietly([job])


def test_a_revoked_lock_stops_the_job_and_exits_79(cli, etcd):
    got = cli.tmp / "got-term"
    script, started, _go = gated(cli, "a", "trap 'echo term > %s; exit 5' TERM;" % got)
    a = cli.start("run", "--fleet", etcd.url, "--kill-after", "5s", "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    fence = int(started.read_text())
    r = cli.run("break", "--fleet", etcd.url, "--force", "deploy", env=controller(cli, "b"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("revoked the etcd lease of pid %d on %s" % (a.pid, HOST)), r.stdout
    assert a.wait(timeout=60) == 79  # whatever the job's own status (5)
    assert got.read_text() == "term\n"
    last = a.stderr.read().splitlines()[-1]  # a line before it may be the job's (sh: "Terminated")
    assert last.startswith("hostlock: lost lock 'deploy' in %s/hostlock/deploy/: " % etcd.url), last
    assert "; fence %d; job stopped, exit status 5 after " % fence in last


def test_a_lost_locks_job_ends_whole_even_what_left_its_group(cli, etcd):
    """The job is its whole tree, as for the watcher: a child that left the job's group (setsid) gets SIGTERM
    once the job's first process is gone and SIGKILL at the group's deadline, and hostlock exits only once it
    is gone. It ran on before, beside the lock's next holder."""
    escaped, got = cli.tmp / "escaped", cli.tmp / "escaped-term"
    inner = "trap 'echo term > %s; exit 0' TERM; echo $$ > %s; while :; do sleep 0.02; done" % (got, escaped)
    script, started, _go = gated(cli, "a", "setsid sh -c %s & while [ ! -s %s ]; do sleep 0.02; done;"
                                 % (shlex.quote(inner), escaped))
    a = cli.start("run", "--fleet", etcd.url, "--ttl", "60s", "--kill-after", "25s", "deploy", "-c", script,
                  env=controller(cli, "a"))
    wait_file(started)
    pid = int(escaped.read_text())
    assert procstat.split(procstat.read(pid))[procstat.PGRP] == str(pid).encode()  # its own group, not the job's
    r = cli.run("break", "--fleet", etcd.url, "--force", "deploy", env=controller(cli, "b"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert a.wait(timeout=60) == 79
    assert not pid_alive(pid)  # gone by the time hostlock exits
    assert got.read_text() == "term\n"  # it had its SIGTERM first, and the grace to act on it


def test_a_deleted_key_stops_the_job_and_exits_79(cli, etcd):
    script, started, _go = gated(cli, "a")
    a = cli.start("run", "--fleet", etcd.url, "--kill-after", "0", "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    r = etcd.etcdctl("del", "--prefix", "hostlock/deploy/")
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stdout + r.stderr
    assert a.wait(timeout=60) == 79
    assert "hostlock: lost lock 'deploy'" in a.stderr.read()


def test_break_without_force_removes_nothing_and_says_who_holds(cli, etcd):
    script, started, go = gated(cli, "a")
    a = cli.start("run", "--fleet", etcd.url, "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    r = cli.run("break", "--fleet", etcd.url, "deploy")
    assert r.returncode == 75
    assert "nothing to remove from deploy" in r.stdout and "use --force to revoke its lease" in r.stdout
    go.write_text("")
    assert a.wait(timeout=60) == 0
    r = cli.run("break", "--fleet", etcd.url, "deploy", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["remaining"] == []


def test_cron_reports_a_lost_lock_as_a_failure(cli, etcd):
    ready = cli.tmp / "ready"
    job = "echo some output; trap 'echo cleaned up; exit 0' TERM; echo > %s; while :; do sleep 0.02; done" % ready
    a = cli.start("cron", "--fleet", etcd.url, "--name", "nightly", "--", "sh", "-c", job, env=controller(cli, "a"))
    wait_file(ready)
    assert cli.run("break", "--fleet", etcd.url, "--force", "nightly").returncode == 0
    assert a.wait(timeout=60) == 79  # the job itself exited 0 after its SIGTERM
    out = a.stdout.read().splitlines()  # the captured output, the job's stdout and stderr interleaved
    assert out[0] == "some output" and out[-1] == "cleaned up"  # (sh may say "Terminated" in between)
    last = a.stderr.read().splitlines()[-1]
    assert last.startswith("hostlock: cron nightly: lost lock 'nightly' in "), last
    assert "; job stopped, exit status 0 after " in last and last.endswith(": sh -c " + c_quote(job))


# SIGALRM too: the keep-alive thread's wake-ups use it, told apart by their sender (hostlock itself).
@pytest.mark.parametrize("sig", ["TERM", "ALRM", "RTMIN+2"])
def test_a_signal_to_hostlock_reaches_the_job_while_the_keepalive_thread_runs(cli, etcd, sig):
    script, started, _go = gated(cli, "a", "trap 'exit 7' %s;" % sig)
    a = cli.start("run", "--fleet", etcd.url, "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    os.kill(a.pid, signum(sig))
    assert a.wait(timeout=60) == 7  # forwarded, not hostlock killed by a signal its keep-alive thread took


def test_the_keepalive_thread_takes_no_signal(cli, etcd):
    """Every thread but hostlock's main one blocks every signal, so a SIGTERM sent while the main thread is
    between two sigtimedwait() calls waits for it there, instead of killing hostlock in the keep-alive thread
    (the test above can only catch that by luck; this one reads the masks)."""
    script, started, go = gated(cli, "a")
    a = cli.start("run", "--fleet", etcd.url, "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    tasks = sorted(int(t) for t in os.listdir("/proc/%d/task" % a.pid))
    assert len(tasks) >= 2 and tasks[0] == a.pid  # the main thread and at least the keep-alive thread
    for tid in tasks[1:]:
        with open("/proc/%d/task/%d/status" % (a.pid, tid)) as f:
            blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
        for sig in ENDING:
            assert blocked & (1 << (sig - 1)), (tid, sig)
    go.write_text("")
    assert a.wait(timeout=60) == 0


def test_hostlock_killed_kills_the_job_and_the_lease_frees_the_lock(cli, etcd):
    jobpid = cli.tmp / "jobpid"
    a = cli.start("run", "--fleet", etcd.url, "--ttl", "2s", "deploy", "-c",
                  "echo $$ > %s; while :; do sleep 0.02; done" % jobpid, env=controller(cli, "a"))
    pid = int(wait_file(jobpid))
    # The next holder checks that the old job is gone by the time it runs (a zombie counts as gone: it runs
    # nothing; init here may take its time to reap it).
    b = cli.start("run", "--fleet", etcd.url, "-w", "5m", "deploy", "-c",
                  "st=$(cut -d' ' -f3 /proc/%d/stat 2>/dev/null); "
                  "if [ -n \"$st\" ] && [ \"$st\" != Z ]; then echo overlap; exit 98; fi; echo ok" % pid,
                  env=controller(cli, "b"))
    wait_waiters(cli, etcd.url, "deploy", 1)
    os.kill(a.pid, signal.SIGKILL)  # hostlock alone: its watcher kills the job; nobody releases the lock
    wait_until(lambda: not pid_alive(pid), 60, "the job killed by the watcher")
    assert b.wait(timeout=120) == 0, b.stdout.read() + b.stderr.read()  # the lease expired: the lock is free
    assert b.stdout.read() == "ok\n"


def test_a_stopped_hostlock_cannot_keep_its_job_beyond_the_lease(cli, etcd):
    """hostlock SIGSTOPped alone: its job would run on unlocked. The watcher knows the lease's deadline and
    that hostlock is stopped, so it kills the job then, before etcd frees the lock; on resuming, hostlock
    finds its lock lost and exits 79. The new holder's fence is greater."""
    jobpid = cli.tmp / "jobpid"
    a = cli.start("run", "--fleet", etcd.url, "--ttl", "2s", "deploy", "-c",
                  "echo $$ > %s; while :; do sleep 0.02; done" % jobpid, env=controller(cli, "a"))
    pid = int(wait_file(jobpid))
    fence = status(cli, etcd.url, "deploy")["locks"][0]["holders"][0]["fence"]
    os.kill(a.pid, signal.SIGSTOP)  # hostlock alone, not the job: only the watcher can stop the job now
    try:
        wait_until(lambda: not pid_alive(pid), 120, "the watcher to kill the job of a stopped hostlock")
        b = cli.run("run", "--fleet", etcd.url, "-w", "5m", "deploy", "-c", 'echo "$HOSTLOCK_FENCE"',
                    env=controller(cli, "b"), timeout=300)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert b.returncode == 0, b.stderr
    assert int(b.stdout) > fence
    assert a.wait(timeout=60) == 79
    last = a.stderr.read().splitlines()[-1]
    assert "; fence %d; job killed by signal 9 (SIGKILL)" % fence in last, last


def test_a_running_hostlock_stops_its_job_itself_when_the_lease_cannot_be_kept(cli, etcd):
    """etcd stopped under a holder: hostlock (running) gives its job SIGTERM and --kill-after to clean up; the
    watcher, whose deadline passed too, leaves that to hostlock rather than SIGKILL the job at once."""
    got = cli.tmp / "got-term"
    script, started, _go = gated(cli, "a", "trap 'echo term > %s; exit 0' TERM;" % got)
    a = cli.start("run", "--fleet", etcd.url, "--ttl", "4s", "--kill-after", "2s", "deploy", "-c", script,
                  env=controller(cli, "a"))
    wait_file(started)
    etcd.stop()
    assert a.wait(timeout=120) == 79
    assert got.read_text() == "term\n"  # SIGTERM, not the watcher's SIGKILL
    assert "job stopped, exit status 0" in a.stderr.read().splitlines()[-1]


def test_an_unreachable_fleet_is_76_naming_the_endpoint(cli):
    with socket.socket() as s:  # bound, never listening: connections are refused while we keep the port
        s.bind(("127.0.0.1", 0))
        endpoint = "127.0.0.1:%d" % s.getsockname()[1]
        for wait in (["-n"], ["-w", "1s"]):
            r = cli.run("run", "--fleet", "etcd://" + endpoint, *wait, "deploy", "true", env=controller(cli, "a"))
            assert r.returncode == 76, r.stderr
            assert endpoint in r.stderr and r.stderr.count("\n") == 1
        r = cli.run("status", "--fleet", "etcd://" + endpoint)
        assert r.returncode == 76 and endpoint in r.stderr and r.stderr.count("\n") == 1


def test_a_stopped_member_is_76_within_the_wait(cli, etcd):
    etcd.stop()
    r = cli.run("run", "--fleet", etcd.url, "-w", "1s", "deploy", "true", env=controller(cli, "a"))
    assert r.returncode == 76 and etcd.endpoint in r.stderr, r.stderr


@pytest.mark.parametrize("url", ["http://127.0.0.1:2379", "etcd://", "etcd://h:notaport", "etcd://h:1?bogus=1"])
def test_a_bad_url_is_64_and_one_line(cli, url):
    r = cli.run("run", "--fleet", url, "deploy", "true", env=controller(cli, "a"))
    assert r.returncode == 64 and r.stderr.count("\n") == 1 and r.stderr.startswith("hostlock"), r.stderr


def test_status_and_list_show_holders_and_waiters(cli, etcd):
    script, started, go = gated(cli, "a")
    a = cli.start("run", "--fleet", etcd.url, "--label", "nightly", "deploy", "-c", script, env=controller(cli, "a"))
    wait_file(started)
    b = cli.start("run", "--fleet", etcd.url, "-w", "5m", "deploy", "true", env=controller(cli, "b"))
    wait_waiters(cli, etcd.url, "deploy", 1)
    [h] = wait_job_recorded(cli, etcd.url, "deploy")
    doc = status(cli, etcd.url, "deploy")
    assert doc["schema"] == "hostlock.status/1" and doc["fleet"] == etcd.url and doc["directory"] is None
    [lock] = doc["locks"]
    assert (lock["name"], lock["mechanism"], lock["state"], lock["waiters"]) == ("deploy", "etcd", "held", 1)
    assert lock["path"] == etcd.url + "/hostlock/deploy/"
    assert (h["pid"], h["hostname"], h["mode"], h["label"]) == (a.pid, HOST, "exclusive", "nightly")
    assert h["fence"] == int(started.read_text()) and h["user"] and h["acquired_at"]
    assert "sh -c" in h["job_cmdline"]
    names = [lk["name"] for lk in status(cli, etcd.url)["locks"]]
    assert names == ["deploy"]
    r = cli.run("list", "--fleet", etcd.url)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0] == "fleet: %s/hostlock/" % etcd.url
    assert lines[1].split() == ["LOCK", "STATE", "MODE", "HOST", "PID", "USER", "SINCE", "LEASE", "FENCE", "WAIT",
                                "JOB"]
    row = lines[2].split()
    assert row[:5] == ["deploy", "held", "exclusive", HOST, str(a.pid)] and str(h["fence"]) in row
    go.write_text("")
    assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0
    r = cli.run("status", "--fleet", etcd.url, "deploy")
    assert r.returncode == 0 and r.stdout.splitlines()[2].split()[:2] == ["deploy", "free"]


def test_hold_renew_release(cli, etcd):
    env = controller(cli, "a")
    r = cli.run("hold", "deploy", "--lease", "1m", "--fleet", etcd.url, "--label", "release 4.2", env=env)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("hostlock-etcd.") and r.stdout.count("\n") == 1
    # The lease outlives the command: the lock is held with no hostlock process left running.
    r = cli.run("run", "--fleet", etcd.url, "-n", "deploy", "true", env=controller(cli, "b"))
    assert r.returncode == 75 and "release 4.2" in r.stderr
    r = cli.run("renew", "deploy", token, "--lease", "2m", "--fleet", etcd.url, "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "hostlock.lease/1" and doc["fleet"] == etcd.url and doc["lease_expires"]
    r = cli.run("release", "deploy", "-", "--fleet", etcd.url, input=token + "\n", env=env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert cli.run("run", "--fleet", etcd.url, "-n", "deploy", "true", env=env).returncode == 0
    r = cli.run("release", "deploy", token, "--fleet", etcd.url, env=env)
    assert r.returncode == 77 and r.stderr.count("\n") == 1
    # Two shared leases: hold --json reports its own lease's expiry, not the other's.
    short = json.loads(cli.run("hold", "s", "--lease", "1m", "-s", "--fleet", etcd.url, "--json", env=env).stdout)
    long = json.loads(cli.run("hold", "s", "--lease", "5m", "-s", "--fleet", etcd.url, "--json", env=env).stdout)
    again = json.loads(cli.run("hold", "s", "--lease", "2m", "-s", "--fleet", etcd.url, "--json", env=env).stdout)
    assert short["lease_expires"] < again["lease_expires"] < long["lease_expires"]
    r = cli.run("renew", "deploy", "not-a-token", "--fleet", etcd.url, env=env)
    assert r.returncode == 77 and r.stderr.count("\n") == 1
