#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: hostlock.core.locked is an action plugin (plugins/action/locked.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: locked
short_description: Run one task while holding a host lock
version_added: 0.1.0
description:
  - Takes a hostlock lock on the managed host, runs one module (or action) with its arguments, and
    releases the lock, whatever the module did. Other playbooks and the host's own jobs
    (C(hostlock run NAME ...) in cron or a shell) that use the same lock name wait meanwhile.
  - The lock is a lease held by a small detached process on the host (see M(hostlock.core.lock)).
    It is released right after the wrapped module, also when that module fails; when the
    connection breaks or the controller dies mid-way, the lease frees the lock once O(lease)
    seconds have passed.
  - The task's result is the wrapped module's result (so C(register), C(changed_when),
    C(failed_when) and C(--diff) work as for the module itself) plus RV(hostlock) with the lock's
    wait and hold times.
  - Costs two module runs on top of the wrapped one (take and release), sharing its remote
    temporary directory.
options:
  name:
    description:
      - The lock's name, the one the host's jobs use too (for example V(apt)).
      - 1 to 100 characters from C([A-Za-z0-9._+@-]), not starting with C(.), C(+), C(@) or C(-).
    type: str
    required: true
  lease:
    description:
      - Seconds the lock is kept at most. Make it longer than the wrapped task can take; a lease that runs
        out mid-task frees the lock early (the task then warns).
      - Bounds how long a lost connection or a killed controller keeps the lock.
    type: float
    required: true
  timeout:
    description:
      - Seconds to wait for the lock; V(0) tries once. Omit to wait as long as it takes.
    type: float
  mode:
    description:
      - V(exclusive) admits one holder (or O(slots) holders); V(shared) admits any number of shared
        holders and no exclusive one.
    type: str
    choices: [exclusive, shared]
    default: exclusive
  slots:
    description:
      - With a value above 1, a semaphore admitting that many holders at once (O(mode=exclusive) only).
    type: int
    default: 1
  directory:
    description:
      - The lock directory on the host; default as for M(hostlock.core.lock).
    type: str
  label:
    description:
      - Text stored with the lock and shown by C(hostlock status); defaults to the play, task and
        controller.
    type: str
  on_conflict:
    description:
      - When the lock is still held by others after O(timeout), V(fail) fails the task naming the
        holders, V(skip) skips it (the wrapped module does not run).
    type: str
    choices: [fail, skip]
    default: fail
  task:
    description:
      - The one task to run while the lock is held.
    type: dict
    required: true
    suboptions:
      module:
        description:
          - The module or action to run, preferably by its FQCN (for example V(ansible.builtin.apt),
            V(ansible.builtin.command), V(ansible.builtin.template)). The play's C(module_defaults)
            for it apply.
          - Task keywords that the controller runs itself (C(include_tasks), C(meta), C(set_fact),
            C(debug) and the like) cannot be wrapped.
        type: str
        required: true
      args:
        description:
          - Its arguments, as under the module's name in a task.
        type: dict
        default: {}
extends_documentation_fragment:
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
    details: Takes no lock; reports whether it is free (RV(hostlock.free)) and runs the wrapped module in check mode.
  diff_mode:
    support: full
    details: Passed through to the wrapped module.
  platform:
    platforms: posix
notes:
  - To hold a lock across several tasks, use M(hostlock.core.lock) to take it and release it.
  - Loops work as for any task; each item takes and releases the lock.
seealso:
  - module: hostlock.core.lock
  - module: hostlock.core.lock_info
  - plugin: hostlock.core.serialize
    plugin_type: callback
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
- name: Install curl under the apt lock, waiting up to 5 minutes for the host's own apt jobs
  hostlock.core.locked:
    name: apt
    lease: 600
    timeout: 300
    task:
      module: ansible.builtin.apt
      args:
        name: curl
        state: present

- name: Run the nightly job's script now, unless the nightly job is running
  hostlock.core.locked:
    name: nightly-report
    lease: 120
    timeout: 0
    on_conflict: skip
    task:
      module: ansible.builtin.command
      args:
        cmd: /bin/true
  changed_when: false

- name: Render a config file that a cron job reads under a shared lock
  hostlock.core.locked:
    name: app-config
    lease: 60
    task:
      module: ansible.builtin.copy
      args:
        content: "threads = 4\n"
        dest: /tmp/hostlock-example-app.conf
        mode: "0644"
  register: config

- name: Show how long the lock was waited for and held
  ansible.builtin.debug:
    msg: "waited {{ config.hostlock.waited }}s, held {{ config.hostlock.held }}s"
"""

RETURN = r"""
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
      description: The wrapped module, as written.
      type: str
      sample: ansible.builtin.apt
    waited:
      description: Seconds spent waiting for the lock on the host.
      type: float
      sample: 0.002
    held:
      description: Seconds the lock was held around the wrapped module, measured on the controller.
      type: float
      sample: 1.73
    released:
      description:
        - Whether the lock was released right after the wrapped module. V(false) when the host could
          not be reached to release it; its lease frees it then.
      type: bool
      sample: true
    lease:
      description: The lease (seconds).
      type: float
      sample: 600.0
    lease_ran_out:
      description: Present and V(true) when the lease ended before the wrapped module did.
      type: bool
      returned: when the lease ran out during the task
    directory:
      description: The lock directory on the host.
      type: str
      sample: /run/hostlock
    free:
      description: In check mode, whether the lock would be granted now.
      type: bool
      returned: in check mode
    holders:
      description: In check mode, the current holders (see M(hostlock.core.lock)).
      type: list
      elements: dict
      returned: in check mode
"""
