# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: serialize
type: aggregate
short_description: Run plays one after the other when two ansible-playbook runs target the same hosts
version_added: 0.1.0
description:
  - On the control node, takes a hostlock lock for every host of a play, in one global order, when the
    play starts (each C(serial) batch on its own), and releases them when the next play starts or the
    playbook ends (O(scope=play)), or holds them to the end of the playbook (O(scope=playbook)). A
    second C(ansible-playbook) run whose play shares a host waits; runs on disjoint hosts go on in
    parallel. Locking in one global order means two runs never deadlock.
  - The controller locks are kernel locks held by the C(ansible-playbook) process, so they are freed at
    once when it exits or is killed, even with SIGKILL. A killed run's task may still be running on a
    host then; so every task of a serialized play carries a marker in its environment
    (E(HOSTLOCK_SERIALIZE_HOST), E(HOSTLOCK_SERIALIZE_RUN)), and a play starts with a task that waits
    on a host until no process of an earlier run carrying that host's marker is left
    (O(wait_in_flight)), on each host whose lock's last holder may have left work there (it did not end its
    hold cleanly, or this run knows nothing of the host; with O(fleet), every host).
  - File descriptors stay bounded whatever the play's size. Hosts hash into 64 buckets; a small play
    takes each bucket it touches shared and each host exclusive; a play too large for a quarter of
    the descriptor limit (C(ulimit -n)) takes its buckets exclusive and no host locks. Both kinds
    exclude each other correctly; large plays only serialize more coarsely.
  - Everything it prints goes through Ansible's display to standard error (never to standard output,
    which belongs to the stdout callback, for example a JSON one).
  - It prints whom it waits for, and at the end of each playbook a recap of the lock waits and holds
    reported by M(hostlock.core.lock) and M(hostlock.core.locked) tasks, with a warning for every
    lease the run left held on a host.
  - In check mode (C(--check)) it takes no lock; it says which hosts are busy.
  - B(Fail closed.) Every setting is checked when the callback loads; one it cannot honour (a timeout of
    V(30x) or V(-1), an unknown O(scope), a boolean of V(maybe), a malformed O(fleet) URL or O(prefix))
    ends C(ansible-playbook) before its first play with one line naming the setting and the accepted forms,
    and status 64. ansible-core would otherwise drop a callback whose options fail to load with only a
    warning, and run every play unserialized. So does a setting written where the callback never reads it,
    a section spelt unlike C([hostlock_serialize]), a key there or a E(HOSTLOCK_SERIALIZE_*) variable that
    names no option.
  - A callback that is not loaded cannot say so; start each play that must never run unserialized with
    M(hostlock.core.serialized), which fails the host unless this callback holds it in this run, naming the
    missing or misspelt setting (C(callback_whitelist), a misspelt C(callbacks_enabled) entry).
  - In an AWX or AAP job the lock labels, and so C(hostlock status) and every waiting line, name the job
    (C(awx_job_id), its template and launching user, or their C(tower_*) names; shown, never trusted); a
    waiting run says its place in line.
  - A callback cannot fail a run by raising (ansible-core turns its exceptions into warnings). When a
    host stays busy past O(timeout), or at once with O(fail_fast), this callback ends the run itself;
    it prints the holders and exits C(ansible-playbook) with status 75 (EX_TEMPFAIL, "try again
    later"), before the play runs any task of its own. A local error (cannot open the lock directory,
    out of file descriptors) ends the run with the hostlock command's exit code for it (64-77, never
    75), so a retry loop on 75 does not retry it forever.
  - Only the inventory hosts a play targets are locked; hosts reached through C(delegate_to) are not.
    Runs must name a host the same way (inventory hostname) to exclude each other.
  - With O(fleet), the per-host locks are B(fleet locks in etcd) instead of locks on this control node,
    so runs on different control nodes (AWX/controller nodes, CI runners, laptops) that share etcd take
    turns on their common hosts exactly as runs on one control node do. Each lock is kept alive by an
    etcd lease of O(ttl) seconds. A killed run's hosts are free within O(ttl) (the next run then still
    waits for the killed run's tasks on the hosts, see O(wait_in_flight)); a run that loses a lock (etcd
    unreachable past the O(ttl)) starts no further task and ends with status 79.
