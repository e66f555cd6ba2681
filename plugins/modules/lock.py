#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The documentation of hostlock.core.lock. Its action (plugins/action/lock.py) takes fleet locks on the
# controller and runs the host's side, plugins/modules/lock_host.py; its options are
# plugins/module_utils/_argspec.py's LOCK.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lock
short_description: Take or release a host lock that outlives the task
version_added: 0.1.0
description:
  - Takes a hostlock lock on the managed host and keeps it after the task ends, until a later task releases it
    with the returned RV(token), or until the O(lease) runs out. The host's own jobs (C(hostlock run NAME) in a
    cron job or a shell) take the same lock, so a playbook and the host's jobs never overlap.
  - For several tasks under one lock, the P(hostlock.core.with_lock#role) role does all of this in one task (see
    the first example); for one task, M(hostlock.core.locked) is shorter.
  - The lease is kept by a small detached holder process on the host, which closes every inherited descriptor
    and leaves the session (it never keeps the SSH connection open). Needs nothing on the host but Python; the
    lock engine travels with the module.
options:
  state:
    description:
      - V(acquired) takes the lock (waiting up to O(timeout)) and returns a RV(token); with an existing
        O(token) it renews that lease to O(lease) seconds from now instead.
      - V(released) gives up the lease of O(token); a lease already gone is OK and unchanged, with a warning.
    type: str
    choices: [acquired, released]
    default: acquired
  heartbeat:
    description:
      - Keep the lease alive from the control node for as long as this run lives (renewed every quarter
        O(lease)), and end it at once when the run ends without releasing it, once the run's work on the host
        (what carries RV(environment)) has ended. This is what P(hostlock.core.with_lock#role) takes.
    type: bool
    default: false
  lease:
    description:
      - The most the lock is kept, as seconds or a duration (V(10m)); it frees the lock when the playbook never
        comes back to release it. Required to acquire, unless O(heartbeat=true) (then V(60)).
    type: raw
  token:
    description:
      - The RV(token) returned when the lock was acquired, required with O(state=released) (unless
        O(force=true)); with O(state=acquired) it renews that lease.
    type: str
  force:
    description:
      - With O(state=released) and no O(token), break the lock whoever holds it (holders get SIGTERM; a
        C(hostlock run) supervisor keeps the lock until its job has ended). The manual override for a stuck lock.
    type: bool
    default: false
extends_documentation_fragment:
  - hostlock.core.lock
  - hostlock.core.lock.taking
  - hostlock.core.lock.where
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: The action names the play, task and run in the label; with O(fleet) it takes the lock itself.
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
  - "C(changed) says whether the task changed what the host keeps after this run: taking a lease does, unless
    O(heartbeat=true) (a heartbeat lease ends with the run), and so does releasing one; releasing this run's own
    heartbeat lease does not. So a role taking and releasing a heartbeat lease (or P(hostlock.core.with_lock#role))
    is idempotent under Molecule. The collection's docs/ansible.md says when each task reports changed."
  - A lock this same run holds (a lease taken earlier, an enclosing P(hostlock.core.with_lock#role) of this
    name) fails the task at once instead of waiting for it. Another inventory host of the run on the same machine
    is waited for where the strategy lets hosts take turns (C(free), C(host_pinned)); under C(linear) the task
    fails at once naming what works.
  - Host locks are local to one host; fleet locks (O(fleet)) are one lock per name for every host and run.
seealso:
  - module: hostlock.core.locked
  - module: hostlock.core.lock_info
  - plugin: hostlock.core.serialize
    plugin_type: callback
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
- name: Run a tasks file under the deploy lock, released when it ends or fails, or when this run dies
  ansible.builtin.include_role:
    name: hostlock.core.with_lock
  vars:
    with_lock_name: deploy
    with_lock_tasks: "{{ playbook_dir }}/deploy-steps.yml"   # or with_lock_role: myapp
    with_lock_timeout: 5m

- name: The same by hand, for an inline block
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
  no_log: true

- name: Work that must not overlap with the host's own deploy jobs
  ansible.builtin.command: /bin/true
  changed_when: false

- name: Renew the lease for long work
  hostlock.core.lock:
    name: deploy
    token: "{{ deploy_lock.token }}"
    lease: 600
  no_log: true

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
  no_log: true

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
  no_log: true

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
  no_log: true

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
  no_log: true

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
  description: Public id of the lease, as shown by C(hostlock status) and in RV(holders).
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
    - The lock's holders after the task (before it in check mode, when giving up on a conflict), each a holder
      record as C(hostlock status --json) prints it; its fields are listed under
      RV(hostlock.core.lock_info#module:locks[].holders).
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 4242
      user: root
      mode: exclusive
      label: "ansible root@ctl: play 'Deploy', task 'Take the deploy lock' [run 0f3c5e7a9b1d] [host web1]"
      acquired_at: 1767225000.1
      lease_expires: 1767225600.1
      stale: false
      token_id: 3f1c2e5a9b07
held:
  description:
    - With O(state=released), the seconds the released lease was held, from when it was taken (the wait left
      out) to its release, as the host's clock measured them.
  returned: when a lease was released
  type: float
  sample: 12.5
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
    held:
      description: Seconds the released lease was held (its wait left out).
      type: float
      returned: when a lease was released
    lease_expires:
      description: When the lease runs out (epoch seconds).
      type: float
      returned: when a lease was taken or renewed
  sample: {name: deploy, event: acquired, waited: 2.04, token_id: 3f1c2e5a9b07, lease_expires: 1767225600.5}
"""
