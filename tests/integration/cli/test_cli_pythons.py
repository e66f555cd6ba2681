"""The command on every interpreter the library supports (3.8-3.13), installed the role's way: the hand
parser, fork/exec, PR_SET_PDEATHSIG through _ctypes, sigtimedwait, the admin commands' argparse."""

import glob
import json
import os
import signal
import subprocess

import pytest
from cli_support import make_launcher, pid_alive, wait_until

VERSIONS = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"]


def interpreter(version):
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    found += [p for p in (f"/usr/bin/python{version}",) if os.path.exists(p)]
    return found[-1] if found else None


@pytest.mark.parametrize("version", VERSIONS)
def test_the_command_on(version, tmp_path):
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    hl = str(make_launcher(tmp_path, python))
    env = {"PATH": "/usr/bin:/bin", "HOSTLOCK_DIR": str(tmp_path)}

    def run(*args):
        return subprocess.run([hl, *args], check=False, capture_output=True, text=True, env=env, timeout=30)

    r = run("run", "a", "-c", "echo ok; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "ok\n", "")
    assert run("run", "a", "sh", "-c", "kill -TERM $$").returncode == 143
    assert run("cron", "--", "sh", "-c", "echo quiet").stdout == ""
    # a holder killed with SIGKILL takes its job along
    pidfile = tmp_path / "pid"
    p = subprocess.Popen([hl, "run", "b", "-c", f"echo $$ > {pidfile}; exec sleep 60"], env=env,
                         start_new_session=True)
    wait_until(lambda: pidfile.exists() and pidfile.read_text().endswith("\n"), 10, "the job")
    job = int(pidfile.read_text())
    r = run("status", "--json", "b")
    assert json.loads(r.stdout)["locks"][0]["holders"][0]["job_pid"] == job
    assert run("run", "-n", "b", "true").returncode == 75
    p.send_signal(signal.SIGKILL)
    p.wait()
    wait_until(lambda: not pid_alive(job), 5, "the job to die with hostlock")
    assert run("run", "-n", "b", "true").returncode == 0
    # hostlock flock and status --path (flock(2), OFD --fcntl, the SIGALRM-bounded wait, /proc parsing)
    lock = tmp_path / "f.lock"
    h = subprocess.Popen([hl, "flock", "-s", str(lock), "sh", "-c", "echo held; exec cat"], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert h.stdout.readline() == "held\n"
    assert run("flock", "-w", "0.1", str(lock), "true").returncode == 1
    assert run("flock", "-s", "-n", str(lock), "-c", "exit 5").returncode == 5
    assert run("flock", "--fcntl", "-n", str(lock), "true").returncode == 0
    r = run("status", "--path", str(lock), "--json")
    assert [lk["mode"] for lk in json.loads(r.stdout)["locks"]] == ["shared"]
    assert run("run", "-n", "-E", "9", "--path", str(lock), "true").returncode == 9
    h.stdin.close()
    assert h.wait(timeout=30) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_fleet_locks_on(version, tmp_path, etcd):
    """--fleet on every interpreter: the etcd client (http.client, CLOCK_BOOTTIME), the keep-alive thread's
    signal mask, the supervisor woken by pthread_kill when the lock is lost (exit 79), the admin commands."""
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    hl = str(make_launcher(tmp_path, python))
    env = {"PATH": "/usr/bin:/bin", "HOSTLOCK_DIR": str(tmp_path), "HOSTLOCK_FLEET": etcd.url}

    def run(*args):
        return subprocess.run([hl, *args], check=False, capture_output=True, text=True, env=env, timeout=60)

    r = run("run", "f", "-c", 'echo "$HOSTLOCK_FENCE $HOSTLOCK_FLEET"; exit 3')
    assert (r.returncode, r.stdout.split()[1], r.stderr) == (3, etcd.url, "")
    ready = tmp_path / "ready"
    p = subprocess.Popen([hl, "run", "f", "-c", f"echo > {ready}; exec sleep 60"], env=env, start_new_session=True,
                         stderr=subprocess.PIPE, text=True)
    wait_until(ready.exists, 30, "the job")
    assert run("run", "-n", "f", "true").returncode == 75
    assert json.loads(run("status", "--json", "f").stdout)["locks"][0]["holders"][0]["pid"] == p.pid
    assert run("break", "--force", "f").returncode == 0
    assert p.wait(timeout=60) == 79
    assert "job stopped, killed by signal 15 (SIGTERM)" in p.stderr.read()


@pytest.mark.parametrize("version", VERSIONS)
def test_fleet_waiters_on(version, tmp_path, etcd):
    """Issue 24 on every interpreter: a SIGTERMed fleet waiter takes its key with it (the signal trap), the
    waiter behind is served at the handoff (the per-key watch), and a fleet lock's --kill-after is TTL/4."""
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    hl = str(make_launcher(tmp_path, python))
    env = {"PATH": "/usr/bin:/bin", "HOSTLOCK_DIR": str(tmp_path)}
    run = [hl, "run", "--fleet", etcd.url, "--ttl", "60s"]
    go = tmp_path / "go"

    def keys():
        return etcd.etcdctl("get", "--prefix", "hostlock/deploy/", "--keys-only").stdout.split()

    def start(*args):
        return subprocess.Popen([*run, *args], env=env, start_new_session=True)

    a = start("deploy", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")
    wait_until(lambda: len(keys()) == 1, 30, "the holder")
    w1 = start("-w", "5m", "deploy", "true")
    wait_until(lambda: len(keys()) == 2, 30, "w1 queued")
    w2 = start("-w", "5m", "deploy", "true")
    wait_until(lambda: len(keys()) == 3, 30, "w2 queued")
    w1.send_signal(signal.SIGTERM)
    assert w1.wait(timeout=30) == 143
    assert len(keys()) == 2  # gone the moment it exited: not left for its 60 s TTL
    go.write_text("")
    assert a.wait(timeout=30) == 0 and w2.wait(timeout=30) == 0
    r = subprocess.run([hl, "run", "--fleet", etcd.url, "--ttl", "4s", "--kill-after", "3s", "deploy", "true"],
                       check=False, capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 64 and "--kill-after 3s" in r.stderr
