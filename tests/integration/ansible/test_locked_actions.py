"""hostlock.core.locked around tasks with their own action plugin (issue 23 item 1): one task, one line.

Real ansible-playbook, local and over the real sshd. The wrapped script and raw command try the lock
themselves while they run (a host job of that name would be refused: exit 75), and the script sees the
lease's in-flight mark in its environment (what a killed run's lease waits for)."""

from __future__ import annotations

import base64
import json

import pytest

PROBE = """#!/bin/sh
lock=$1; dir=$2; shift 2
"$@" run -n -d "$dir" "$lock" true; echo "probe-rc=$?"
env | grep -c '^HOSTLOCK_LEASE_' | sed 's/^/marks=/'
"""

# copy's validate command, run by the copy module: the task's step after its first (the stat that took the lease)
VPROBE = """#!/bin/sh
out=$2; lock=$3; dir=$4; shift 4
{
  "$@" run -n -d "$dir" "$lock" true; echo "probe-rc=$?"
  env | grep -c '^HOSTLOCK_LEASE_' | sed 's/^/marks=/'
} >"$out" 2>&1
"""


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_locked_takes_any_task_with_its_action_plugin_under_the_host_lock(ansible, engine, target):
    lock = f"actions-{target}"
    (ansible.work / "greeting.j2").write_text("hello {{ inventory_hostname }}\n")
    probe = ansible.work / "probe.sh"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    vprobe = ansible.work / "vprobe.sh"
    vprobe.write_text(VPROBE)
    vprobe.chmod(0o755)
    remote_tmp = ansible.work / f"remote-tmp-{target}"
    run = ansible.play("locked_actions.yml", extra_vars=dict(target=target, lock=lock),
                       ANSIBLE_REMOTE_TMP=str(remote_tmp))
    assert run.rc == 0, run.out
    # Every task's temporary directory is gone (removed with the lease's release, in the same command)
    assert remote_tmp.is_dir() and not list(remote_tmp.iterdir()), list(remote_tmp.iterdir())
    res = json.loads((ansible.work / f"{target}-results.json").read_text())
    assert (ansible.work / f"{target}-greeting.txt").read_text() == f"hello {target}\n"
    assert (ansible.work / f"{target}-copied.txt").read_text() == f"copied {target}\n"
    fetched = list((ansible.work / "fetched" / target).rglob(f"{target}-copied.txt"))
    assert len(fetched) == 1 and fetched[0].read_text() == f"copied {target}\n", fetched
    for task in ("templated", "copied", "fetched", "scripted", "rawed"):
        info = res[task]["hostlock"]
        assert info["event"] == "locked" and info["taken"] and info["released"], (task, res[task])
        assert res[task].get("changed") is not None, (task, res[task])
    assert res["templated"]["changed"] and res["copied"]["changed"]
    assert "probe-rc=75" in res["scripted"]["stdout"], res["scripted"]  # the lock was held while it ran
    assert "marks=1" in res["scripted"]["stdout"], res["scripted"]  # and the work carried the lease's mark
    assert "rc=75" in res["rawed"]["stdout"], res["rawed"]
    # The lease taken in the first step's module run (stat) still holds in the next one, which carries its mark.
    for kind in ("template", "copy"):
        seen = (ansible.work / f"{target}-vprobe-{kind}.txt").read_text()
        assert "probe-rc=75" in seen and "marks=1" in seen, (kind, seen)
    assert engine.status(lock, directory=str(ansible.lockdir)).state == "free"


def test_an_unknown_option_names_the_task_as_written(ansible):
    playbook = ansible.work / "unknown.yml"
    playbook.write_text("- hosts: loc\n  gather_facts: false\n  tasks:\n    - name: Misspelled\n"
                        "      hostlock.core.locked:\n        name: x\n        timout: 5\n"
                        "        task:\n          ansible.builtin.ping:\n")
    run = ansible.play(str(playbook))
    assert run.rc != 0, run.out
    assert "Unsupported parameters for (hostlock.core.locked) module: timout" in run.out, run.out
    assert "ansible_collections.hostlock" not in run.out, run.out


