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
  - On the control node, takes one hostlock lock per host of a play, in sorted order, when the play
    starts (each C(serial) batch on its own), and releases them when the next play starts or the
    playbook ends. A second C(ansible-playbook) run whose play shares a host waits; runs on disjoint
    hosts go on in parallel. Locking in one global order means two runs never deadlock.
  - The locks are kernel locks held by the C(ansible-playbook) process, so they are freed at once
    when it exits or is killed, even with SIGKILL.
  - It prints whom it waits for, and at the end of each playbook a recap of the lock waits and holds
    reported by M(hostlock.core.lock) and M(hostlock.core.locked) tasks, with a warning for every
    lease the run left held on a host.
  - In check mode (C(--check)) it takes no lock; it says which hosts are busy.
  - A callback cannot fail a run by raising (ansible-core turns its exceptions into warnings). When a
    host stays busy past O(timeout), or at once with O(fail_fast), this callback ends the run itself;
    it prints the holders and exits C(ansible-playbook) with status 75 (EX_TEMPFAIL, "try again
    later"), before the play runs any task.
  - Only the inventory hosts a play targets are locked; hosts reached through C(delegate_to) are not.
    Runs must name a host the same way (inventory hostname) to exclude each other.
requirements:
  - Enable it in C(ansible.cfg) (C(callbacks_enabled = hostlock.core.serialize) under C([defaults]))
    or with C(ANSIBLE_CALLBACKS_ENABLED=hostlock.core.serialize).
options:
  directory:
    description:
      - Lock directory on the control node. Every run that must exclude the others uses the same one.
      - Defaults to the hostlock default (C($HOSTLOCK_DIR), else C(/run/hostlock) when usable,
        else a per-user runtime directory).
    type: path
    env:
      - name: HOSTLOCK_SERIALIZE_DIRECTORY
    ini:
      - section: hostlock_serialize
        key: directory
  timeout:
    description:
      - Seconds to wait for a play's hosts. Omit (or V(-1)) to wait as long as it takes.
      - When the time is up the run ends with status 75, naming the holders.
    type: float
    default: -1
    env:
      - name: HOSTLOCK_SERIALIZE_TIMEOUT
    ini:
      - section: hostlock_serialize
        key: timeout
  fail_fast:
    description:
      - End the run at once (status 75, holders named) when any host of a play is locked by another
        run, instead of waiting.
    type: bool
    default: false
    env:
      - name: HOSTLOCK_SERIALIZE_FAIL_FAST
    ini:
      - section: hostlock_serialize
        key: fail_fast
  prefix:
    description:
      - Lock names are this prefix followed by the inventory hostname (characters a lock name cannot
        hold are replaced, and a short hash keeps such names apart).
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
    type: bool
    default: true
    env:
      - name: HOSTLOCK_SERIALIZE_RECAP
    ini:
      - section: hostlock_serialize
        key: recap
notes:
  - The locks live on the control node. Two control nodes do not see each other's runs; for that,
    lock on the managed host with M(hostlock.core.lock) or M(hostlock.core.locked).
  - C(hostlock status) on the control node lists the runs holding or waiting for hosts.
seealso:
  - module: hostlock.core.lock
  - module: hostlock.core.locked
author:
  - hostlock maintainers (@hostlock)
"""

import hashlib
import os
import re
import sys
import time
import typing as t

from ansible import context
from ansible.plugins.callback import CallbackBase
from ansible_collections.hostlock.core.plugins.module_utils._common import RESULT_KEY, describe_holders
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import (
    HostlockError,
    Lock,
    LockTimeout,
    status,
)
from ansible_collections.hostlock.core.plugins.plugin_utils._controller import controller_id

# Exit status when a host stays busy: EX_TEMPFAIL from sysexits.h, "try again later" (as lckdo).
EXIT_BUSY = 75
_BAD_CHARS = re.compile(r"[^A-Za-z0-9._+@-]")


def lock_name(prefix: str, host: str) -> str:
    """A valid lock name for a host; names needing changes get a hash so two hosts never collide."""
    clean = _BAD_CHARS.sub("_", host)
    name = prefix + clean
    if clean != host or len(name) > 100:
        digest = hashlib.sha256(host.encode("utf-8", "surrogateescape")).hexdigest()[:10]
        name = f"{name[:89]}-{digest}"
    return name


def _clock() -> str:
    return time.strftime("%H:%M:%S")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hostlock.core.serialize"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: t.Any, **kwargs: t.Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[str, tuple[str, Lock, float]] = {}  # host -> (lock name, lock, monotonic taken)
        self._playbook = "?"
        self._check = False
        self._waits: list[tuple[str, float, float]] = []  # (host, waited, held) of our controller locks
        self._uses: dict[tuple[str, str], dict[str, t.Any]] = {}  # (host, lock) -> totals from modules
        self._leases: dict[tuple[str, str], dict[str, dict]] = {}  # (host, lock) -> token_id -> lease

    # -- options ---------------------------------------------------------------------------------
    def _timeout(self) -> float | None:
        if self.get_option("fail_fast"):
            return 0.0
        value = self.get_option("timeout")
        return None if value is None or float(value) < 0 else float(value)

    # -- control-node host locks -----------------------------------------------------------------
    def v2_playbook_on_start(self, playbook: t.Any) -> None:
        self._playbook = os.path.basename(getattr(playbook, "_file_name", None) or "?")
        self._check = bool(context.CLIARGS.get("check"))

    def v2_playbook_on_play_start(self, play: t.Any) -> None:
        hosts = self._play_hosts(play)
        if self._check:
            self._report_busy(hosts)
            return
        self._lock_hosts(hosts, play.get_name())

    def _play_hosts(self, play: t.Any) -> list[str]:
        """The hosts this play (this serial batch) will run on, as the strategy will see them."""
        inventory = play.get_variable_manager()._inventory  # no public accessor; the strategy uses the same
        return sorted({h.name for h in inventory.get_hosts(play.hosts, order=play.order)})

    def _lock_hosts(self, hosts: list[str], play_name: str) -> None:
        wanted = set(hosts)
        # Deadlock freedom: every run takes locks in ascending name order. Keep held locks only while
        # they all sort below the first lock we still need; release the rest, then take what is missing.
        missing = sorted(h for h in wanted if h not in self._held)
        keep = {h for h in self._held if h in wanted and (not missing or h < missing[0])}
        missing = sorted(wanted - keep)  # a held host released above must be taken again, in order
        for host in sorted(set(self._held) - keep):
            self._release(host)
        label = f"ansible-playbook pid {os.getpid()} {controller_id()}: {self._playbook}, play '{play_name}'"
        directory = self.get_option("directory")
        timeout = self._timeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        for host in missing:
            name = lock_name(self.get_option("prefix"), host)
            started = time.monotonic()
            try:
                lock = Lock(name, directory=directory, label=label)
                self._take(lock, host, deadline)
            except HostlockError as e:
                self._end_run(f"hostlock.core.serialize: cannot lock host {host}: {e}")
            self._held[host] = (name, lock, time.monotonic())
            self._waits.append((host, time.monotonic() - started, 0.0))

    def _take(self, lock: Lock, host: str, deadline: float | None) -> None:
        """Take one host's lock; say whom we wait for; end the run when the deadline passes."""
        started = time.monotonic()
        try:
            lock.acquire(timeout=0)
            return
        except LockTimeout as busy:
            holders = describe_holders([h.as_dict() for h in busy.holders])
        limit = "" if deadline is None else f" up to {max(0.0, deadline - started):.0f}s"
        self._display.display(f"[{_clock()}] hostlock.core.serialize: host {host} is busy: held by {holders}; "
                              f"waiting{limit}")
        try:
            lock.acquire(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except LockTimeout as e:
            self._give_up(host, [h.as_dict() for h in e.holders], time.monotonic() - started)
        waited = time.monotonic() - started
        self._display.display(f"[{_clock()}] hostlock.core.serialize: got host {host} after waiting {waited:.2f}s")

    def _report_busy(self, hosts: list[str]) -> None:
        for host in hosts:
            try:
                st = status(lock_name(self.get_option("prefix"), host), directory=self.get_option("directory"))
            except HostlockError as e:
                self._display.warning(f"hostlock.core.serialize: cannot read the lock of host {host}: {e}")
                continue
            live = [h.as_dict() for h in st.holders if not h.stale]
            if live:
                who = describe_holders(live)
                self._display.display(f"hostlock.core.serialize: check mode takes no lock; host {host} is held by "
                                      f"{who}")

    def _give_up(self, host: str, holders: list, waited: float) -> None:
        self._end_run(
            f"hostlock.core.serialize: host {host} is still held after {waited:.1f}s by {describe_holders(holders)}; "
            "ending this run. Run `hostlock status` on the control node to see who, raise the timeout "
            "(HOSTLOCK_SERIALIZE_TIMEOUT) or retry later."
        )

    def _end_run(self, msg: str) -> t.NoReturn:
        """Stop ansible-playbook now: a raised Exception would only become a warning and the play would run."""
        self._display.error(msg)
        self._release_all()
        sys.stdout.flush()
        # SystemExit is not an Exception: it passes ansible-core's callback error handler and the CLI's,
        # while the executors' finally blocks still clean up.
        raise SystemExit(EXIT_BUSY)

    def _release(self, host: str) -> None:
        name, lock, taken = self._held.pop(host)
        lock.release()
        for i in range(len(self._waits) - 1, -1, -1):
            if self._waits[i][0] == host:
                self._waits[i] = (host, self._waits[i][1], self._waits[i][2] + time.monotonic() - taken)
                break

    def _release_all(self) -> None:
        for host in sorted(self._held):
            self._release(host)

    # -- what the modules report ---------------------------------------------------------------
    def _record(self, result: t.Any) -> None:
        data = getattr(result, "result", None)
        if data is None:  # older CallbackTaskResult
            data = result._result
        host = result.host.get_name() if hasattr(result, "host") else result._host.get_name()
        items = data.get("results") if isinstance(data.get("results"), list) else [data]
        for item in items:
            info = item.get(RESULT_KEY) if isinstance(item, dict) else None
            if isinstance(info, dict) and info.get("name"):
                self._account(host, info)

    def _account(self, host: str, info: dict) -> None:
        key = (host, str(info["name"]))
        use = self._uses.setdefault(key, dict(uses=0, waited=0.0, max_waited=0.0, held=0.0, conflicts=0))
        event = info.get("event")
        waited = float(info.get("waited") or 0.0)
        if event in ("acquired", "locked"):
            use["uses"] += 1
            use["waited"] += waited
            use["max_waited"] = max(use["max_waited"], waited)
            use["held"] += float(info.get("held") or 0.0)
        elif event == "conflict":
            use["conflicts"] += 1
            use["waited"] += waited
        leases = self._leases.setdefault(key, {})
        tid = info.get("token_id")
        # Without a token id (a module that did not report one) pair a release with the latest lease.
        found = tid if tid in leases else (next(reversed(leases)) if leases and not tid else None)
        if event == "acquired":
            leases[tid or f"#{len(leases)}"] = dict(info, taken_at=time.monotonic())
        elif event == "renewed" and found:
            leases[found] = dict(leases[found], lease_expires=info.get("lease_expires"))
        elif event == "released" and found:
            use["held"] += time.monotonic() - leases.pop(found)["taken_at"]
        elif event == "broken":
            leases.clear()

    def v2_runner_on_ok(self, result: t.Any) -> None:
        self._record(result)

    def v2_runner_on_failed(self, result: t.Any, ignore_errors: bool = False) -> None:
        self._record(result)

    def v2_runner_on_skipped(self, result: t.Any) -> None:
        self._record(result)

    # -- end of the playbook ---------------------------------------------------------------------
    def v2_playbook_on_stats(self, stats: t.Any) -> None:
        self._release_all()
        if self.get_option("recap") and (self._waits or self._uses):
            self._print_recap()
        now = time.time()
        for (host, name), leases in sorted(self._leases.items()):
            for lease in leases.values():
                expires = lease.get("lease_expires")
                if expires and expires > now:
                    self._display.warning(
                        "hostlock: {}: lock {} is still held by a lease of this run until {} ({:.0f}s from now); "
                        "release it with hostlock.core.lock state=released and its token, or wait for the lease".format(
                            host, name, time.strftime("%H:%M:%S", time.localtime(expires)), expires - now
                        )
                    )
        self._waits, self._uses, self._leases = [], {}, {}

    def _print_recap(self) -> None:
        self._display.banner("HOSTLOCK RECAP")
        if self._waits:
            per_host: dict[str, list[float]] = {}
            for host, waited, held in self._waits:
                acc = per_host.setdefault(host, [0, 0.0, 0.0])
                acc[0] += 1
                acc[1] += waited
                acc[2] += held
            for host, (plays, waited, held) in sorted(per_host.items()):
                self._display.display(
                    "%-26s : serialize  plays=%d  waited=%.2fs  held=%.2fs" % (host, plays, waited, held)
                )
        for (host, name), use in sorted(self._uses.items()):
            self._display.display(
                "%-26s : lock %-16s uses=%d  waited=%.2fs (max %.2fs)  held=%.2fs  conflicts=%d"
                % (host, name, use["uses"], use["waited"], use["max_waited"], use["held"], use["conflicts"])
            )
