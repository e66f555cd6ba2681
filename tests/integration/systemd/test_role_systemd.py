"""hostlock.core.systemd against a real systemd: the role installs units into a booted systemd 252, their timers fire,
and jobs that share a lock never overlap: one skips (not a unit failure, unless on_conflict says fail), one waits,
the journal has the job's and hostlock's lines; a time limit and `systemctl stop` end runs cleanly; a drop-in puts an
existing service under a lock.

One boot and one role run serve the module (the tests use different units and locks, or run in order on `pair`).
Every wait is on an event (a unit property, a journal line, a mark file, a lock state) under a deadline that only
bounds a hang; the timers fire on the next even second once a test starts them.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from systemd_support import HOSTLOCK, boot, install_hostlock, needs_systemd, play

pytestmark = needs_systemd

MARKS = "/var/tmp/hl/marks"
# The overlap detector: `hl-mark NAME [GATE]` marks its start and end, waits for GATE if given, and records an
# OVERLAP if another marked job is inside at the same time (mkdir is atomic).
MARK_SCRIPT = textwrap.dedent("""\
    #!/bin/sh
    d=/var/tmp/hl
    mkdir "$d/inside" 2>/dev/null || echo "OVERLAP $1" >> "$d/marks"
    echo "start $1 $(id -un)" >> "$d/marks"
    echo "$1: started as $(id -un)"
    if [ -n "${2:-}" ]; then while [ ! -e "$2" ]; do sleep 0.05; done; fi
    echo "end $1" >> "$d/marks"
    rmdir "$d/inside"
    """)
# A service this role did not write, to wrap with a drop-in.
LEGACY = textwrap.dedent("""\
    [Unit]
    Description=A service the role did not write
    [Service]
    Type=oneshot
    ExecStart=-/bin/sh -c 'echo "legacy ran as %n"'
    """)
EVERY_2S = "*-*-* *:*:0/2"
PLAYBOOK = textwrap.dedent("""\
    - hosts: all
      gather_facts: false
      tasks:
        - ansible.builtin.include_role:
            name: hostlock.core.systemd
          vars:
            hostlock_systemd_units:
              # Four jobs on one lock; the tests start their timers (enabled: false leaves them stopped).
              - {name: alpha, lock: pair, command: /usr/local/bin/hl-mark alpha /var/tmp/hl/gate-alpha,
                 verbose: true, schedule: "%(every)s", accuracy: 10ms, enabled: false}
              - {name: beta, lock: pair, command: /usr/local/bin/hl-mark beta,
                 schedule: "%(every)s", accuracy: 10ms, enabled: false}
              - {name: gamma, lock: pair, command: [/usr/local/bin/hl-mark, gamma], wait: 5m, user: hlsd,
                 schedule: "%(every)s", accuracy: 10ms, enabled: false}
              - {name: delta, lock: pair, command: /usr/local/bin/hl-mark delta, on_conflict: fail,
                 schedule: "%(every)s", accuracy: 10ms, enabled: false}
              # Started by hand.
              # verbose: without it `hostlock run` ends a job at its time limit silently (exit 124, as timeout(1)).
              - {name: capped, command: echo capped-started; exec sleep 300, max_runtime: 1s, kill_after: 1s,
                 verbose: true, schedule: yearly}
              - {name: stopme, command: echo stopme-started; exec sleep 300, schedule: yearly}
              # Its figures for node_exporter and its history in the journal (the role's keys, not extra_args).
              - {name: metered, lock: meter-lock, command: echo metered-ran, metrics_dir: /var/lib/hl-metrics,
                 history: true, schedule: yearly}
            hostlock_systemd_dropins:
              - {unit: legacy, lock: legacy-lock}
    """) % {"every": EVERY_2S}


@pytest.fixture(scope="module")
def sd(tmp_path_factory, ansible_dirs):
    sd = boot(tmp_path_factory.mktemp("systemd"))
    try:
        install_hostlock(sd, members=("hlsd",))
        sd.run("install", "-d", "-m", "1777", "/var/tmp/hl")
        sd.run("install", "-m", "0666", "/dev/null", MARKS)  # root's, so that protected_regular lets hlsd append
        sd.put("/usr/local/bin/hl-mark", MARK_SCRIPT, mode=0o755)
        sd.run("install", "-d", "-m", "0755", "/var/lib/hl-metrics")  # root's, as node_exporter's textfile directory
        sd.put("/etc/systemd/system/legacy.service", LEGACY)
        sd.run("systemctl", "daemon-reload")
        run = play(sd, ansible_dirs, PLAYBOOK)
        assert run.returncode == 0, run.stdout + run.stderr
        yield sd
    finally:
        sd.stop()


def _props(sd, unit: str, *names: str) -> dict[str, str]:
    out = sd.run("systemctl", "show", "--property=" + ",".join(names), unit).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _marks(sd) -> list[str]:
    return sd.read(MARKS).splitlines()


def _lock(sd, name: str) -> dict:
    return json.loads(sd.run(HOSTLOCK, "status", "--json", "--dir", "/run/hostlock", name).stdout)["locks"][0]


def _messages(sd, unit: str) -> list[str]:
    return [e.get("MESSAGE", "") for e in sd.journal("-u", unit)]


def _fire(sd, name: str, until, what: str):
    """Start NAME's timer, wait until `until()` returns something true (read while the timer runs: systemd unloads
    a stopped timer and then its inactive service, and with them what they remember), stop the timer, return it."""
    sd.run("systemctl", "start", name + ".timer")
    try:
        return sd.wait_until(until, what)
    finally:
        sd.run("systemctl", "stop", name + ".timer")


# systemd's journal entries for a unit's end (sd-messages.h): its result outlives the unit's unloading.
UNIT_SUCCESS = "7ad2d189f7e94e70a38c781354912448"
UNIT_FAILURE_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"


def _results(sd, unit: str) -> list[str]:
    """How each run of `unit` ended, oldest first: 'success' or systemd's failure result (exit-code, ...)."""
    return [e.get("UNIT_RESULT", "success") for e in sd.journal("-u", unit)
            if e.get("MESSAGE_ID") in (UNIT_SUCCESS, UNIT_FAILURE_RESULT) and e.get("UNIT") == unit]


