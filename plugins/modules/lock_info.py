#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lock_info
short_description: List host locks with their holders, leases, waiters and stale state
version_added: 0.1.0
description:
  - Reports every hostlock lock in a lock directory of the managed host, or one lock, with who holds
    it (process, user, command or C(hostlock run) job, label), when leases run out, how many
    processes wait, and whether a record is stale (its owner proven dead or its lease ended).
  - The same view as C(hostlock status --json) on the host; needs nothing there but Python 3.8+.
  - Takes, changes and releases nothing.
options:
  name:
    description:
      - Report only this lock. A lock nobody has used yet is reported with no holders.
      - Omit to report every lock in the directory.
    type: str
  directory:
    description:
      - The lock directory to read (see O(hostlock.core.lock#module:directory)); RV(directory) says which was read.
        One that does not exist fails the task, rather than report every lock in it free.
  fleet:
    description:
      - Read fleet locks in etcd instead of the host's locks, for example V(etcd://10.0.0.5:2379); the controller
        reads etcd and the host is not contacted. Defaults to E(HOSTLOCK_FLEET) in the controller's environment;
        V('') reads host locks even when it is set.
      - Each entry has the shape of a host lock's, with V(etcd) as its RV(locks[].mechanism), the etcd key prefix
        as its RV(locks[].path) and each holder's V(fence); RV(fleet) replaces RV(directory).
extends_documentation_fragment:
  - hostlock.core.lock.where
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: A controller-side action reads fleet locks (O(fleet)) itself; host locks are read on the host.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: The module only reads; it runs the same in check mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: hostlock.core.lock
  - module: hostlock.core.locked
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
- name: List every lock on the host
  hostlock.core.lock_info:
  register: locks

- name: Show who holds what
  ansible.builtin.debug:
    msg: "{{ item.name }}: {{ item.holders | map(attribute='pid') | list }}"
  loop: "{{ locks.locks }}"
  loop_control:
    label: "{{ item.name }}"

- name: Wait until nobody holds the apt lock any more
  hostlock.core.lock_info:
    name: apt
  register: apt_lock
  until: apt_lock.locks[0].holders | rejectattr('stale') | list | length == 0
  retries: 30
  delay: 2

- name: Who holds the fleet-wide deploy lock (read from etcd by the controller)
  hostlock.core.lock_info:
    name: deploy
    fleet: etcd://etcd.example.com:2379
  run_once: true
  register: fleet_deploy
"""

RETURN = r"""
directory:
  description: The lock directory that was read.
  returned: for host locks (without O(fleet))
  type: str
  sample: /run/hostlock
fleet:
  description: The fleet URL that was read.
  returned: with O(fleet)
  type: str
  sample: etcd://10.0.0.5:2379
locks:
  description: One entry per lock, sorted by name.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The lock's name.
      type: str
    path:
      description: The lock file (a fleet lock's etcd key prefix).
      type: str
    mechanism:
      description: How the lock is held (V(ofd), V(flock) or V(record); V(etcd) for a fleet lock).
      type: str
    slots:
      description: Number of holders the lock admits (1, or a semaphore's size).
      type: int
    holders:
      description:
        - Its holders, each a holder record as C(hostlock status --json) prints it plus the engine's
          extras (the same fields as M(hostlock.core.lock)'s RV(hostlock.core.lock#module:holders)).
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
            Whether the recorded process is alive (pid, start time and boot id match), V(null) when it cannot
            be told from here.
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
          description: >-
            Why the record is not trusted (a forged record, something planted at the lock path), or V(null).
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
          description: >-
            Fleet locks, the holder's fencing token (its etcd key's create revision); V(null) for host locks.
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
    waiters:
      description: Processes (for a fleet lock, etcd keys) waiting for the lock now.
      type: int
    stale:
      description: Whether stale records are left over (they block nobody; C(hostlock break) removes them).
      type: bool
    state:
      description: >-
        V(held) (a live holder), V(stale) (only left-over records), V(refused) (something is wrong at the
        lock's path, see RV(locks[].problem)), or V(free).
      type: str
    problem:
      description: >-
        Why the lock's path was refused (a symlink, FIFO or device planted there, a corrupt header) or a
        holder's record is not trusted (forged); V(null) when all is well.
      type: str
    corrupt:
      description: Whether the lock file's header is corrupt (nobody can lock it until it is removed).
      type: bool
    held:
      description: Whether it has any holder record (live or stale).
      type: bool
    figures:
      description: >-
        The lock's numbers, as C(hostlock status --format openmetrics) exports them (one function makes
        both): V(holders) (live), V(stale_holders), V(waiters), V(slots), V(oldest_hold_seconds) (how long the
        oldest live holder has held it; 0 when free) and V(problem) (1 when the path was refused or a record
        is forged).
      type: dict
      sample: {holders: 1, stale_holders: 0, waiters: 2, slots: 1, oldest_hold_seconds: 31.5, problem: 0}
    directory:
      description: The lock directory it is in (for a fleet lock, the fleet URL).
      type: str
  sample:
    - name: apt
      path: /run/hostlock/apt.lock
      mechanism: ofd
      slots: 1
      holders:
        - pid: 4242
          user: root
          mode: exclusive
          lease_expires: 1767225600.1
          stale: false
      waiters: 1
      stale: false
      state: held
      problem: null
      corrupt: false
      held: true
      directory: /run/hostlock
"""

import os

from ansible.module_utils.basic import AnsibleModule

# First: the engine below is then compiled once, not twice, from the AnsiballZ zip (see _zipimport).
from ansible_collections.hostlock.core.plugins.module_utils import _zipimport  # noqa: F401  # pylint: disable=unused-import
from ansible_collections.hostlock.core.plugins.module_utils._argspec import LOCK_INFO
from ansible_collections.hostlock.core.plugins.module_utils._common import directory_params_error
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import (
    HostlockError,
    default_directory,
    list_locks,
    status,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.metrics import with_figures


def collect(name: str | None, directory: str | None) -> dict:
    found = [status(name, directory=directory)] if name else list_locks(directory=directory)
    locks = sorted((with_figures(s) for s in found), key=lambda s: s.get("name") or "")
    resolved = found[0].directory if found else (directory or default_directory())
    return dict(changed=False, locks=locks, directory=resolved)


def main() -> None:
    module = AnsibleModule(
        # fleet is handled by the action on the controller (plugin_utils/_fleet.py); never sent to the host
        argument_spec=LOCK_INFO,
        supports_check_mode=True,
    )
    if module.params["fleet"]:
        module.fail_json(msg="fleet locks are read by the controller (the hostlock.core.lock_info action), never on "
                         "the host: run this module from a task, not on its own")
    error = directory_params_error(module.params)
    if error:
        module.fail_json(msg=f"lock {module.params['name'] or '(every lock)'}: {error}")
    directory = module.params["directory"]
    if directory and not os.path.isdir(directory):
        # A typo would read as "free" (nothing is locked in a directory that is not there): say so instead.
        module.fail_json(msg=f"lock directory {directory} does not exist (or is not a directory): nothing there "
                         "can be read; give the module's directory: option the directory the locks use",
                         directory=directory)
    try:
        module.exit_json(**collect(module.params["name"], directory))
    except (HostlockError, ValueError) as e:
        module.fail_json(msg=str(e), directory=getattr(e, "directory", None))


if __name__ == "__main__":
    main()