requirements:
  - Enable it in C(ansible.cfg) (C(callbacks_enabled = hostlock.core.serialize) under C([defaults]))
    or with C(ANSIBLE_CALLBACKS_ENABLED=hostlock.core.serialize).
  - For O(wait_in_flight), managed hosts with C(/proc) (Linux) and, as for any module, Python (the wait is the
    callback's internal module C(hostlock.core.serialize_host)).
options:
  fleet:
    description:
      - Lock each host in etcd rather than on this control node, for example V(etcd://10.0.0.5:2379) or
        V(etcds://etcd1:2379,etcd2:2379/team-a?cacert=/etc/ssl/etcd-ca.pem) (a key prefix after the
        hosts; TLS with C(etcds://); a user as C(etcd://user@host:2379), whose password comes from
        E(HOSTLOCK_FLEET_PASSWORD)). Every run, on every control node, that must exclude the others
        uses the same etcd and the same O(prefix).
      - E(HOSTLOCK_SERIALIZE_FLEET) wins over E(HOSTLOCK_FLEET); V('') means locks on this control
        node. O(directory) does not apply then.
      - Managed hosts need no route to etcd; only this control node talks to it.
    type: str
    env:
      - name: HOSTLOCK_FLEET
      - name: HOSTLOCK_SERIALIZE_FLEET
    ini:
      - section: hostlock_serialize
        key: fleet
  ttl:
    description:
      - With O(fleet), the time to live of each lock's etcd lease, a duration as everywhere in the
        collection (V(10), V(30s), V(2m)). A killed run's hosts are free this long after it died; a run
        that cannot reach etcd this long loses its locks.
      - A value that is not a duration greater than 0 stops the run before its first task (status 64).
    type: str
    default: "10"
    env:
      - name: HOSTLOCK_SERIALIZE_TTL
    ini:
      - section: hostlock_serialize
        key: ttl
  directory:
    description:
      - Lock directory on the control node. Every run that must exclude the others uses the same one.
      - Defaults to the hostlock default (C($HOSTLOCK_DIR), else C(/run/hostlock) when usable,
        else a per-user runtime directory).
      - An absolute path (C(~) expands). An empty or relative value stops the run (exit 64) before its
        first task, because runs started from other directories would each resolve it to a directory of
        their own and never exclude each other.
    type: str
    env:
      - name: HOSTLOCK_SERIALIZE_DIRECTORY
    ini:
      - section: hostlock_serialize
        key: directory
  timeout:
    description:
      - How long to wait for a play's hosts (the controller locks, then the in-flight work of earlier
        runs on each host), a duration as everywhere in the collection (V(90), V(30s), V(30m), V(1h30m)),
        or V(forever) (the default) to wait as long as it takes.
      - When the time is up the run ends with status 75, naming the holders.
      - Any other value (a negative number, V(abc)) stops the run before its first task with one line
        naming the setting (status 64); a setting that cannot be honoured never turns serialization off.
    type: str
    default: forever
    env:
      - name: HOSTLOCK_SERIALIZE_TIMEOUT
    ini:
      - section: hostlock_serialize
        key: timeout
  fail_fast:
    description:
      - End the run at once (status 75, holders named) when any host of a play is locked by another
        run, or still runs an earlier run's task, instead of waiting.
      - A boolean (V(true)/V(false), V(yes)/V(no), V(1)/V(0), V(on)/V(off)); anything else stops the run
        before its first task (status 64) instead of being read as false.
    type: str
    default: "false"
    env:
      - name: HOSTLOCK_SERIALIZE_FAIL_FAST
    ini:
      - section: hostlock_serialize
        key: fail_fast
  scope:
    description:
      - V(play) locks each play's hosts when it starts and keeps only what the next play can keep in
        lock order. V(playbook) locks, when the playbook starts, the hosts of all its plays and holds
        them until it ends, so no other run gets in between two plays.
      - With V(playbook), hosts that the callback cannot work out in advance (a play whose C(hosts)
        uses a variable only known later) are added when their play starts.
      - V(play) or V(playbook); any other value stops the run before its first task (status 64).
    type: str
    default: play
    env:
      - name: HOSTLOCK_SERIALIZE_SCOPE
    ini:
      - section: hostlock_serialize
        key: scope
  wait_in_flight:
    description:
      - Start each play with a task that waits on a host until no task of an earlier run (one that
        was killed, or a C(poll=0) async job it left) still runs there, and mark this run's tasks so
        that later runs can wait for them in turn.
      - The wait runs only on hosts whose lock's last holder may have left work; a run that ends its hold
        on a host cleanly (every task it started there came back, none unreachable, timed out by the
        C(timeout) keyword or left as an async job) says so in a file of its own user in O(directory); the
        next run of that user skips the wait there unless anyone's run held the host since. With O(fleet),
        and for plays too large for host locks, every host waits.
      - It sees the processes the connecting (or C(become)) user may inspect; runs that must exclude
        each other should connect as the same user, or as root.
      - For a host without C(/proc) or Python (network devices, Windows), set the host variable
        C(hostlock_serialize_wait_in_flight=false) to skip the wait there. Any value that is not a boolean
        (a typo) fails that host before its first task, with one line, rather than skip the wait.
      - A boolean (V(true)/V(false), V(yes)/V(no), V(1)/V(0), V(on)/V(off)); anything else stops the run
        before its first task (status 64) instead of being read as false.
    type: str
    default: "true"
    env:
      - name: HOSTLOCK_SERIALIZE_WAIT_IN_FLIGHT
    ini:
      - section: hostlock_serialize
        key: wait_in_flight
  prefix:
    description:
      - Lock names are this prefix followed by the inventory hostname (characters a lock name cannot
        hold are replaced, and a short hash keeps such names apart); bucket locks are this prefix
        followed by C(.bucket-NN). Every run that must exclude the others uses the same prefix.
    type: str
    default: ansible-host@
    env:
      - name: HOSTLOCK_SERIALIZE_PREFIX
    ini:
      - section: hostlock_serialize
        key: prefix
  recap:
    description:
      - Print the lock recap at the end of each playbook.
      - A boolean (V(true)/V(false), V(yes)/V(no), V(1)/V(0), V(on)/V(off)); anything else stops the run
        before its first task (status 64) instead of being read as false.
    type: str
    default: "true"
    env:
      - name: HOSTLOCK_SERIALIZE_RECAP
    ini:
      - section: hostlock_serialize
        key: recap
notes:
  - Without O(fleet) the locks live on the control node, and two control nodes do not see each other's
    runs; with O(fleet) they do.
  - C(hostlock status) on the control node (C(hostlock status --fleet URL) anywhere, with O(fleet))
    lists the runs holding or waiting for hosts.
  - The in-flight wait is the play's first task after fact gathering (which only reads the host); it
    is tagged C(always), so C(--skip-tags always) or C(--start-at-task) skip it.
seealso:
  - module: hostlock.core.serialized
  - module: hostlock.core.lock
  - module: hostlock.core.locked
author:
  - hostlock maintainers (@hostlock)
"""

import hashlib
import os
import time
import typing as t
import uuid

from ansible import context
from ansible.plugins.callback import CallbackBase
from ansible.template import Templar
from ansible_collections.hostlock.core.plugins.module_utils._common import describe_holders
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import (
    HostlockError,
    Lock,
    LockTimeout,
    default_directory,
    status,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.errors import (
    EX_LOST,
    EX_TEMPFAIL,
    EX_USAGE,
    describe_error,
    error_exit_code,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.text import one_line
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.proc.deathsig import die_with_this_process
from ansible_collections.hostlock.core.plugins.plugin_utils import _serialize_state
from ansible_collections.hostlock.core.plugins.plugin_utils._controller import controller_id
from ansible_collections.hostlock.core.plugins.plugin_utils._job import job_text
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_config import setting_mistakes
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_handover import Handover
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_plan import (
    FLEET_BUDGET,
    OPTIONS,
    Key,
    bucket_name,
    bucket_of,
    fd_budget,
    lock_name,
    plan,
    real_work_in_check_mode,
    settings,
)
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_play import WAIT_TASK, mark_play
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_recap import Recap

# Exit status when a host stays busy: EX_TEMPFAIL from sysexits.h, "try again later" (as lckdo).
EXIT_BUSY = EX_TEMPFAIL
# A run that lost a fleet lock ends with the code `hostlock run --fleet` exits with then (docs/cli.md).
EXIT_LOST = EX_LOST


def _may_outlive(data: dict) -> bool:
    """Whether a task's result leaves its work possibly running on the host after the controller moved on:
    an async job not seen to finish (poll: 0, or its poll gave up), or a task the `timeout` keyword ended."""
    results = data.get("results")
    items: list = results if isinstance(results, list) else []
    for item in [data, *items]:
        if isinstance(item, dict) and (item.get("timedout") or item.get("unreachable") or
                                       (item.get("ansible_job_id") and not item.get("finished"))):
            return True
    return False


def _clock() -> str:
    return time.strftime("%H:%M:%S")


class _EndRun(SystemExit):
    """Ends ansible-playbook: SystemExit is not an Exception, so ansible-core's handlers let it pass."""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hostlock.core.serialize"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: t.Any, **kwargs: t.Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[Key, tuple[str, Lock, str, float]] = {}  # key -> (name, lock, mode, monotonic taken)
        self._playbook = "?"
        self._job = ""  # the AWX/AAP job this run is, from its extra vars: shown in labels, never trusted
        self._check = False
        self._run_id = uuid.uuid4().hex  # marks this run's tasks on the hosts
        self._planned: set[str] = set()  # scope=playbook: every host of the playbook found so far
        self._recap = Recap()
        # The in-flight wait, only where it is needed (plugin_utils/_serialize_handover.py): hosts held whose
        # earlier holder may have left work (no wait has cleared them yet), hosts where this run's own work
        # may outlive what it saw of it, and the tasks started on each host whose result has not come back.
        self._handover: Handover | None = None
        self._fresh: list[Key] = []  # locks taken in this _lock_hosts call, not yet said dirty
        self._needs_wait: set[str] = set()
        self._unclean: set[str] = set()
        self._running: dict[str, set[str]] = {}
        self._lost: list[str] = []  # fleet locks whose etcd lease ended while held (from keep-alive threads)
        self._opt: dict[str, t.Any] = {}  # the checked options (set_options)
        self._reporting = False  # a --check play the callback only reports on

    def set_options(self, task_keys: t.Any = None, var_options: t.Any = None, direct: t.Any = None) -> None:
        """Load and check every option now, and end the run here if one cannot be honoured.

        ansible-core loads callbacks before the first play and turns an Exception raised here into the
        warning "Failed to load callback plugin", then runs without it: serialization silently off. A
        SystemExit passes its handler, so a bad setting ends ansible-playbook (64) before anything runs.
        """
        try:
            super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
            self._opt = settings(self.get_option)
            mistakes = setting_mistakes(OPTIONS)
            if mistakes:  # meant for us, never read: running with the defaults instead would be silent
                raise ValueError("; ".join(mistakes))
        except Exception as e:  # noqa: BLE001 - any failure to load a setting must stop the run, not skip us
            self._display.error(f"hostlock.core.serialize: {one_line(str(e))}; no play was run")
            raise _EndRun(EX_USAGE) from None
        _serialize_state.register(self)  # what hostlock.core.serialized asks, in this process only
        # The workers die with this process: SIGKILLed (or OOM-killed), ansible-playbook cannot end them, and
        # one busy on the controller (a slow lookup, a transfer) would start its task on a host after the
        # next run found nothing of this one's there, and began.
        if not die_with_this_process():
            self._display.vvv("hostlock.core.serialize: no prctl(2) here: the workers of a SIGKILLed run go on")

    # -- output: standard error through Ansible's display; stdout belongs to the stdout callback ----
    def _say(self, msg: str) -> None:
        self._display.display(msg, stderr=True)

    # -- what hostlock.core.serialized asks (plugin_utils/_serialize_state.py) -----------------------
    def holds(self, host: str) -> str | None:
        bucket = bucket_of(host)
        for key in ((bucket, 1, host), (bucket, 0, "")):
            held = self._held.get(key)
            if held is not None and held[2] == "exclusive" and held[0] not in self._lost:
                where = f" in {self._fleet()}" if self._fleet() else ""
                return f"hostlock.core.serialize holds lock {held[0]}{where} for this run"
        return None

    def check_only(self) -> bool:
        return self._reporting

    # -- options ---------------------------------------------------------------------------------
    def _timeout(self) -> float | None:
        """Seconds to wait for a play's hosts; None: forever (fail_fast: not at all)."""
        return 0.0 if self._opt["fail_fast"] else self._opt["timeout"]

    def _fleet(self) -> str | None:
        """The fleet URL, or None for locks on this control node."""
        return self._opt["fleet"]

    # -- control-node host locks -----------------------------------------------------------------
    def v2_playbook_on_start(self, playbook: t.Any) -> None:
        self._playbook = os.path.basename(getattr(playbook, "_file_name", None) or "?")
        self._check = bool(context.CLIARGS.get("check"))
        self._planned = set()
        plays = playbook.get_plays() if hasattr(playbook, "get_plays") else []
        if plays:
            self._job = job_text(plays[0].get_variable_manager().extra_vars)
        if self._opt["scope"] == "playbook" and not self._check:
            self._planned = self._playbook_hosts(playbook)
            if self._planned:
                self._lock_hosts(sorted(self._planned), "(whole playbook)")

    def _playbook_hosts(self, playbook: t.Any) -> set[str]:
        """Every host the playbook's plays name, as far as their patterns can be templated now."""
        found: set[str] = set()
        for play in playbook.get_plays():
            try:
                vm = play.get_variable_manager()
                templar = Templar(loader=playbook._loader, variables=vm.get_vars(play=play))
                pattern = templar.template(play.hosts)
                found.update(h.name for h in vm._inventory.get_hosts(pattern, order=play.order))
            except Exception as e:  # a pattern known only later: that play adds its hosts when it starts
                self._display.vvv(f"hostlock.core.serialize: hosts of play {play.get_name()!r} known later: {e}")
        return found

    def v2_playbook_on_play_start(self, play: t.Any) -> None:
        self._job = job_text(play.get_variable_manager().extra_vars)
        hosts = self._play_hosts(play)
        if self._check:
            why = real_work_in_check_mode(play)
            self._reporting = why is None
            if why is None:
                self._report_busy(hosts)
                return
            # Those tasks change the hosts for real, --check or not: they are serialized as any run's.
            self._say(f"[{_clock()}] hostlock.core.serialize: check mode, but play '{play.get_name()}' {why}: "
                      "locking its hosts as a real run does")
        locked = hosts
        if self._opt["scope"] == "playbook":
            self._planned.update(hosts)
            locked = sorted(self._planned)
        self._lock_hosts(locked, play.get_name())
        if self._opt["wait_in_flight"]:
            self._mark_play(play, hosts)  # this play's hosts: the others wait in the play that has them

    def _play_hosts(self, play: t.Any) -> list[str]:
        """The hosts this play (this serial batch) will run on, as the strategy will see them."""
        inventory = play.get_variable_manager()._inventory  # no public accessor; the strategy uses the same
        return sorted({h.name for h in inventory.get_hosts(play.hosts, order=play.order)})

    def _lock_hosts(self, hosts: list[str], play_name: str) -> None:
        fleet = self._fleet()
        wanted = plan(hosts, min(fd_budget(), FLEET_BUDGET) if fleet else fd_budget())
        # Deadlock freedom: every run takes locks in ascending key order. Keep held locks (in the wanted
        # mode) only while they all sort below the first lock we still need; release the rest, then take
        # what is missing, in order.
        missing = sorted(k for k, mode in wanted.items() if self._held.get(k, (None, None, None))[2] != mode)
        keep = {k for k in self._held if k in wanted and k not in missing and (not missing or k < missing[0])}
        run = f"ansible-playbook pid {os.getpid()} {controller_id()}"
        label = f"{self._job + ' (' + run + ')' if self._job else run}: {self._playbook}, play '{play_name}'"
        reorder = sorted(k for k in set(self._held) - keep if k in wanted and k not in missing)
        if reorder and self._take_now(missing, wanted, label):
            # Locks we hold sort after one we lacked (a later play's host, scope=playbook), and each lacking one
            # was free: taken without waiting, so out of order is no deadlock, and what we hold stays held; what
            # this play does not want goes, as ever.
            for key in sorted(set(self._held) - set(wanted)):
                self._release(key, clean=True)
            self._handed_over(hosts)
            return
        if reorder:
            self._say(f"[{_clock()}] hostlock.core.serialize: {len(missing)} lock(s) of play '{play_name}' sort "
                      f"before {len(reorder)} held since an earlier play and one is busy: releasing those to take "
                      "every lock in order (another run may work on their hosts in between)")
        for key in sorted(set(self._held) - keep):
            self._release(key, clean=True)
        missing = sorted(set(wanted) - keep)
        timeout = self._timeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        for key in missing:
            name, what = self._lock_name(key)
            started = time.monotonic()
            lock = None
            try:
                lock = self._new_lock(name, wanted[key], label)
                self._take(lock, what, deadline)
            except ValueError as e:  # a malformed fleet URL or ttl: the command line's usage error
                self._end_run(f"hostlock.core.serialize: cannot lock {what}: {e}", EX_USAGE)
            except HostlockError as e:
                if lock is not None:
                    lock.close()
                self._end_run(f"hostlock.core.serialize: cannot lock {what}: {describe_error(e)}", error_exit_code(e))
            except OSError as e:  # out of descriptors or memory: a local error, never "try again" (75)
                if lock is not None:
                    lock.close()
                self._end_run(f"hostlock.core.serialize: cannot lock {what}: {describe_error(e)}", error_exit_code(e))
            self._held[key] = (name, lock, wanted[key], time.monotonic())
            self._fresh.append(key)
            if key[2] or wanted[key] == "exclusive":  # a shared bucket lock only lets the host locks coexist
                self._recap.taken(key[2] or name, time.monotonic() - started)
        self._handed_over(hosts)

    def _handed_over(self, hosts: list[str]) -> None:
        """For the locks just taken: which hosts need the in-flight wait, and say `dirty` for each before any
        task runs (the handover entries, plugin_utils/_serialize_handover.py). Only a host lock whose last
        holder was a run of ours that ended its hold cleanly skips the wait; with a fleet, a large play's
        bucket locks, or no handover directory, every host waits."""
        fresh = [key for key in self._fresh if key in self._held]  # a run that gave up released them
        self._fresh = []
        if not fresh:
            return
        names = {key: self._lock_name(key)[0] for key in fresh}
        buckets = {key[0] for key in fresh if not key[2] and self._held[key][2] == "exclusive"}  # a large play's
        self._needs_wait.update(h for h in hosts if bucket_of(h) in buckets)
        host_keys = [key for key in fresh if key[2]]
        if self._fleet():
            self._needs_wait.update(key[2] for key in host_keys)
            return
        try:
            if self._handover is None:
                self._handover = Handover(self._handover_dir())
            related: dict[str, tuple[str, ...]] = {
                names[key]: (bucket_name(self._opt["prefix"], key[0]),) for key in host_keys
            }
            clean = self._handover.clean(related)
            self._display.vvv(f"hostlock.core.serialize: last held by a run that ended cleanly: {sorted(clean)}")
            self._needs_wait.update(key[2] for key in host_keys if names[key] not in clean)
            self._handover.taken([names[key] for key in fresh if key[2] or self._held[key][2] == "exclusive"],
                                 self._run_id)
        except (HostlockError, OSError) as e:  # HandoverError too: a clean entry of ours we cannot replace
            self._end_run(f"hostlock.core.serialize: cannot record this run's hold in {self._handover_dir()}: "
                          f"{describe_error(e)}", error_exit_code(e))

    def _handover_dir(self) -> str:
        return self._opt["directory"] or default_directory()

    def _lock_name(self, key: Key) -> tuple[str, str]:
        """(lock name, how messages name it) of a plan's key."""
        bucket, host = key[0], key[2]
        name = lock_name(self._opt["prefix"], host) if host else bucket_name(self._opt["prefix"], bucket)
        return name, (f"host {host}" if host else f"hosts in {name}")

    def _new_lock(self, name: str, mode: str, label: str) -> Lock:
        fleet = self._fleet()
        if fleet:
            return Lock(name, fleet=fleet, ttl=self._opt["ttl"], label=label, mode=mode,
                        on_lost=lambda *_a, name=name: self._on_lost(name))
        return Lock(name, directory=self._opt["directory"], label=label, mode=mode)

    def _take_now(self, keys: list[Key], wanted: dict, label: str) -> bool:
        """Take every lock of `keys` without waiting; True if all were free (then held), else none is kept."""
        taken: list[tuple[Key, str, Lock]] = []
        try:
            for key in keys:
                name, _what = self._lock_name(key)
                lock = self._new_lock(name, wanted[key], label)
                try:
                    lock.acquire(timeout=0)
                except LockTimeout:
                    lock.close()
                    raise
                taken.append((key, name, lock))
        except (LockTimeout, HostlockError, ValueError, OSError):
            for _key, _name, lock in taken:
                lock.release()
                lock.close()
            return False
        for key, name, lock in taken:
            if key in self._held:  # the same lock in another mode: ours now in the new one
                self._release(key)
            self._held[key] = (name, lock, wanted[key], time.monotonic())
            self._fresh.append(key)
            if key[2] or wanted[key] == "exclusive":
                self._recap.taken(key[2] or name, 0.0)
        return True

    def _take(self, lock: Lock, what: str, deadline: float | None) -> None:
        """Take one lock; say whom we wait for; end the run when the deadline passes."""
        started = time.monotonic()
        try:
            lock.acquire(timeout=0)
            return
        except LockTimeout as busy:
            holders = describe_holders([h.as_dict() for h in busy.holders])
        limit = "" if deadline is None else f" up to {max(0.0, deadline - started):.0f}s"
        self._say(f"[{_clock()}] hostlock.core.serialize: {what} is busy: held by {holders}; waiting"
                  f"{self._place(lock)}{limit}")
        try:
            lock.acquire(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except LockTimeout as e:
            lock.close()
            self._give_up(what, [h.as_dict() for h in e.holders], time.monotonic() - started)
        waited = time.monotonic() - started
        self._say(f"[{_clock()}] hostlock.core.serialize: got {what} after waiting {waited:.2f}s")

    def _place(self, lock: Lock) -> str:
        """" (first in line)" or " (number 3 in line)": the waiters queued before this run's wait begins."""
        try:
            st = status(lock.name, fleet=self._fleet()) if self._fleet() else status(
                lock.name, directory=self._opt["directory"])
        except (HostlockError, ValueError, OSError):
            return ""  # only a display: a lock that cannot be read now is waited for as ever
        ahead = max(0, int(st.waiters or 0))
        return " (first in line)" if not ahead else f" (number {ahead + 1} in line)"

    def _report_busy(self, hosts: list[str]) -> None:
        """Check mode: name who holds a host's lock, or its bucket exclusively (a large play)."""
        prefix, directory = self._opt["prefix"], self._opt["directory"]
        seen: set[str] = set()
        for host in hosts:
            for name, shared_ok in ((lock_name(prefix, host), False), (bucket_name(prefix, bucket_of(host)), True)):
                if name in seen:
                    continue
                seen.add(name)
                try:
                    st = status(name, fleet=self._fleet()) if self._fleet() else status(name, directory=directory)
                except (HostlockError, ValueError) as e:
                    self._display.warning(f"hostlock.core.serialize: cannot read the lock of host {host}: {e}")
                    continue
                live = [h.as_dict() for h in st.holders if not h.stale and not (shared_ok and h.mode == "shared")]
                if live:
                    self._say(f"hostlock.core.serialize: check mode takes no lock; host {host} is held by "
                              f"{describe_holders(live)}")

    def _give_up(self, what: str, holders: list, waited: float) -> t.NoReturn:
        self._end_run(
            f"hostlock.core.serialize: {what} is still held after {waited:.1f}s by {describe_holders(holders)}; "
            f"ending this run. Run {self._status_hint()} to see who, raise the timeout "
            "(HOSTLOCK_SERIALIZE_TIMEOUT) or retry later.",
            EXIT_BUSY,
        )

    def _status_hint(self) -> str:
        fleet = self._fleet()
        return f"`hostlock status --fleet {fleet}`" if fleet else "`hostlock status` on the control node"

    def _end_run(self, msg: str, code: int) -> t.NoReturn:
        """Stop ansible-playbook now: a raised Exception would only become a warning and the play would run."""
        self._display.error(msg)
        self._release_all()
        # SystemExit is not an Exception: it passes ansible-core's callback error handler and the CLI's,
        # while the executors' finally blocks still clean up.
        raise _EndRun(code)

    def _release(self, key: Key, clean: bool = False) -> None:
        """Release one lock. `clean`: the play that held it has ended (a play boundary, the playbook's end);
        then a host with no task of ours left running there that we know of is handed over clean."""
        name, lock, _mode, taken = self._held.pop(key)
        host = key[2]
        if host:
            if (clean and self._handover is not None and not self._running.get(host)
                    and host not in self._needs_wait and host not in self._unclean):
                self._handover.ended_clean(name, self._run_id)  # while the lock is still ours
            self._needs_wait.discard(host)
            self._unclean.discard(host)
        try:
            lock.release()
        except HostlockError as e:  # etcd unreachable: the key ends with its lease, within the ttl
            self._display.warning(f"hostlock.core.serialize: could not release {name}: {describe_error(e)}; it ends "
                                  "when its etcd lease runs out (ttl)")
        finally:
            lock.close()  # a released Lock keeps its file open: close it, or 10,000 hosts exhaust descriptors
        self._recap.released(key[2] or name, time.monotonic() - taken)

    def _release_all(self, clean: bool = False) -> None:
        for key in sorted(self._held):
            self._release(key, clean=clean)

    # -- in-flight work of earlier runs on the hosts --------------------------------------------------
    def _mark_play(self, play: t.Any, hosts: list[str]) -> None:
        waiting = [h for h in hosts if h in self._needs_wait]
        mark_play(play, self._scope(), self._run_id, self._timeout(), None if len(waiting) == len(hosts) else waiting)

    def _scope(self) -> str:
        """Short id of this lock set: the resolved controller lock directory (or the fleet's key prefix) and
        the prefix. Runs of other control nodes on the same fleet find the same id on the hosts."""
        fleet = self._fleet()
        if fleet:
            from ansible_collections.hostlock.core.plugins.module_utils.hostlock.fleet.url import parse

            # the etcd key prefix, not the URL: control nodes may list the endpoints differently
            where = "etcd:" + parse(fleet).prefix
        else:
            where = os.path.abspath(self._opt["directory"] or default_directory())
        key = f"{where}\0{self._opt['prefix']}".encode("utf-8", "surrogateescape")
        return hashlib.sha256(key).hexdigest()[:12]

    def _waited_in_flight(self, result: t.Any, data: dict) -> None:
        task = getattr(result, "task", None) or getattr(result, "_task", None)
        if getattr(task, "name", None) != WAIT_TASK:
            return
        host = result.host.get_name() if hasattr(result, "host") else result._host.get_name()
        for line in (data.get("stdout") or "").splitlines():  # a command line of the host's: inert here
            self._say(f"[{_clock()}] hostlock.core.serialize: host {host}: {one_line(line)}")
        if data.get("rc") == 0 and not data.get("failed") and not data.get("skipped"):
            self._needs_wait.discard(host)  # nothing of an earlier run's is left there
        if data.get("rc") == EXIT_BUSY:
            self._end_run(
                f"hostlock.core.serialize: host {host} still runs an earlier run's task after the timeout "
                f"({one_line(data.get('stdout') or '?')}); ending this run. Raise the timeout "
                "(HOSTLOCK_SERIALIZE_TIMEOUT) or retry later.",
                EXIT_BUSY,
            )

    # -- what the modules report ---------------------------------------------------------------
    def _record(self, result: t.Any) -> None:
        data = getattr(result, "result", None)
        if data is None:  # older CallbackTaskResult
            data = result._result
        host = result.host.get_name() if hasattr(result, "host") else result._host.get_name()
        task = getattr(result, "task", None) or getattr(result, "_task", None)
        self._running.get(host, set()).discard(str(getattr(task, "_uuid", "")))
        if _may_outlive(data):
            self._unclean.add(host)
        self._waited_in_flight(result, data)
        self._recap.record(host, data)

    def _on_lost(self, name: str) -> None:
        """From the lock's keep-alive thread: note the loss (the run ends before its next task) and say it now."""
        self._lost.append(name)
        try:
            self._display.warning(f"hostlock.core.serialize: lost the fleet lock {name} at {_clock()}; this run "
                                  "starts no further task")
        except Exception:  # noqa: BLE001 - never let a message kill the keep-alive thread; the run still ends
            pass

    def _check_lost(self) -> None:
        """End the run before its next task once a fleet lock is lost: another run may have the host now."""
        if self._lost:
            names = ", ".join(sorted(set(self._lost)))
            self._end_run(
                f"hostlock.core.serialize: lost the fleet lock {names} (its etcd lease ended: etcd unreachable "
                "past the ttl, or the lock was broken); ending this run before its next task. A task already "
                "running on a host was not stopped.",
                EXIT_LOST,
            )

    def v2_playbook_on_task_start(self, task: t.Any, is_conditional: bool) -> None:
        self._check_lost()

    def v2_playbook_on_handler_task_start(self, task: t.Any) -> None:
        self._check_lost()

    def v2_runner_on_start(self, host: t.Any, task: t.Any) -> None:
        self._running.setdefault(host.get_name(), set()).add(task._uuid)

    def v2_runner_on_unreachable(self, result: t.Any) -> None:
        self._record(result)
        host = result.host.get_name() if hasattr(result, "host") else result._host.get_name()
        self._unclean.add(host)  # the connection failed: what it started there may still run

    def v2_runner_on_ok(self, result: t.Any) -> None:
        self._record(result)

    def v2_runner_on_failed(self, result: t.Any, ignore_errors: bool = False) -> None:
        self._record(result)

    def v2_runner_on_skipped(self, result: t.Any) -> None:
        self._record(result)

    # -- end of the playbook ---------------------------------------------------------------------
    def v2_playbook_on_stats(self, stats: t.Any) -> None:
        self._release_all(clean=True)  # sent only after the last play ended: every task's result is in
        if self._opt["recap"]:
            for line in self._recap.lines():
                self._say(line)
        for warning in self._recap.leases_left():
            self._display.warning(warning)
        self._recap = Recap()
