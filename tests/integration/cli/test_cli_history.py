"""`hostlock history` and `--history` against a real systemd-journald (issue 41), started alone in PID and mount
namespaces of the test's own (tests/journald.py): what happened to a lock, who did it (the sender as the kernel
told journald) and when; another user's forged entries are never shown as root's; a host without a journal
refuses --history (69) before running anything."""

from __future__ import annotations

import json
import os
import subprocess
import time

import journald
import pytest
from cli_support import wait_until
from engine_helpers import LIB, NOBODY

from hostlock.cli.journal import MESSAGE_ID

pytestmark = pytest.mark.skipif(not journald.have_journald(),
                                reason="needs root, systemd-journald, unshare, nsenter and journalctl")


@pytest.fixture
def journal(tmp_path):
    j = journald.Journald(tmp_path / "journald.log")
    yield j
    j.stop()


def _history(journal, cli, *args, count=None):
    """`hostlock history --json ARGS` inside the namespaces; with `count`, waits until that many events are there
    (journald writes what it was sent a moment later: never assume it already has)."""
    def events():
        r = journal.run(cli.argv("history", "--json", *args), env=cli.env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["events"]

    if count is not None:
        seen: list = []

        def enough():
            seen[:] = events()
            return len(seen) >= count

        try:
            # each look is a journalctl run: slow on a busy host
            wait_until(enough, 60, "%d events in the journal" % count)
        except AssertionError:
            raise AssertionError("%d events in the journal, not %d: %s" % (
                len(seen), count, [(e["event"], e["pid"], e["result"]) for e in seen])) from None
    return events()


def test_history_tells_what_happened_to_a_lock_and_who_did_it(journal, cli, tmp_path):
    def run(*a):
        r = journal.run(cli.argv(*a), env=cli.env)
        assert "system journal" not in r.stderr, r.stderr  # no event was lost on the way
        return r

    r = run("run", "--history", "--job", "nightly", "--label", "the nightly dump", "backup", "true")
    assert r.returncode == 0, r.stderr
    holder = subprocess.Popen(journal.argv(cli.argv("run", "--history", "backup", "sleep", "60")), env=cli.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(lambda: any(h["job_pid"] for h in json.loads(run("status", "--json", "backup").stdout)
                               ["locks"][0]["holders"]), 10, "the holder's job")
        assert run("cron", "--name", "backup", "--history", "--", "true").returncode == 0  # skipped: busy
        assert run("run", "--history", "-w", "0.2", "backup", "true").returncode == 75  # the wait runs out
        r = run("run", "--history", "--replace", "--job", "nightly", "backup", "true")  # ends the sleep, runs
        assert r.returncode == 0, r.stderr
        assert holder.wait(10) == 143
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, 9)
            holder.wait()
    # A holder for break --force to signal, whose job ignores SIGTERM: it is still there when break looks again,
    # so break reports it signalled whatever the scheduler does. (A holder that exits between break's SIGTERM and
    # its SIGCONT is reported as "nothing to remove", and no event is recorded: core.holder.end_holders takes the
    # SIGCONT's ESRCH for "exited on its own"; reported to the lead.)
    victim = subprocess.Popen(journal.argv(cli.argv("run", "backup", "sh", "-c", "trap '' TERM; sleep 60")),
                              env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        wait_until(lambda: any(h["job_pid"] for h in json.loads(run("status", "--json", "backup").stdout)
                               ["locks"][0]["holders"]), 10, "the victim's job")
        r = run("break", "backup", "--force")
        assert r.returncode == 75 and "signalled" in r.stdout, r.stdout + r.stderr
    finally:
        os.killpg(victim.pid, 9)
        victim.wait()

    events = _history(journal, cli, "backup", count=10)
    assert [e["event"] for e in events] == [
        "acquired", "released",  # the first run
        "acquired",  # the holder
        "busy", "timeout",  # cron's skip, run's wait that ran out
        "released",  # the holder, ended by --replace (its job got SIGTERM: exit 143) ...
        "replaced", "acquired", "released",  # ... by the run that then ran
        "broken",  # break --force signalled the last holder
    ], events
    first, first_end = events[0], events[1]
    assert first["job"] == "nightly" and first["label"] == "the nightly dump" and first["command"] == "true"
    assert first["user"] == "root" and first["uid"] == 0 and first["forged"] is False
    assert first["wait"] is not None and first["wait"] >= 0 and first["pid"] == first_end["pid"]
    assert first_end["result"] == "ok" and first_end["exit_status"] == 0 and first_end["hold"] >= 0
    assert time.time() - 120 < first["time"] <= time.time()
    ended = [e for e in events if e["event"] == "released" and e["exit_status"] == 143]
    assert len(ended) == 1 and ended[0]["result"] == "failed"
    (replaced,) = [e for e in events if e["event"] == "replaced"]
    assert replaced["holder_pid"] == ended[0]["pid"]  # names the run it ended (the namespace's pids)
    (broken,) = [e for e in events if e["event"] == "broken"]
    assert broken["holder_pid"] is not None and broken["result"] == "ended" and broken["holder_job_pid"]

    r = run("history", "backup")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["TIME", "LOCK", "EVENT", "USER", "PID", "JOB", "DETAIL"]
    assert any(" replaced " in line and "holder pid" in line for line in lines), r.stdout
    assert len(_history(journal, cli, "backup", "-n", "3")) == 3  # the newest three
    assert _history(journal, cli, "another") == []


SEND = r"""
import socket, sys
fields = dict(a.split("=", 1) for a in sys.argv[1:])
data = "".join("%s=%s\n" % kv for kv in fields.items()).encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(data, "/run/systemd/journal/socket")
"""


def test_another_users_forged_entry_is_never_shown_as_roots(journal, cli):
    def run(*a: str) -> subprocess.CompletedProcess:
        return journal.run(cli.argv(*a), env=cli.env)

    assert run("run", "--history", "backup", "true").returncode == 0
    fields = ["MESSAGE=lock backup released", "MESSAGE_ID=" + MESSAGE_ID, "HOSTLOCK_EVENT=released",
              "HOSTLOCK_LOCK=backup", "HOSTLOCK_RESULT=ok", "HOSTLOCK_JOB=backup"]
    as_nobody = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", "/usr/bin/python3", "-I",
                 "-c", SEND]
    # Claims root (its own field, and journald's trusted ones, which journald drops from a sender) ...
    r = journal.run(as_nobody + fields + ["HOSTLOCK_UID=0", "_UID=0", "_PID=1"])
    assert r.returncode == 0, r.stderr
    # ... and one that says who it is: its sender's, not forged, and still not root's.
    r = journal.run(as_nobody + fields + ["HOSTLOCK_UID=%d" % NOBODY])
    assert r.returncode == 0, r.stderr
    events = _history(journal, cli, "backup", count=4)
    forged = [e for e in events if e["claimed_uid"] == 0 and e["uid"] != 0]
    honest = [e for e in events if e["claimed_uid"] == NOBODY]
    assert len(forged) == 1 and len(honest) == 1, events
    assert forged[0]["uid"] == NOBODY and forged[0]["user"] == "nobody" and forged[0]["forged"] is True
    assert forged[0]["pid"] != 1  # journald's _PID: the sender, whatever the entry said
    assert honest[0]["uid"] == NOBODY and honest[0]["forged"] is False
    roots = [e for e in events if e["user"] == "root"]
    assert len(roots) == 2 and all(e["claimed_uid"] == 0 and not e["forged"] for e in roots)
    assert [e["uid"] for e in _history(journal, cli, "backup", "--user", "root")] == [0, 0]  # filtered by _UID
    r = run("history", "backup")
    rows = [line for line in r.stdout.splitlines() if "FORGED" in line]
    assert len(rows) == 1 and " nobody " in rows[0] and " root " not in rows[0], r.stdout
    assert "claims uid 0, sent by uid 65534" in rows[0]


def test_a_host_without_a_journal_refuses_history_and_says_so(cli, tmp_path):
    """Private, empty /run (no journald socket), journalctl hidden: --history exits 69 before running anything,
    `history` exits 69 with one line; a run without --history is not affected."""
    marker = tmp_path / "ran"
    script = r"""
set -e
mount --make-rprivate /
mount -t tmpfs tmpfs /run
"$@"
"""

    def inside(*argv, hide_journalctl=False):
        pre = "mount --bind /dev/null /usr/bin/journalctl;" if hide_journalctl else ""
        return subprocess.run(["unshare", "--mount", "sh", "-c", script.replace('"$@"', pre + ' "$@"'), "sh",
                               *argv], capture_output=True, text=True, env=cli.env, timeout=60, check=False)

    r = inside(*cli.argv("run", "--history", "L", "touch", str(marker)))
    assert r.returncode == 69 and r.stderr.count("\n") == 1 and "no system journal" in r.stderr, r.stderr
    assert not marker.exists()
    env_run = inside("env", "HOSTLOCK_HISTORY=journal", *cli.argv("cron", "--name", "L", "--", "touch", str(marker)))
    assert env_run.returncode == 69 and not marker.exists(), env_run.stderr
    bad = inside("env", "HOSTLOCK_HISTORY=yes", *cli.argv("cron", "--name", "L", "--", "true"))
    assert bad.returncode == 64, bad.stderr
    assert inside(*cli.argv("run", "L", "touch", str(marker))).returncode == 0 and marker.exists()
    r = inside(*cli.argv("history"), hide_journalctl=True)
    assert r.returncode == 69 and "journalctl not found" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = inside(*cli.argv("break", "L"))  # break records only where there is a journal: nothing to say here
    assert r.returncode == 0 and r.stderr == "", r.stderr


assert LIB
