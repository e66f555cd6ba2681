#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The documentation of hostlock.core.locked. Its action (plugins/action/locked.py) builds the wrapped module and runs
# the host's side, plugins/modules/locked_host.py; its options are plugins/module_utils/_argspec.py's LOCKED.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: locked
short_description: Run one task on the host while holding a host lock
version_added: 0.1.0
description:
  - Runs one task (O(task)) on the managed host while holding a lock there, the lock the host's own jobs take too
    (C(hostlock run NAME ...) in cron or a shell, P(hostlock.core.with_lock#role), other playbooks), which wait
    meanwhile. The task's result is the wrapped module's (C(register), C(changed_when), C(--diff) work as for it),
    plus RV(hostlock) with the lock's wait and hold times.
  - A module without an action plugin of its own, and C(command) and C(shell), runs inside B(one) module run on the
    host that takes the lock, runs it and releases the lock after it ended, whatever happens to the controller or
    the connection meanwhile; no lease is involved.
  - A task with its own action plugin (C(template), C(copy), C(fetch), C(package), C(service), C(script), C(raw),
    ...) runs under a heartbeat lease on the host, taken at its first step there and released after its last; if
    the run dies meanwhile, the lock is freed once the task's processes on the host have ended.
  - For several tasks under one lock (a tasks file, a role) use P(hostlock.core.with_lock#role).
  - The collection's docs/ansible.md says exactly what the lock covers in each case, and how it was tested.
options:
  task:
    description:
      - The one task to run while the lock is held, in the task's own shape (one key naming the module, its
        arguments a mapping or a free-form string), or as O(task.module) and O(task.args).
      - Not tasks the controller runs itself (C(include_tasks), C(set_fact), C(debug), C(meta), ...), nor C(async).
    type: dict
    required: true
    suboptions:
      module:
        description: The module to run, by its FQCN (V(ansible.builtin.apt)); the play's C(module_defaults) apply.
        type: str
      args:
        description: Its arguments, as under the module's name in a task.
        type: raw
  lease:
    description: Ignored (the lock lives as long as the task); accepted for tasks written for 0.1.
    type: raw
  ttl:
    description:
      - With O(fleet), the etcd lease's time to live, seconds or a duration (default V(10)); a dead controller's
        lock is free this long after it died.
    type: raw
extends_documentation_fragment:
  - hostlock.core.lock
  - hostlock.core.lock.taking
  - hostlock.core.lock.where
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
    details: The lock must cover the whole task; run it without C(async).
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: >-
      Takes no lock: RV(hostlock.free) says whether a real run would get it now; the wrapped task runs in check mode.
  diff_mode:
    support: full
    details: Passed through to the wrapped task.
  platform:
    platforms: posix
    details: A killed C(locked) process on the host takes its module with it on Linux (C(PR_SET_PDEATHSIG)).
notes:
  - To hold one lock across several tasks (a tasks file, a role, a whole play) with the same guarantees, include
    the P(hostlock.core.with_lock#role) role; see docs/ansible.md for the hand-written block it replaces.
  - Loops work as for any task; each item takes and releases the lock.
  - Another inventory host of the same run holding the lock for its own C(locked) task is waited for (hosts of one
    machine take turns); a lease this run took (M(hostlock.core.lock), P(hostlock.core.with_lock#role)) of the same
    name fails the task at once, as waiting for it would never end.
  - With O(fleet), the controller takes a fleet lock in etcd, runs the task as it runs on its own and releases the
    lock; the task finds E(HOSTLOCK_FENCE) in its environment.
seealso:
  - module: hostlock.core.lock
  - module: hostlock.core.lock_info
  - plugin: hostlock.core.serialize
    plugin_type: callback
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
- name: Write the app's config under the host's app-config lock (a cron job reads it under the same lock)
  hostlock.core.locked:
    name: app-config
    timeout: 5m
    task:
      ansible.builtin.template:
        src: app.conf.j2
        dest: /tmp/hostlock-example-app.conf
        mode: "0644"
  register: config

- name: Show how long the lock was waited for and held
  ansible.builtin.debug:
    msg: "waited {{ config.hostlock.waited }}s, held {{ config.hostlock.held }}s"

- name: Copy a file while no flock(1) job holds its lock (cron - flock /tmp/hostlock-example-rotate.lock rotate.sh)
  hostlock.core.locked:
    path: /tmp/hostlock-example-rotate.lock
    timeout: 10m
    task:
      ansible.builtin.copy:
        content: "rotate weekly\n"
        dest: /tmp/hostlock-example-rotate.conf
        mode: "0644"

- name: Install curl under the apt lock, waiting up to 5 minutes for the host's own apt jobs
  hostlock.core.locked:
    name: apt
    timeout: 5m
    task:
      ansible.builtin.apt:
        name: curl
        state: present

- name: Run the nightly job's script now, unless the nightly job is running
  hostlock.core.locked:
    name: nightly-report
    timeout: 0
    on_conflict: skip
    task:
      module: ansible.builtin.command
      args:
        cmd: /bin/true
  changed_when: false

- name: Several tasks under one lock - include the with_lock role instead of locked
  ansible.builtin.include_role:
    name: hostlock.core.with_lock
  vars:
    with_lock_name: deploy
    with_lock_tasks: "{{ playbook_dir }}/deploy-steps.yml"

- name: Restart at most two app servers at once across every run and control node (a fleet semaphore)
  hostlock.core.locked:
    name: app-restart
    fleet: etcd://etcd.example.com:2379
    slots: 2
    timeout: 30m
    task:
      ansible.builtin.command: /bin/true   # the app's restart command
  changed_when: false

- name: One migration in the whole fleet at a time; the fence tells the database which holder is current
  hostlock.core.locked:
    name: db-migration
    fleet: etcd://etcd.example.com:2379
    ttl: 30s
    task:
      ansible.builtin.shell: echo "migrating, fence $HOSTLOCK_FENCE"
  run_once: true
  changed_when: false
"""

RETURN = r"""
fence:
  description:
    - With O(fleet), the fencing token of this holding (the etcd key's creation revision), strictly increasing
      per lock name. The wrapped task saw it as E(HOSTLOCK_FENCE); a downstream system that remembers the
      highest fence it has seen can refuse a holder that lost its lock.
  returned: when a fleet lock was taken
  type: int
  sample: 4711
hostlock:
  description: The lock's side of the task; the other keys are the wrapped module's result.
  returned: always
  type: dict
  contains:
    name:
      description: The lock's name.
      type: str
      sample: apt
    module:
      description: The wrapped module (its FQCN).
      type: str
      sample: ansible.builtin.apt
    event:
      description:
        - V(locked) (taken, ran, released), V(conflict), V(self) (held by this run), V(check), V(lost) (a
          fleet lock lost while the wrapped task ran).
      type: str
      sample: locked
    taken:
      description: Whether the lock was taken for this task (never in check mode).
      type: bool
      sample: true
    waited:
      description: Seconds spent waiting for the lock on the host.
      type: float
      sample: 0.002
    held:
      description:
        - Seconds the lock was held, from when it was taken (the wait left out) to its release; for a task with its
          own action plugin (C(template), C(copy)), from its first step on the host to after its last.
      type: float
      returned: when the lock was taken
      sample: 1.73
    released:
      description: V(true) once the lock was released after the wrapped module ended.
      type: bool
      returned: when the lock was taken
      sample: true
    directory:
      description: The lock directory on the host.
      type: str
      returned: for a host lock
      sample: /run/hostlock
    fleet:
      description: The fleet URL of a fleet lock.
      type: str
      returned: with O(fleet)
      sample: etcd://10.0.0.5:2379
    path:
      description:
        - With O(path), the file whose kernel lock was taken.
        - With O(fleet), the fleet lock's etcd key prefix, as C(hostlock status --fleet) shows it.
      type: str
      returned: with O(path) or O(fleet)
      sample: etcd://10.0.0.5:2379/hostlock/web-restart/
    fence:
      description:
        - With O(fleet), the fencing token of this holding (the etcd key's creation revision), strictly
          increasing per lock name; also top-level RV(fence) and E(HOSTLOCK_FENCE) for the wrapped task.
      type: int
      returned: when a fleet lock was taken
      sample: 4711
    free:
      description: In check mode, whether the lock would be granted now.
      type: bool
      returned: in check mode
    holders:
      description:
        - The holders that kept us waiting (on a conflict), or the current ones (check mode), each as
          RV(hostlock.core.lock_info#module:locks[].holders) lists its fields.
      type: list
      elements: dict
      returned: in check mode and on a conflict
"""