def _ended(sd, unit: str):
    """The run's properties once its main process has exited (ExecMainExitTimestamp set), else None."""
    p = _props(sd, unit, "ActiveState", "Result", "ExecMainStatus", "ExecMainExitTimestampMonotonic")
    return p if p["ExecMainExitTimestampMonotonic"] != "0" and p["ActiveState"] != "activating" else None


def test_the_units_pass_systemd_analyze_verify(sd):
    units = ["/etc/systemd/system/%s.%s" % (n, k) for n in ("alpha", "gamma", "delta", "capped")
             for k in ("service", "timer")]
    r = sd.run("systemd-analyze", "verify", *units, "/etc/systemd/system/legacy.service", check=False)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_jobs_sharing_a_lock_never_overlap_one_skips_one_waits(sd):
    # alpha's timer fires; its job takes the lock `pair` and holds it until the test opens its gate.
    # (A stopped timer forgets when it last fired: that is read while it runs.)
    _fire(sd, "alpha", lambda: "start alpha root" in _marks(sd)
          and _props(sd, "alpha.timer", "LastTriggerUSecMonotonic")["LastTriggerUSecMonotonic"] != "0",
          "alpha's timer to start its job")
    assert _props(sd, "alpha.service", "ActiveState")["ActiveState"] == "activating"

    # beta finds the lock busy and is skipped: exit 75, which the unit counts as success; the journal names the holder.
    beta = _fire(sd, "beta", lambda: _ended(sd, "beta.service"), "beta's run to end")
    assert (beta["ActiveState"], beta["Result"], beta["ExecMainStatus"]) == ("inactive", "success", "75")
    busy = [m for m in _messages(sd, "beta.service") if m.startswith("hostlock: lock pair is busy")]
    assert busy and "hl-mark alpha" in busy[0], _messages(sd, "beta.service")

    # delta asked for a failure: the unit fails with 75, and its timer goes on (systemd keeps timers waiting).
    delta = _fire(sd, "delta", lambda: _props(sd, "delta.timer", "ActiveState")["ActiveState"] == "active"
                  and _ended(sd, "delta.service"), "delta to fail, its timer still on")
    assert (delta["ActiveState"], delta["Result"], delta["ExecMainStatus"]) == ("failed", "exit-code", "75")
    sd.run("systemctl", "reset-failed", "delta.service")

    # gamma (another user, in the lock group) waits for the lock: the service stays activating, hostlock counts it.
    _fire(sd, "gamma", lambda: _lock(sd, "pair")["waiters"] == 1
          and _props(sd, "gamma.service", "ActiveState")["ActiveState"] == "activating", "gamma to wait for the lock")
    assert "start gamma hlsd" not in _marks(sd)

    # alpha ends; gamma gets the lock and runs, after alpha.
    sd.run("touch", "/var/tmp/hl/gate-alpha")
    for unit in ("alpha.service", "gamma.service"):
        sd.wait_until(lambda u=unit: _results(sd, u), unit + " to end")
        assert _results(sd, unit) == ["success"]
    assert _marks(sd) == ["start alpha root", "end alpha", "start gamma hlsd", "end gamma"]
    assert _results(sd, "beta.service")[:1] == ["success"] and _results(sd, "delta.service")[:1] == ["exit-code"]

    # The journal of a unit has the job's output and hostlock's own lines (alpha is verbose), under its name.
    alpha = sd.journal("-u", "alpha.service", "SYSLOG_IDENTIFIER=alpha")
    text = [e["MESSAGE"] for e in alpha]
    assert "alpha: started as root" in text, text
    assert any(m.startswith("hostlock: got exclusive lock pair") for m in text), text
    assert any(m.startswith("hostlock: job exit status 0") for m in text), text
    assert {e["_SYSTEMD_UNIT"] for e in alpha} == {"alpha.service"}
    assert "gamma: started as hlsd" in _messages(sd, "gamma.service")
    assert _lock(sd, "pair")["state"] == "free"