SELF_WAIT = """\
- name: A locked task behind a lease of its own run
  hosts: loc
  gather_facts: false
  tasks:
    - name: Take a lease on the name
      hostlock.core.lock:
        name: self-wait
        lease: 10m
        directory: "{{ lockdir }}"
      register: lease
      no_log: true

    - name: Copy under the same name, which the run's own lease holds
      hostlock.core.locked:
        name: self-wait
        directory: "{{ lockdir }}"
        timeout: 10m
        task:
          ansible.builtin.copy:
            content: "never\\n"
            dest: "{{ workdir }}/never.txt"
            mode: "0644"
      register: behind
      ignore_errors: true  # noqa: ignore-errors - the test reads the failure

    - name: Release the lease
      hostlock.core.lock:
        name: self-wait
        state: released
        token: "{{ lease.token }}"
        directory: "{{ lockdir }}"

    - name: Say what the copy task got
      ansible.builtin.debug:
        msg: "BEHIND {{ behind.msg }}"
"""


def test_a_task_with_an_action_plugin_never_waits_for_a_lease_of_its_own_run(ansible):
    """The lease path waits for other hosts' locked tasks, but a lease of the run ends only with a later task:
    waiting for it could never end, so it fails at once naming the holder (timeout 10m would hang)."""
    playbook = ansible.work / "self_wait.yml"
    playbook.write_text(SELF_WAIT)
    run = ansible.play(str(playbook))
    assert run.rc == 0, run.out
    assert "held by this same playbook run" in run.out, run.out
    assert not (ansible.work / "never.txt").exists()


BUSY = """\
- name: Tasks with their own action plugin while another holder has the lock
  hosts: "{{ target }}"
  gather_facts: false
  tasks:
    - name: Template with timeout 0 (its first step, the stat, must not run either)
      hostlock.core.locked:
        name: busy
        directory: "{{ lockdir }}"
        timeout: 0
        task:
          ansible.builtin.template:
            src: "{{ workdir }}/greeting.j2"
            dest: "{{ workdir }}/{{ target }}-busy.txt"
            mode: "0644"
      register: refused
      ignore_errors: true  # noqa: ignore-errors - the test reads the failure

    - name: The same with on_conflict skip
      hostlock.core.locked:
        name: busy
        directory: "{{ lockdir }}"
        timeout: 0
        on_conflict: skip
        task:
          ansible.builtin.copy:
            content: "never\\n"
            dest: "{{ workdir }}/{{ target }}-busy.txt"
            mode: "0644"
      register: skipped

    - name: Copy in check mode reports the holder and writes nothing
      hostlock.core.locked:
        name: busy
        directory: "{{ lockdir }}"
        task:
          ansible.builtin.copy:
            content: "never\\n"
            dest: "{{ workdir }}/{{ target }}-busy.txt"
            mode: "0644"
      check_mode: true
      register: checked

    - name: Save what the tasks returned
      ansible.builtin.copy:
        content: "{{ dict(refused=refused, skipped=skipped, checked=checked) | to_json }}"
        dest: "{{ workdir }}/{{ target }}-busy.json"
        mode: "0644"
      delegate_to: localhost
      vars:
        ansible_connection: local
        ansible_python_interpreter: "{{ ansible_playbook_python }}"
"""


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_a_busy_lock_stops_the_task_before_its_first_step_and_check_mode_takes_nothing(ansible, engine, target):
    (ansible.work / "greeting.j2").write_text("hello\n")
    playbook = ansible.work / "busy.yml"
    playbook.write_text(BUSY)
    with engine.Lock("busy", directory=str(ansible.lockdir), label="the other holder"):
        run = ansible.play(str(playbook), extra_vars=dict(target=target))
        assert run.rc == 0, run.out
        res = json.loads((ansible.work / f"{target}-busy.json").read_text())
        assert not (ansible.work / f"{target}-busy.txt").exists()
        refused = res["refused"]
        assert refused["failed"] and "did not run" in refused["msg"], refused
        assert refused["hostlock"]["event"] == "conflict" and not refused["hostlock"]["taken"], refused
        assert "the other holder" in json.dumps(refused["hostlock"]["holders"]), refused
        assert res["skipped"]["skipped"] and res["skipped"]["hostlock"]["event"] == "conflict", res["skipped"]
        checked = res["checked"]
        assert checked["hostlock"]["event"] == "check" and checked["hostlock"]["free"] is False, checked
        assert checked.get("changed") is True, checked  # what the copy would do
        # nothing of ours is left on the lock: only the other holder
        holders = engine.status("busy", directory=str(ansible.lockdir)).holders
        assert [h.label for h in holders] == ["the other holder"], holders
    assert engine.status("busy", directory=str(ansible.lockdir)).state == "free"


