#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The host side of hostlock.core.locked; the controller side is plugins/action/locked.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: locked
short_description: Run one task on the host while holding a host lock, in one module run
version_added: 0.1.0
description:
  - Takes a hostlock lock on the managed host, runs one module with its arguments, and releases the
    lock, all inside B(one) module run on the host. Other playbooks and the host's own jobs
    (C(hostlock run NAME ...) in cron or a shell) that use the same lock name wait meanwhile.
  - The controller builds the wrapped module exactly as Ansible would run it (its arguments, the play's
    C(module_defaults), the task's C(environment), C(become), check mode, C(--diff), C(no_log)) and sends
    it along; the C(locked) process on the host takes the lock, runs it as its child (forked, reusing
    the Python modules already loaded), and releases the lock once the child has ended.
  - The lock lives exactly as long as the wrapped work. A Ctrl-C'd, SIGTERMed or SIGKILLed
    C(ansible-playbook), or a dropped SSH connection, leaves the lock held until the wrapped module
    ends, and no longer; signals sent to the C(locked) process on the host are forwarded to the module
    and the lock is released after it ends; if that process is killed, its module is killed with it
    (Linux). No lease is involved.
  - The task's result is the wrapped module's result (so C(register), C(changed_when),
    C(failed_when) and C(--diff) work as for the module itself) plus RV(hostlock) with the lock's
    wait and hold times.
  - Modules that come with their own action plugin on the controller (C(template), C(copy),
    C(fetch), C(package), C(service), C(script), C(raw), ...), except C(command) and C(shell), run
    partly on the controller and may run several modules on the host; for them the lock is a heartbeat
    lease on the host (as M(hostlock.core.lock) with O(hostlock.core.lock#module:heartbeat=true) takes),
    held from before the task's first step to after its last, renewed from the controller while the run
    lives, and the task's processes on the host carry the lease's in-flight mark (its environment), so a
    killed run's lease frees the lock only after them (C(raw) takes no environment, so its command is not
    marked). See the collection's docs/ansible.md for exactly what the lock covers. With O(fleet) the lock
    is held on the controller.
  - With O(fleet), the lock is a fleet lock in etcd, shared by every run, control node and host that
    uses the same etcd and name, taken and released by the controller (see O(fleet)).
options:
  name:
    description:
      - The lock's name, the one the host's jobs use too (for example V(apt)).
      - 1 to 100 characters from C([A-Za-z0-9._+@-]), not starting with C(.), C(+), C(@) or C(-).
      - A named lock is hostlock's own (files and records in its directory), shared with
        C(hostlock run NAME) jobs; C(flock(1)) on some file does not see it. Use O(path) for that.
      - Exactly one of O(name) and O(path) is required.
    type: str
  path:
    description:
      - Instead of a named lock, the kernel lock C(flock(1)) takes on this file of the host (and
        C(hostlock flock FILE), C(hostlock run --path FILE)), that is C(flock(2)) on the file, created if missing
        (never truncated or written), so the task and the host's C(flock FILE ...) scripts exclude each other.
      - The file's directory must exist. A FIFO, or a symlink another user planted in a sticky
        world-writable directory (C(/tmp)), is refused.
      - O(mode) applies (C(flock -s)); O(slots), O(directory) and O(fleet) do not. Holders are read from
        C(/proc) (pid, command line, job), as C(hostlock status --path) shows them; a path lock has no
        label, so a task waiting for a path lock its own run holds waits up to O(timeout).
    type: path
    version_added: 0.2.0
  lease:
    description:
      - Not needed any more and ignored (the lock lives as long as the wrapped module); accepted so
        tasks written for earlier versions keep working. Must still be a valid duration when given.
    type: raw
  timeout:
    description:
      - How long to wait for the lock, as seconds (V(90), V(1.5)) or a duration (V(10m), V(1h30m)).
        V(0) tries once. Omit to wait as long as it takes.
    type: raw
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
      - The lock directory on the host; default as for M(hostlock.core.lock). Absolute (or starting
        with C(~)), as there.
    type: str
  label:
    description:
      - Text stored with the lock and shown by C(hostlock status); defaults to the play, task and
        controller (and an AWX or AAP job's id, template and launching user). The controller appends
        C([run ID]) naming its C(ansible-playbook) run.
    type: str
  on_conflict:
    description:
      - When the lock is still held by others after O(timeout), V(fail) fails the task naming the
        holders, V(skip) skips it (the wrapped module does not run).
      - A lock held by a M(hostlock.core.lock) lease of the same playbook run (taken earlier in the run and
        not released yet) fails (or, with V(skip), skips) at once whatever O(timeout) says, as waiting for
        it would never end. A lock held by another host's M(hostlock.core.locked) task of the same run (one
        name delegated to one host, or many inventory aliases of one machine) ends by itself, so the hosts
        take turns, each waiting up to O(timeout).
    type: str
    choices: [fail, skip]
    default: fail
  task:
    description:
      - The one task to run while the lock is held, either as O(task.module) and O(task.args), or in
        the task's own shape, one key naming the module with its arguments, a mapping or a free-form
        string (see the examples).
    type: dict
    required: true
    suboptions:
      module:
        description:
          - The module to run, preferably by its FQCN (for example V(ansible.builtin.apt),
            V(ansible.builtin.command)). The play's C(module_defaults) for it apply.
          - Task keywords that the controller runs itself (C(include_tasks), C(meta), C(set_fact),
            C(debug), C(include_vars), C(wait_for_connection) and the like) cannot be wrapped. Modules
            with their own action plugin (C(template), C(copy), C(package), C(service), C(script),
            C(raw)...) can, under a heartbeat lease (see the description).
        type: str
      args:
        description:
          - Its arguments, as under the module's name in a task. A string is read as Ansible reads it
            there, C(key=value) words, and for C(command), C(shell), C(script) and C(raw) the free-form
            command with its own options (C(creates=), C(chdir=)...) taken out.
        type: raw
  fleet:
    description:
      - Take a B(fleet lock) in etcd instead of a host lock, for example V(etcd://10.0.0.5:2379) or
        V(etcds://etcd1:2379,etcd2:2379/team-a?cacert=/etc/ssl/etcd-ca.pem) (a prefix after the hosts;
        TLS with C(etcds://); a user as C(etcd://user@host:2379), whose password comes from
        E(HOSTLOCK_FLEET_PASSWORD) on the controller).
      - Defaults to E(HOSTLOCK_FLEET) in the B(controller's) environment; V('') means a host lock even
        when E(HOSTLOCK_FLEET) is set.
      - The lock is taken by the B(controller), in the task's worker, never on the host (hosts need no
        route to etcd). It is acquired (waiting up to O(timeout)), then the wrapped task runs exactly as it
        would on its own (so modules with their own action plugin, such as C(copy), C(template) or
        C(service), can be wrapped too), then the lock is released. The wrapped task finds
        E(HOSTLOCK_FENCE) (the fencing token, RV(fence)) and E(HOSTLOCK_FLEET) in its environment.
      - The lock is kept alive by an etcd lease of O(ttl) seconds. If the lease is lost while the task
        runs (etcd unreachable past the O(ttl), the lock broken), the task B(fails) saying so once the
        wrapped module has ended; the module on the host is not stopped (the controller cannot stop it), so
        give downstream systems the fence to refuse a stale holder. If the controller is killed (Ctrl-C,
        SIGTERM, SIGKILL), the lock ends with its lease, within O(ttl) seconds.
      - O(directory) does not apply. Check mode takes no lock; RV(hostlock.free) says whether a real
        run would get it now, and the wrapped task runs in check mode.
    type: str
  ttl:
    description:
      - With O(fleet), the etcd lease's time to live, as seconds or a duration (V(10), V(30s)); default
        10 seconds. A dead controller's lock is free this long after it died; a controller that cannot reach
        etcd this long loses the lock.
    type: raw
  payload:
    description:
      - Internal, set by the action plugin on the controller; do not set it. The wrapped module as built
        for the host, base64-encoded.
    type: str
  controller:
    description:
      - Internal, set by the action plugin on the controller for the local connection; do not set it. The
        C(ansible-playbook) process (C(PID:START) in clock ticks); a wait ends, and the wrapped module never
        runs, once that process is gone, even if its worker lives on (C(kill -9) of C(ansible-playbook)).
    type: str
  heartbeat:
    description:
      - Internal, set by the action plugin on the controller; do not set it. Instead of a lock that ends
        with the wrapped module, take a heartbeat lease of O(lease) seconds (as M(hostlock.core.lock) with
        O(hostlock.core.lock#module:heartbeat=true)), run the wrapped module (the first step of a task that
        has its own action plugin) under it, and keep the lease for the task's next steps; the action
        renews it from the controller and releases it after the task's last step.
    type: bool
    default: false
    version_added: 0.3.0
  compiled:
    description:
      - Internal, set by the action plugin on the controller; do not set it. The hostlock modules as this
        host's interpreter compiled them in an earlier run of this C(ansible-playbook) run, on this host as
        this user (base64); an empty string asks for them. Code of another interpreter is never loaded.
    type: str
    version_added: 0.3.0
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
    details: >-
      Takes no lock: reports whether it is free (RV(hostlock.free)) and who holds it, and runs the
      wrapped module in check mode. RV(hostlock.taken) is V(false) and no hold time is reported.
  diff_mode:
    support: full
    details: Passed through to the wrapped module.
  platform:
    platforms: posix
    details: A killed C(locked) process takes its module with it on Linux (C(PR_SET_PDEATHSIG)).
notes:
  - To hold a lock across several tasks (a block, an C(include_tasks), a role, a play) with the same
    guarantee, use M(hostlock.core.lock) with O(hostlock.core.lock#module:heartbeat=true) at the top of a
    block and pass its RV(hostlock.core.lock#module:environment) to the block; see its examples.
  - Loops work as for any task; each item takes and releases the lock.
  - Owner scope is the task execution, the lock belongs to the C(locked) process running this one task on the host.
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

- name: Run a step while no flock(1) job holds its file (cron - flock /tmp/hostlock-example-rotate.lock rotate.sh)
  hostlock.core.locked:
    path: /tmp/hostlock-example-rotate.lock
    timeout: 10m
    task:
      ansible.builtin.command: /bin/true
  changed_when: false

- name: Change a config file that a cron job reads under the same lock
  hostlock.core.locked:
    name: app-config
    task:
      ansible.builtin.lineinfile:
        path: /tmp/hostlock-example-app.conf
        line: "threads = 4"
        create: true
        mode: "0644"
  register: config

- name: Show how long the lock was waited for and held
  ansible.builtin.debug:
    msg: "waited {{ config.hostlock.waited }}s, held {{ config.hostlock.held }}s"

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

- name: With a fleet lock, modules with an action plugin (copy, template, service) can be wrapped too
  hostlock.core.locked:
    name: lb-config
    fleet: etcd://etcd.example.com:2379
    task:
      ansible.builtin.copy:
        content: "backend app\n"
        dest: /tmp/hostlock-example-lb.conf
        mode: "0644"
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
      description: Seconds the lock was held around the wrapped module, measured on the host.
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
      description: The holders that kept us waiting (on a conflict), or the current ones (check mode).
      type: list
      elements: dict
      returned: in check mode and on a conflict
"""
import base64

from ansible.module_utils.basic import AnsibleModule

# First: the engine is then compiled once, not twice, from the AnsiballZ zip; or not at all, from code this
# host's interpreter compiled in an earlier run (the `compiled` option): see _zipimport. The engine is
# imported in main(), once the options are read.
from ansible_collections.hostlock.core.plugins.module_utils import _zipimport

# The lock's options, which the action (plugins/action/locked.py) validates on the controller too.
LOCK_OPTIONS = dict(
    name=dict(type="str"),
    path=dict(type="path"),
    lease=dict(type="raw"),
    timeout=dict(type="raw"),
    mode=dict(type="str", choices=["exclusive", "shared"], default="exclusive"),
    slots=dict(type="int", default=1),
    # str, not path: the directory is on the managed host, the module expands it there.
    directory=dict(type="str"),
    label=dict(type="str"),
    on_conflict=dict(type="str", choices=["fail", "skip"], default="fail"),
    # handled by the action on the controller (plugin_utils/_fleet.py); never sent to the host
    fleet=dict(type="str"),
    ttl=dict(type="raw"),
)
MUTUALLY_EXCLUSIVE = [("name", "path")]
REQUIRED_ONE_OF = [("name", "path")]
ARGUMENT_SPEC = dict(
    LOCK_OPTIONS,
    # the action's `task` ({MODULE: ARGS}) as it sends it: module and args apart
    task=dict(
        type="dict",
        required=True,
        options=dict(module=dict(type="str"), args=dict(type="raw")),
    ),
    # the wrapped module's arguments can hold secrets: never echo the payload back (invocation, logs)
    payload=dict(type="str", no_log=True),
    controller=dict(type="str"),
    heartbeat=dict(type="bool", default=False),
    # code, not a secret: no_log keeps ~300 kB out of the invocation and the host's log
    compiled=dict(type="str", no_log=True),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           mutually_exclusive=MUTUALLY_EXCLUSIVE, required_one_of=REQUIRED_ONE_OF)
    if module.params["compiled"]:
        try:
            _zipimport.preload(base64.b64decode(module.params["compiled"]))
        except ValueError:  # not base64: compile from the zip, as without it
            pass
    run(module)


def with_compiled(module: AnsibleModule, info: dict) -> dict:
    """`info`, with this run's compiled engine when the controller asked for it and this run compiled any."""
    if module.params["compiled"] is not None and _zipimport.compiled_here():
        info["compiled"] = base64.b64encode(_zipimport.exported()).decode("ascii")
    return info


def run(module: AnsibleModule) -> None:
    """Take the lock, run the wrapped module under it, and answer with its result and ours."""
    from ansible_collections.hostlock.core.plugins.module_utils._common import (
        HEARTBEAT_LEASE,
        RESULT_KEY,
        describe_holders,
        engine_message,
        lease_marker,
        live_holders,
        path_holder_dicts,
        path_params_error,
        would_acquire,
    )
    from ansible_collections.hostlock.core.plugins.module_utils._runner import (
        ControllerGone,
        LeaseTake,
        SelfWait,
        detach,
        emit_result,
        run_leased,
        run_locked,
        run_payload,
    )
    from ansible_collections.hostlock.core.plugins.module_utils.hostlock import (
        HostlockError,
        Lock,
        LockTimeout,
        parse_duration,
        status,
    )
    from ansible_collections.hostlock.core.plugins.module_utils.hostlock.host.pathlock import PathLock

    def holder_dicts(name: str, directory: str | None, path: str | None = None) -> list:
        if path:
            return path_holder_dicts(path)
        return [h.as_dict() for h in status(name, directory=directory).holders]

    p = module.params
    name = p["name"] if p["name"] is not None else p["path"]  # "" is a name, and an empty one
    path_error = path_params_error(p)
    if path_error:
        module.fail_json(msg=f"lock {name}: {path_error}")
    wrapped = (p["task"] or {}).get("module") or "?"
    if p["fleet"]:
        module.fail_json(msg="fleet locks are taken by the controller (the hostlock.core.locked action), never on "
                         "the host: run this module from a task, not on its own")
    if not p["payload"]:
        module.fail_json(msg="hostlock.core.locked runs through its action plugin, which builds the wrapped "
                         "module: run it from a playbook task (payload missing)")
    try:
        timeout = None if p["timeout"] is None else parse_duration(p["timeout"], "timeout")
        lease = HEARTBEAT_LEASE if p["lease"] is None else parse_duration(p["lease"], "lease")
        payload = base64.b64decode(p["payload"])
        if p["heartbeat"] and not module.check_mode:
            lock: Lock | PathLock | LeaseTake = LeaseTake(
                name, lease, mode=p["mode"], slots=p["slots"], directory=p["directory"], label=p["label"],
                path=p["path"],
            )
        elif p["path"]:
            lock = PathLock(p["path"], mode=p["mode"])
        else:
            lock = Lock(name, mode=p["mode"], slots=p["slots"], directory=p["directory"], label=p["label"])
    except (HostlockError, ValueError, TypeError) as e:
        module.fail_json(msg=f"lock {name}: {engine_message(e)}")
    marker = lease_marker(p["label"])  # the run's leases, never its tasks: those end by themselves
    info = dict(name=name, module=wrapped, directory=lock.directory, taken=False, waited=0.0)
    if p["path"]:
        info.update(path=p["path"], directory=None)
    # Out of reach of the controller's signals and of the `ssh -tt` terminal's hangup (see _runner.detach).
    detach()

    if module.check_mode:
        holders = holder_dicts(name, p["directory"], p["path"])
        info.update(event="check", free=would_acquire(holders, p["mode"], p["slots"]), holders=holders)
        result, _pid = run_payload(payload)
        result[RESULT_KEY] = with_compiled(module, info)
        emit_result(result)

    def holders_of() -> list:
        return holder_dicts(name, p["directory"])

    try:
        # A path lock has no record to carry a run marker: nothing to tell our own run's holders apart by.
        if isinstance(lock, LeaseTake):
            result = run_leased(lock, payload, timeout, holders_of=None if p["path"] else holders_of,
                                marker=None if p["path"] else marker, controller=p["controller"])
        else:
            result = run_locked(lock, payload, timeout, holders_of=None if p["path"] else holders_of,
                                marker=None if p["path"] else marker, module=wrapped, controller=p["controller"])
    except ControllerGone:  # nobody reads a result any more: the wrapped module never ran
        module.fail_json(msg=f"lock {name}: the controller is gone (its connection closed) while we waited; "
                         f"{wrapped} did not run", **{RESULT_KEY: info})
    except SelfWait as e:
        info.update(event="self", holders=e.holders)
        if p["on_conflict"] == "skip":
            module.exit_json(skipped=True, changed=False, msg=f"lock {name} is held by this same playbook run "
                             f"({describe_holders(e.holders)}); {wrapped} did not run", **{RESULT_KEY: info})
        module.fail_json(
            msg=f"lock {name} is held by this same playbook run ({describe_holders(e.holders)}): a run never "
            "waits for itself. Inside a held hostlock.core.lock of this name, run the task without "
            "hostlock.core.locked; for several hosts sharing a lock delegated to one host, take it once "
            "(run_once: true) or per host with different names",
            **{RESULT_KEY: info},
        )
    except LockTimeout as e:
        holders = path_holder_dicts(p["path"]) if p["path"] else [h.as_dict() for h in e.holders]
        info.update(event="conflict", holders=holders, waited=timeout)
        where, see = ("", f"--path {name}") if p["path"] else (f" in {lock.directory}", name)
        msg = (f"lock {name}{where} is still held after {timeout}s by "
               f"{describe_holders(live_holders(holders))} (see: hostlock status {see}); {wrapped} did not run")
        if p["on_conflict"] == "skip":
            module.exit_json(skipped=True, changed=False, msg=msg, **{RESULT_KEY: info})
        module.fail_json(msg=msg, **{RESULT_KEY: info})
    except HostlockError as e:
        module.fail_json(msg=f"lock {name}: {engine_message(e)}", **{RESULT_KEY: info})
    info.update(result.pop(RESULT_KEY, {}), event="locked", taken=True)
    result[RESULT_KEY] = with_compiled(module, info)
    emit_result(result)


if __name__ == "__main__":
    main()