def test_max_runtime_fails_the_unit_with_124_and_says_why(sd):
    sd.run("systemctl", "start", "--no-block", "capped.service")
    sd.wait_until(lambda: _props(sd, "capped.service", "ActiveState")["ActiveState"] == "failed", "capped to fail")
    assert _props(sd, "capped.service", "Result", "ExecMainStatus") == {"Result": "exit-code", "ExecMainStatus": "124"}
    text = _messages(sd, "capped.service")
    assert "capped-started" in text, text
    assert any(m.startswith("hostlock: job timed out, killed by signal 15 (SIGTERM)") for m in text), text
    assert _lock(sd, "capped")["state"] == "free"
    sd.run("systemctl", "reset-failed", "capped.service")


def test_systemctl_stop_ends_the_job_frees_the_lock_and_is_no_failure(sd):
    sd.run("systemctl", "start", "--no-block", "stopme.service")
    holder = sd.wait_until(lambda: (_lock(sd, "stopme")["holders"] or [{}])[0].get("job_pid"),
                           "stopme to hold its lock")
    sd.run("systemctl", "stop", "stopme.service")  # returns once the unit is down
    assert _props(sd, "stopme.service", "ActiveState", "Result") == {"ActiveState": "inactive", "Result": "success"}
    assert _lock(sd, "stopme")["state"] == "free"
    assert not sd.exists("/proc/%d" % holder)  # pids inside are the namespace's own: the job is gone


def test_a_dropin_puts_an_existing_service_under_the_lock(sd):
    assert "path=%s ;" % HOSTLOCK in _props(sd, "legacy.service", "ExecStart")["ExecStart"]
    # Someone holds legacy-lock (a process inside the namespaces, outside systemd's units).
    holder = subprocess.Popen(sd.argv(HOSTLOCK, "run", "--dir", "/run/hostlock", "legacy-lock", "--", "/bin/sh", "-c",
                                      "touch /run/held; while [ ! -e /run/release ]; do sleep 0.05; done"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        sd.wait_until(lambda: sd.exists("/run/held"), "the holder to take legacy-lock")
        sd.run("systemctl", "start", "legacy.service")  # a oneshot: returns when its run has ended
    finally:
        sd.run("touch", "/run/release")
        out = holder.communicate(timeout=60)[0]
    assert holder.returncode == 0, out
    sd.run("systemctl", "start", "legacy.service")
    # The skipped run ended well; only the second ran the command, whose journal identifier is still its
    # program's (sh), not hostlock's.
    assert _results(sd, "legacy.service") == ["success", "success"]
    entries = sd.journal("-u", "legacy.service")
    busy = [e for e in entries if e.get("MESSAGE", "").startswith("hostlock: lock legacy-lock is busy")]
    ran = [e for e in entries if e.get("MESSAGE") == "legacy ran as legacy.service"]
    assert len(busy) == 1 and len(ran) == 1, [e.get("MESSAGE") for e in entries]
    assert busy[0]["_SYSTEMD_INVOCATION_ID"] != ran[0]["_SYSTEMD_INVOCATION_ID"]
    assert ran[0]["SYSLOG_IDENTIFIER"] == "sh"


def test_a_units_metrics_and_history_keys_reach_its_runs(sd):
    """metrics_dir and history: the run keeps the unit's figures under its own name, and its lock events are in
    the journal where `hostlock history` reads them."""
    sd.run("systemctl", "start", "metered.service")  # oneshot: returns once the run has ended
    assert _props(sd, "metered.service", "Result")["Result"] == "success"
    figures = sd.read("/var/lib/hl-metrics/hostlock-job-metered.prom")
    assert 'hostlock_job_runs_total{job="metered",result="ok"} 1' in figures, figures
    assert 'hostlock_job_last_exit_code{job="metered"} 0' in figures, figures
    events = json.loads(sd.run(HOSTLOCK, "history", "--json", "meter-lock").stdout)
    kinds = [e.get("event") for e in (events if isinstance(events, list) else events.get("events", []))]
    assert "acquired" in kinds and "released" in kinds, events


def test_a_misspelt_role_variable_is_named_and_nothing_changes(sd, ansible_dirs):
    run = play(sd, ansible_dirs, textwrap.dedent("""\
        - hosts: all
          gather_facts: false
          tasks:
            - ansible.builtin.include_role:
                name: hostlock.core.systemd
              vars:
                hostlock_systemd_unit: [{name: typo, command: "true", schedule: daily}]
        """))
    assert run.returncode == 2, run.stdout
    assert "unknown variable hostlock_systemd_unit " in run.stdout, run.stdout
    assert not sd.exists("/etc/systemd/system/typo.service")
