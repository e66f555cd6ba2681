#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lock
short_description: Take or release a host lock that outlives the task
version_added: 0.1.0
description:
  - Takes a hostlock lock on the managed host and keeps it after the task ends, until a later task
    releases it with the returned RV(token), or until the O(lease) runs out, whichever comes first.
  - A lock taken inside a module would die with the module's process. This module therefore leaves a
    small detached holder process on the host (the engine's C(hostlock.hold)), which closes every
    inherited descriptor and leaves the session, so it never keeps the SSH connection or the module's
    pipes open, and it ends itself when the lease runs out.
  - The same locks are seen by the C(hostlock) command on the host (C(hostlock run NAME ...) in a cron
    job or shell), so a playbook and the host's own jobs never overlap.
  - Needs nothing on the host but Python 3.8 or later; the lock engine travels with the module.
  - To lock around a single task, M(hostlock.core.locked) is shorter. To keep whole playbook runs
    apart per host, enable the P(hostlock.core.serialize#callback) callback.
options:
  name:
    description:
      - The lock's name, shared by everyone who locks the same thing on this host
        (for example V(apt), V(deploy-myapp)).
      - 1 to 100 characters from C([A-Za-z0-9._+@-]), not starting with C(.), C(+), C(@) or C(-).
      - A named lock is hostlock's own (files and records in its directory), shared with
        C(hostlock run NAME) jobs; C(flock(1)) on some file does not see it. Use O(path) for that.
      - Exactly one of O(name) and O(path) is required.
    type: str
  path:
    description:
      - Instead of a named lock, the kernel lock C(flock(1)) takes on this file of the host (as do
        C(hostlock flock FILE) and C(hostlock run --path FILE)), that is C(flock(2)) on the file, created if
        missing (never truncated or written). The lease holder keeps it, so the host's C(flock FILE ...)
        scripts wait for the lease, and the task waits for them.
      - An absolute path; its directory must exist. A FIFO, or a symlink another user planted in a sticky
        world-writable directory (C(/tmp)), is refused.
      - O(mode), O(lease), O(heartbeat), O(token), O(timeout) apply as for a named lock (renew and release
        with the same O(path) and the O(token)). O(slots), O(directory), O(fleet) and O(force) do not.
      - Holders are read from C(/proc) (pid, command line, job), as C(hostlock status --path) shows them;
        a path lock has no label, so a lock this same run holds on the path is waited for up to O(timeout)
        like any other holder.
    type: path
    version_added: 0.2.0
  state:
    description:
      - V(acquired) takes the lock (waiting up to O(timeout)) and returns a RV(token). Given an
        existing O(token), it renews that lease to O(lease) seconds from now instead.
      - V(released) gives up the lease named by O(token). Releasing a lease that is no longer held
        (released already, lease ran out) is OK and unchanged, with a warning. A token whose secret is
        wrong for a live lease fails the task.
    type: str
    choices: [acquired, released]
    default: acquired
  mode:
    description:
      - V(exclusive) admits one holder (or O(slots) holders). V(shared) admits any number of shared
        holders and no exclusive one (readers and a writer).
    type: str
    choices: [exclusive, shared]
    default: exclusive
  slots:
    description:
      - With a value above 1 the lock is a semaphore admitting that many holders at once.
        Only with O(mode=exclusive).
    type: int
    default: 1
  timeout:
    description:
      - How long to wait for the lock, as seconds (V(90), V(1.5)) or a duration (V(10m), V(1h30m));
        V(0) tries once. Omit to wait as long as it takes.
      - When the time is up the task fails naming the holders (see O(on_conflict)).
      - A lock held by this same playbook run (another host of the play whose lock is delegated to the
        same host, a lease of the same name taken earlier) fails the task at once instead, as a run never
        waits for itself.
    type: raw
  lease:
    description:
      - How long the lock is kept at most, as seconds or a duration (V(10m)). Required with
        O(state=acquired), unless O(heartbeat=true) (then V(60) by default). At most about 24 days.
      - The lease is what frees the lock when the playbook never comes back to release it (a killed
        run, a lost connection). Choose it longer than the work it protects; renew it with
        O(state=acquired) and the O(token) for long work, or let O(heartbeat) renew it.
      - When the lease runs out while a process carrying RV(environment) still runs on the host (a task of
        the block it protects, started by a run that was killed), the lock is kept until that process and
        its children have ended.
    type: raw
  heartbeat:
    description:
      - Keep the lease alive from the control node for as long as this C(ansible-playbook) run lives,
        renewing it every quarter O(lease). This is how to lock a C(block), an C(include_tasks), a role
        or a whole play with the same guarantee as M(hostlock.core.locked) (see the examples).
      - The heartbeat stops at the matching O(state=released). When the run ends without releasing
        (Ctrl-C, SIGTERM, SIGKILL, a failure that skips the release), it ends the lease at once; the lock is
        then freed as soon as the run's in-flight work on the host has ended (the processes carrying
        RV(environment), which the block passes to its tasks). If the heartbeat cannot reach the host (a
        dropped connection), the lease runs out at most O(lease) after the last renewal.
      - Only for taking a new lease (not with O(token)).
    type: bool
    default: false
  token:
    description:
      - The RV(token) returned when the lock was acquired.
      - Required with O(state=released) unless O(force=true). With O(state=acquired) it renews that
        lease instead of taking a new one.
    type: str
  force:
    description:
      - With O(state=released) and no O(token), break the lock whoever holds it, ending live holders
        (lease holders and C(hostlock run) supervisors) of the connecting user, or anyone's as root.
      - This is the manual override for a stuck lock. Holders get SIGTERM; a C(hostlock run)
        supervisor forwards it to its job and keeps the lock until the job has ended, so the job
        never runs on unlocked.
    type: bool
    default: false
  directory:
    description:
      - The lock directory on the host. Defaults to C($HOSTLOCK_DIR), else C(/run/hostlock)
        when usable, else a per-user runtime directory; the result says which was used.
      - Everyone who must exclude each other has to use the same directory. It must be absolute (or
        start with C(~)), because a relative one would name another directory for each task's working
        directory.
    type: path
  label:
    description:
      - Free text stored with the lock and shown by C(hostlock status) and in other tasks' errors.
      - Defaults to one naming the play, the task, and the controller user and host (and, in an AWX or AAP job,
        the job, its template and launching user, from C(awx_job_id) and the like; shown, never trusted). The
        controller appends C([run ID]) naming its C(ansible-playbook) run.
    type: str
  on_conflict:
    description:
      - What to do when the lock is still held by others after O(timeout).
      - V(fail) fails the task naming the holders. V(skip) marks the task skipped and returns
        RV(acquired=false) and the holders, so later tasks can test C(result is skipped).
    type: str
    choices: [fail, skip]
    default: fail
  fleet:
    description:
      - Take a B(fleet lock) in etcd instead of a host lock, for example V(etcd://10.0.0.5:2379) or
        V(etcds://etcd1:2379,etcd2:2379/team-a?cacert=/etc/ssl/etcd-ca.pem) (see
        O(hostlock.core.locked#module:fleet) for the URL).
      - Defaults to E(HOSTLOCK_FLEET) in the B(controller's) environment; V('') means a host lock even
        when E(HOSTLOCK_FLEET) is set.
      - The controller takes the lease and the host is not contacted (it needs no route to etcd). The
        lease is an etcd lease whose time to live is O(lease); it outlives the controller and needs no
        helper process anywhere; it ends when released with the RV(token), or O(lease) seconds after it
        was taken or renewed. O(force=true) revokes the holders' etcd leases.
      - The result carries RV(fence), the fencing token, and RV(path), the etcd key prefix, instead of
        RV(directory). O(directory) does not apply.
    type: str
  controller:
    description:
      - Internal, set by the action plugin on the controller for the local connection; do not set it. The
        C(ansible-playbook) process (C(PID:START) in clock ticks); a wait ends, and no lease is kept, once
        that process is gone, even if its worker lives on (C(kill -9) of C(ansible-playbook)).
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: >-
      A controller-side action fills in the default O(label); the work happens on the host, except with
      O(fleet), where the controller does it all.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Takes and releases nothing; reports whether the lock is free and who holds it.
  diff_mode:
    support: none
  platform:
    platforms: posix
    details: Linux is tested. Other POSIX systems use C(flock) instead of OFD locks.
notes:
  - Host locks are local to one host. Two tasks on different hosts never conflict. Fleet locks
    (O(fleet)) are one lock per name for every host, run and control node using the same etcd.
  - The lease holder is a process of the connecting user (after C(become), of the become user).
seealso:
  - module: hostlock.core.locked
  - module: hostlock.core.lock_info
  - plugin: hostlock.core.serialize
    plugin_type: callback
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
- name: Deploy under the deploy lock, freed when this run ends however it ends
  environment: "{{ deploy_lock.environment | default({}) }}"  # marks the block's work on the host
  block:
    - name: Take the deploy lock, kept alive by this run
      hostlock.core.lock:
        name: deploy
        heartbeat: true
        timeout: 5m
      register: deploy_lock
      no_log: true  # the token's secret stays out of the output

    - name: Work under the lock (include_tasks, include_role and import_role work too)
      ansible.builtin.command: /bin/true
      changed_when: false
  always:
    - name: Release the deploy lock, also after a failure
      hostlock.core.lock:
        name: deploy
        state: released
        token: "{{ deploy_lock.token }}"
      when: deploy_lock.token is defined

- name: Take the deploy lock for at most 10 minutes
  hostlock.core.lock:
    name: deploy
    lease: 600
    timeout: 60
  register: deploy_lock

- name: Work that must not overlap with the host's own deploy jobs
  ansible.builtin.command: /bin/true
  changed_when: false

- name: Renew the lease for long work
  hostlock.core.lock:
    name: deploy
    token: "{{ deploy_lock.token }}"
    lease: 600

- name: Release the deploy lock
  hostlock.core.lock:
    name: deploy
    state: released
    token: "{{ deploy_lock.token }}"

- name: Try the backup lock once; skip when a backup is running
  hostlock.core.lock:
    name: backup
    lease: 300
    timeout: 0
    on_conflict: skip
  register: backup_lock

- name: Release the backup lock if we got it
  hostlock.core.lock:
    name: backup
    state: released
    token: "{{ backup_lock.token }}"
  when: backup_lock is not skipped

- name: Take the lock a flock(1) cron line uses (flock -n /tmp/hostlock-example-rotate.lock rotate.sh)
  hostlock.core.lock:
    path: /tmp/hostlock-example-rotate.lock
    lease: 300
    timeout: 60
  register: rotate_lock

- name: Give the file's lock back
  hostlock.core.lock:
    path: /tmp/hostlock-example-rotate.lock
    state: released
    token: "{{ rotate_lock.token }}"

- name: Take one of four slots of a semaphore, shared by the host's cron jobs
  hostlock.core.lock:
    name: heavy-io
    slots: 4
    lease: 120
  register: io_slot

- name: Give the slot back
  hostlock.core.lock:
    name: heavy-io
    state: released
    token: "{{ io_slot.token }}"

- name: Take the fleet-wide deploy lock in etcd, once for the play (the controller takes it)
  hostlock.core.lock:
    name: deploy
    fleet: etcd://etcd.example.com:2379
    lease: 10m
    timeout: 5m
  run_once: true
  register: fleet_deploy

- name: Release the fleet-wide deploy lock
  hostlock.core.lock:
    name: deploy
    fleet: etcd://etcd.example.com:2379
    state: released
    token: "{{ fleet_deploy.token }}"
  run_once: true
"""

RETURN = r"""
name:
  description: The lock's name.
  returned: always
  type: str
  sample: deploy
directory:
  description: The lock directory used on the host (compare it with C(hostlock status)).
  returned: for a host lock (without O(fleet))
  type: str
  sample: /run/hostlock
fleet:
  description: The fleet URL of a fleet lock.
  returned: with O(fleet)
  type: str
  sample: etcd://10.0.0.5:2379
path:
  description:
    - With O(path), the file whose kernel lock was taken (O(path) as given).
    - With O(fleet), the fleet lock's etcd key prefix, as C(hostlock status --fleet) shows it.
  returned: with O(path) or O(fleet)
  type: str
  sample: etcd://10.0.0.5:2379/hostlock/deploy/
fence:
  description:
    - With O(fleet), the lease's fencing token (its etcd key's creation revision), strictly increasing per
      lock name. Hand it to downstream systems so they can refuse a holder whose lease ended.
  returned: when a fleet lease was taken or renewed
  type: int
  sample: 4711
acquired:
  description:
    - Whether this task holds the lock now (V(false) in check mode, on release, or when skipped).
  returned: always
  type: bool
  sample: true
token:
  description:
    - The lease's token, C(TOKEN_ID.SECRET); pass it as O(token) to release or renew the lock.
    - Anyone with the token can release the lease, so treat it like a password; register the task that
      takes the lock with C(no_log=true) to keep it out of the output (RV(token_id) is public).
    - A renewal returns the same token, so registering the renewal's result in the same variable keeps
      it usable.
  returned: when a lease was taken or renewed
  type: str
  sample: 3f1c2e5a9b07.bd2a6c0f5e8a4d2b9c1e7f30a6d4c2b1
token_id:
  description: Public id of the lease, as shown by C(hostlock status) and RV(holders[].token_id).
  returned: when a lease was taken, renewed or released
  type: str
  sample: 3f1c2e5a9b07
lease_expires:
  description: When the lease runs out (seconds since the epoch).
  returned: when a lease was taken or renewed
  type: float
  sample: 1767225600.5
lease:
  description: The lease's length in seconds (what a renewal without O(lease) extends it by).
  returned: when a lease was taken
  type: float
  sample: 60.0
environment:
  description:
    - The environment variable that marks work done under this lease (one per lease, so nested blocks
      under several leases keep every mark). Pass it to the tasks the lease protects with the
      C(environment) keyword of their block or play; their processes and every child they start inherit it.
    - When the lease runs out before it is released (its run was killed and stopped renewing), the lock is
      kept until no process carrying the mark is left, so the next holder never overlaps that work.
      Only processes the lease holder's user may inspect count (the same user, or any when it is root).
    - Its value is derived from the token's secret; like the token, keep it out of the output.
  returned: when a lease was taken or renewed
  type: dict
  sample: {HOSTLOCK_LEASE_3f1c2e5a9b07: 9a0c3e5d7f1b2a4c6e8d0f1a3b5c7d9e}
heartbeat:
  description: The lease's heartbeat on the control node (O(heartbeat=true)).
  returned: when a lease was taken with O(heartbeat=true)
  type: dict
  contains:
    pid:
      description: The heartbeat process on the control node.
      type: int
    every:
      description: Seconds between renewals.
      type: float
    lease:
      description: The lease each renewal sets, in seconds.
      type: float
  sample: {pid: 81234, every: 15.0, lease: 60.0}
waited:
  description: Seconds spent waiting for the lock.
  returned: always
  type: float
  sample: 2.04
holders:
  description:
    - The lock's holders after the task (before it in check mode, at the time of giving up on a
      conflict). Each item is a holder record as C(hostlock status --json) prints it.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Holder process (the lease holder, a C(hostlock run) supervisor, a module holding the lock).
      type: int
    user:
      description: Holder's user name (V(null) when the uid has no name here).
      type: str
    uid:
      description: Holder's uid, as its owner record claims it.
      type: int
    mode:
      description: V(exclusive) or V(shared).
      type: str
    slot:
      description: Semaphore slot, or V(null).
      type: int
    cmdline:
      description: Holder's command line (read live from the process when it runs here).
      type: str
    job_pid:
      description: Pid of the job a C(hostlock run) supervisor runs, or V(null).
      type: int
    job_cmdline:
      description: >-
        Command line of that job, or what the holder says it does (for example a lease waiting for its in-
        flight work), or V(null).
      type: str
    label:
      description: The holder's label.
      type: str
    acquired_at:
      description: When it took the lock (epoch seconds).
      type: float
    lease_expires:
      description: When its lease runs out (epoch seconds), or V(null) for a process lock.
      type: float
    token_id:
      description: Public id of the holder's lease, or V(null) for a process holding the lock itself.
      type: str
    alive:
      description: >-
        Whether the recorded process is alive (pid, start time and boot id match), V(null) when it cannot be
        told from here.
      type: bool
    stale:
      description: Whether the record is left over from a dead owner or an ended lease (it blocks nobody).
      type: bool
    verified:
      description: >-
        Whether the kernel proves the live process holds this lock (it has the lock file open, with the
        claimed uid); V(null) when it cannot be told.
      type: bool
    forged:
      description: Whether the record claims another uid than the one that wrote it (never acted upon).
      type: bool
    problem:
      description: Why the record is not trusted (a forged record, something planted at the lock path), or V(null).
      type: str
    hostname:
      description: Host the holder recorded (fleet locks are held from many hosts).
      type: str
    boot_id:
      description: Boot id of the holder's host when it took the lock.
      type: str
    start_time:
      description: Holder's start time in clock ticks since boot (with the pid, tells a reused pid apart).
      type: int
    pid_namespace:
      description: PID namespace of the holder (a pid means something only inside it).
      type: str
    fence:
      description: Fleet locks, the holder's fencing token (its etcd key's create revision); V(null) for host locks.
      type: int
    record_ok:
      description: Whether the holder's owner record could be read.
      type: bool
    file_uid:
      description: Owner uid of the file the record was read from (the kernel's word), or V(null).
      type: int
    lease_expired:
      description: Whether its lease has run out.
      type: bool
    lease_id:
      description: Fleet locks, the etcd lease (hex) its key was made with; V(null) for host locks.
      type: str
  sample:
    - pid: 4242
      user: root
      mode: exclusive
      slot: null
      cmdline: hostlock-lease deploy
      job_pid: null
      job_cmdline: null
      label: "ansible root@ctl: play 'Deploy', task 'Take the deploy lock'"
      acquired_at: 1767225000.1
      lease_expires: 1767225600.1
      stale: false
      token_id: 3f1c2e5a9b07
free:
  description: In check mode, whether the lock would be granted right now.
  returned: in check mode with O(state=acquired)
  type: bool
  sample: true
released:
  description: The holders a release or break ended.
  returned: with O(state=released)
  type: list
  elements: dict
  sample: []
hostlock:
  description: Lock timings for the P(hostlock.core.serialize#callback) callback's recap.
  returned: always
  type: dict
  contains:
    name:
      description: The lock's name.
      type: str
    event:
      description: >-
        What happened: V(acquired), V(renewed), V(released), V(broken), V(conflict), V(self) (held by this
        run), V(check).
      type: str
    waited:
      description: Seconds spent waiting for the lock.
      type: float
    token_id:
      description: Public id of the lease concerned.
      type: str
      returned: when a lease was taken, renewed or released
    lease_expires:
      description: When the lease runs out (epoch seconds).
      type: float
      returned: when a lease was taken or renewed
  sample: {name: deploy, event: acquired, waited: 2.04, token_id: 3f1c2e5a9b07, lease_expires: 1767225600.5}
"""

import time
import typing as t

from ansible.module_utils.basic import AnsibleModule

# First: the engine below is then compiled once, not twice, from the AnsiballZ zip (see _zipimport).
from ansible_collections.hostlock.core.plugins.module_utils import _zipimport  # noqa: F401  # pylint: disable=unused-import
from ansible_collections.hostlock.core.plugins.module_utils._common import (
    HEARTBEAT_LEASE,
    describe_holders,
    engine_message,
    lease_marker,
    live_holders,
    path_holder_dicts,
    path_params_error,
)
from ansible_collections.hostlock.core.plugins.module_utils._runner import (
    SELF_CHECK_EVERY,
    ControllerGone,
    SelfWait,
    controller_gone,
    detach,
    own_holders,
)
from ansible_collections.hostlock.core.plugins.module_utils._task import LockTask
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import (
    HostlockError,
    LockTimeout,
    TokenError,
    break_lock,
    hold,
    parse_duration,
    release,
    renew,
    status,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.lease import (
    EXPIRE_NOW,
    in_flight_environment,
    in_flight_pids,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.lease import hold as hold_path
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.lease import release as release_path
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.lease import renew as renew_path

ARGUMENT_SPEC = dict(
    name=dict(type="str"),
    path=dict(type="path"),
    state=dict(type="str", choices=["acquired", "released"], default="acquired"),
    mode=dict(type="str", choices=["exclusive", "shared"], default="exclusive"),
    slots=dict(type="int", default=1),
    timeout=dict(type="raw"),
    lease=dict(type="raw"),
    heartbeat=dict(type="bool", default=False),
    token=dict(type="str", no_log=True),
    force=dict(type="bool", default=False),
    directory=dict(type="path"),
    label=dict(type="str"),
    on_conflict=dict(type="str", choices=["fail", "skip"], default="fail"),
    # handled by the action on the controller (plugin_utils/_fleet.py); never sent to the host
    fleet=dict(type="str"),
    # set by the action for the local connection: the ansible-playbook process, watched while we wait
    controller=dict(type="str"),
)
# Also used by the action, which checks a fleet task on the controller with the same rules.
# lease is required to acquire unless heartbeat=true defaults it: params_error says so (required_if cannot)
REQUIRED_IF: list = []
MUTUALLY_EXCLUSIVE = [("token", "force"), ("name", "path")]
REQUIRED_ONE_OF = [("name", "path")]


# A bound, not a delay: the holder unlocks first and then answers (hostlock.lease), so when release() returns the
# lock is free and settle() normally returns at once; this bounds it should status still show our holder.
RELEASE_SETTLE = 2.0


class Conflict(Exception):
    """The lock stayed busy until the timeout; carries the result to report."""

    def __init__(self, msg: str, result: dict) -> None:
        super().__init__(msg)
        self.result = result


class Task(LockTask):
    """One run of the module: a host lock (named, or flock(1)'s on a file) taken through a lease holder."""

    def __init__(self, module: AnsibleModule) -> None:
        p = module.params
        super().__init__(p, p["name"] if p["name"] is not None else p["path"], module.check_mode)
        self.module = module
        self.path: str | None = p["path"]
        self.directory: str | None = p["directory"]
        self.resolved: str | None = ""
        self.refresh()

    def refresh(self) -> list:
        if self.path:  # flock(1)'s lock on a file: holders from /proc, no directory
            self.holders, self.resolved = path_holder_dicts(self.path), None
            return self.holders
        st = status(self.name, directory=self.directory)
        self.holders, self.resolved = [h.as_dict() for h in st.holders], st.directory
        return self.holders

    def location(self) -> dict:
        return dict(directory=self.resolved, path=self.path) if self.path else dict(directory=self.resolved)

    def status_hint(self) -> str:
        return f"hostlock status --path {self.path}" if self.path else f"hostlock status {self.name}"

    def lease_fields(self, token: str) -> dict:
        return dict(environment=in_flight_environment(token))

    def warn(self, msg: str) -> None:
        self.module.warn(msg)

    def refuse(self, msg: str) -> t.NoReturn:
        self.module.fail_json(msg=msg, holders=self.holders, directory=self.resolved)
        raise AssertionError("unreachable: fail_json exits")  # for the type checker (ansible-core is untyped here)

    def force_hint(self) -> str:
        return "" if self.path else super().force_hint()

    # -- state=acquired ------------------------------------------------------------------------------
    def take(self) -> dict:
        p = self.p
        started = time.monotonic()
        try:
            token = self.hold(started)
        except SelfWait as e:
            msg = (f"lock {self.name} is held by this same playbook run ({describe_holders(e.holders)}): a run never "
                   "waits for itself. For hosts sharing one lock delegated to one host, take it once with "
                   "run_once: true; inside a held lease of this name, do not take it again")
            raise Conflict(msg, self.result("self", False, msg, round(time.monotonic() - started, 3))) from None
        except LockTimeout as e:
            waited = round(time.monotonic() - started, 3)
            self.holders = path_holder_dicts(self.path) if self.path else [h.as_dict() for h in e.holders]
            where = "" if self.path else f" in {self.resolved}"
            msg = (f"lock {self.name}{where} is still held after {waited}s by "
                   f"{describe_holders(live_holders(self.holders))} (see: {self.status_hint()})")
            raise Conflict(msg, self.result("conflict", False, msg, waited)) from e
        waited = round(time.monotonic() - started, 3)
        token_id = token.partition(".")[0]
        self.refresh()
        mine = self.mine(token_id) or {}
        expires = mine.get("lease_expires") or time.time() + p["lease"]
        return self.result("acquired", True, f"took lock {self.name} (waited {waited}s, lease {p['lease']}s)",
                           waited, acquired=True, token=token, token_id=token_id, lease_expires=expires,
                           lease=p["lease"], **self.lease_fields(token))

    def hold(self, started: float) -> str:
        """hold() in slices: between them, fail at once on a holder of our own run, stop if the controller left."""
        p = self.p
        marker = lease_marker(p["label"])  # a locked task's lease ("[run ID task]") never waits for ours
        deadline = None if p["timeout"] is None else started + p["timeout"]
        while True:
            if marker:
                mine = own_holders(self.refresh(), marker)
                if mine:
                    raise SelfWait(mine)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = SELF_CHECK_EVERY if left is None else min(left, SELF_CHECK_EVERY)
            try:
                # in_flight: a lease that runs out waits for the processes carrying its environment mark
                if self.path:  # the engine's lease on flock(1)'s lock on a file (hostlock.lease.hold(path=))
                    token = hold_path(self.name, lease=p["lease"], mode=p["mode"], timeout=step, in_flight=True,
                                      path=self.path)
                else:
                    token = hold(self.name, lease=p["lease"], mode=p["mode"], slots=p["slots"],
                                 directory=self.directory, timeout=step, label=p["label"], in_flight=True)
            except LockTimeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            else:
                if controller_gone(controller=p["controller"]):
                    # Nobody will ever read the token, so nobody could release the lease: give it back now
                    # rather than keep the lock for a whole lease (a controller Ctrl-C'd during our last slice).
                    self.give_back(token)
                    raise ControllerGone()
                return token
            if controller_gone(controller=p["controller"]):
                raise ControllerGone()

    def give_back(self, token: str) -> None:
        try:
            if self.path:
                release_path(self.name, token, path=self.path)
            else:
                release(self.name, token, directory=self.directory)
        except HostlockError:  # gone already: nothing is held
            pass

    def engine_renew(self, token: str, lease: float | None) -> float:
        if self.path:
            return renew_path(self.name, token, lease=lease, path=self.path)
        return renew(self.name, token, lease=lease, directory=self.directory)

    def renew_refused(self, error: TokenError) -> HostlockError:
        live = live_holders(self.holders)
        now = describe_holders(live) if live else "nobody"  # never "released meanwhile": maybe never held
        if getattr(error, "reason", "") in ("malformed", "refused"):
            return HostlockError(f"cannot renew: {error}. The token is not a lease on this lock (a wrong token: "
                                 f"another lock's, or from another run); holders now: {now}")
        return HostlockError(f"cannot renew: {error}. The lock is not ours any more: take it again "
                             f"(holders now: {now})")

    # -- state=released ------------------------------------------------------------------------------
    def engine_release(self, token: str) -> None:
        if self.path:
            release_path(self.name, token, path=self.path)
        else:
            release(self.name, token, directory=self.directory)

    def in_flight_work(self, token: str) -> list:
        try:
            return in_flight_pids(token)
        except (HostlockError, ValueError):  # not a token of ours: the release says so
            return []

    def engine_expire(self, token: str) -> None:
        self.engine_renew(token, EXPIRE_NOW)

    def released(self, token_id: str) -> None:
        """Return once our lease holder is gone, so the next task finds the lock free."""
        deadline = time.monotonic() + RELEASE_SETTLE
        while self.mine(token_id) and time.monotonic() < deadline:
            time.sleep(0.005)
            self.refresh()

    def break_lock(self) -> dict:
        if self.path and self.p["force"]:
            # the kernel lock of a file: no record proves what its holders are, so nobody is ended
            live = live_holders(self.holders)
            if not live:
                return self.result("released", False, f"lock {self.name} is not held", released=[])
            self.module.fail_json(msg=f"lock {self.name}: force=true breaks named locks only; the kernel lock on "
                                  f"this file is held by {describe_holders(live)} (see: {self.status_hint()})",
                                  holders=self.holders, path=self.path)
        return super().break_lock()

    def engine_break(self) -> list:
        return [h.as_dict() for h in break_lock(self.name, directory=self.directory, force=True)]


def params_error(p: dict) -> str | None:
    """What is wrong with the options, or None; parses lease and timeout in place (the action checks the same)."""
    error = path_params_error(p)
    if error:
        return error
    if p["slots"] < 1:
        return f"slots must be 1 or more (got {p['slots']})"
    if p["slots"] > 1 and p["mode"] != "exclusive":
        return f"slots={p['slots']} makes a semaphore, which needs mode=exclusive (got {p['mode']})"
    for key in ("lease", "timeout"):
        if p[key] is not None:
            try:
                p[key] = parse_duration(p[key], key)
            except ValueError as e:
                return str(e)
    if p["lease"] is not None and not p["lease"] > 0:
        return f"lease must be more than 0 seconds (got {p['lease']})"
    if p.get("heartbeat"):
        if p["state"] != "acquired" or p["token"]:
            return "heartbeat=true applies when taking a new lease (state=acquired, no token)"
        if p["lease"] is None:
            p["lease"] = HEARTBEAT_LEASE
    if p["state"] == "acquired" and p["lease"] is None:
        return "state is acquired but all of the following are missing: lease (or heartbeat=true, which defaults it)"
    if p["force"] and p["state"] != "released":
        return "force=true only applies to state=released"
    return None


def check_params(module: AnsibleModule) -> None:
    if module.params.get("fleet"):
        module.fail_json(msg="fleet locks are taken by the controller (the hostlock.core.lock action), never on the "
                         "host: run this module from a task, not on its own")
    error = params_error(module.params)
    if error:
        module.fail_json(msg=error)


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=REQUIRED_IF,
        mutually_exclusive=MUTUALLY_EXCLUSIVE,
        required_one_of=REQUIRED_ONE_OF,
        supports_check_mode=True,
    )
    check_params(module)
    name = module.params["name"] or module.params["path"]
    # Out of reach of the controller's signals and of the `ssh -tt` terminal's hangup (see _runner.detach):
    # a wait cut short by SIGHUP would leave the engine's holder to take the lease for nobody.
    detach()
    try:
        task = Task(module)
        result = task.acquire() if module.params["state"] == "acquired" else task.release()
    except ControllerGone:  # nobody reads a result any more: no lease was taken
        module.fail_json(msg=f"lock {name}: the controller is gone (its connection closed) while we waited")
    except Conflict as e:
        if module.params["on_conflict"] == "skip":
            module.exit_json(skipped=True, name=name, **e.result)
        module.fail_json(name=name, **e.result)
    except (HostlockError, ValueError) as e:
        module.fail_json(msg=f"lock {name}: {engine_message(e)}", name=name, directory=getattr(e, "directory", None))
    module.exit_json(name=name, **result)


if __name__ == "__main__":
    main()