# (id, the wrapped task's YAML under `task:` (or the whole locked args, for SHAPES), what it must give)
WRITTEN_AS_ANSIBLE_READS_IT = """\
- hosts: loc
  gather_facts: false
  tasks:
    - name: Free-form command whose own options are words of the string, as Ansible reads them
      hostlock.core.locked:
        name: words
        directory: "{{ lockdir }}"
        task:
          ansible.builtin.command: "touch {{ workdir }}/ff-made creates=/etc/passwd chdir={{ workdir }}"
      register: freeform

    - name: Free-form shell with chdir= and removes=
      hostlock.core.locked:
        name: words
        directory: "{{ lockdir }}"
        task:
          ansible.builtin.shell: "pwd > here.txt chdir={{ workdir }} removes=/etc/passwd"
      register: shellform

    - name: key=value words for a module that is not free-form
      hostlock.core.locked:
        name: words
        directory: "{{ lockdir }}"
        task:
          ansible.builtin.file: "path={{ workdir }}/kv-made state=touch mode=0644"
      register: kv

    - name: Say what they gave
      ansible.builtin.debug:
        msg: "GOT {{ {'freeform': freeform.changed, 'freeform_rc': freeform.rc, 'shell_rc': shellform.rc,
          'kv': kv.changed} | to_json | b64encode }}"
"""


def test_string_args_are_read_as_the_task_itself_would_read_them(ansible):
    """`command: "cmd creates=X chdir=D"` and `file: "path=X state=touch"`: Ansible takes the options out of
    the string; wrapped, they were passed whole as `_raw_params` (the command ran with `creates=...` as an
    argument; file said "missing required arguments: path")."""
    playbook = ansible.work / "words.yml"
    playbook.write_text(WRITTEN_AS_ANSIBLE_READS_IT)
    run = ansible.play(str(playbook))
    assert run.rc == 0, run.out
    got = json.loads(base64.b64decode(run.out.split("GOT ", 1)[1].split('"', 1)[0]))
    assert got == {"freeform": False, "freeform_rc": 0, "shell_rc": 0, "kv": True}, run.out
    assert not (ansible.work / "ff-made").exists()  # creates= held: skipped, as unwrapped
    assert (ansible.work / "here.txt").read_text().strip() == str(ansible.work)  # chdir= honoured
    assert (ansible.work / "kv-made").exists()


SHAPES = [
    ("include-vars", "name: s\n        task:\n          ansible.builtin.include_vars: {file: /dev/null}",
     "ansible.builtin.include_vars runs on the controller"),
    ("wait-for-connection", "name: s\n        task:\n          ansible.builtin.wait_for_connection: {}",
     "ansible.builtin.wait_for_connection runs on the controller"),
    ("misspelt-name", "nmae: s\n        task:\n          ansible.builtin.ping: {}",
     "Unsupported parameters for (hostlock.core.locked) module: nmae"),
    ("task-list", "name: s\n        task:\n          - ansible.builtin.ping: {}", "task must be a mapping"),
    ("task-string", "name: s\n        task: module=ansible.builtin.command args=touch", "task must be a mapping"),
]


@pytest.mark.parametrize("case", SHAPES, ids=[c[0] for c in SHAPES])
def test_what_cannot_be_wrapped_is_named_and_nothing_runs(ansible, case):
    """Controller-side tasks (include_vars would turn its variables into host facts), a misspelt option next
    to a missing `name`, and a `task` that is not a mapping: one line that says so; nothing runs."""
    _id, args, said = case
    playbook = ansible.work / f"shape-{_id}.yml"
    playbook.write_text("- hosts: loc\n  gather_facts: false\n  tasks:\n    - hostlock.core.locked:\n"
                        f"        {args}\n        directory: '{{{{ lockdir }}}}'\n")
    run = ansible.play(str(playbook))
    assert run.rc != 0 and said in run.out, run.out
    assert "_datatag" not in run.out and "ansible_collections.hostlock" not in run.out, run.out


def test_async_is_refused_with_the_reason(ansible):
    playbook = ansible.work / "async.yml"
    playbook.write_text("- hosts: loc\n  gather_facts: false\n  tasks:\n    - hostlock.core.locked:\n"
                        "        name: a\n        directory: '{{ lockdir }}'\n"
                        "        task: {ansible.builtin.command: 'true'}\n      async: 10\n      poll: 1\n")
    run = ansible.play(str(playbook))
    assert run.rc != 0 and "async is refused" in run.out and "would not cover it" in run.out, run.out
