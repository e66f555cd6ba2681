# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the serialize callback's HOSTLOCK RECAP, and the leases a run left held.

What the callback's own controller locks waited and held, and what hostlock.core.lock and locked tasks
reported (the `hostlock` key of their results), summed per host and lock name for the end of the playbook.
"""

from __future__ import annotations

import time
import typing as t

from ansible_collections.hostlock.core.plugins.module_utils._common import RESULT_KEY


class Recap:
    def __init__(self) -> None:
        self.waits: list[tuple[str, float, float]] = []  # (lock key label, waited, held) of controller locks
        self.uses: dict[tuple[str, str], dict[str, t.Any]] = {}  # (host, lock) -> totals from modules
        self.leases: dict[tuple[str, str], dict[str, dict]] = {}  # (host, lock) -> token_id -> lease

    def taken(self, label: str, waited: float) -> None:
        """A controller lock the callback took (a host, or an exclusive bucket), after waiting this long."""
        self.waits.append((label, waited, 0.0))

    def released(self, label: str, held: float) -> None:
        for i in range(len(self.waits) - 1, -1, -1):
            if self.waits[i][0] == label:
                self.waits[i] = (label, self.waits[i][1], self.waits[i][2] + held)
                break

    def record(self, host: str, data: dict) -> None:
        """Account what a task result of `host` reports about its locks (a loop's items each)."""
        results = data.get("results")
        items: list = results if isinstance(results, list) else [data]
        for item in items:
            info = item.get(RESULT_KEY) if isinstance(item, dict) else None
            if isinstance(info, dict) and info.get("name"):
                self._account(host, info)

    def _account(self, host: str, info: dict) -> None:
        key = (host, str(info["name"]))
        use = self.uses.setdefault(key, dict(uses=0, waited=0.0, max_waited=0.0, held=0.0, conflicts=0))
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
        leases = self.leases.setdefault(key, {})
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

    def lines(self) -> list[str]:
        """The recap's lines, or none when nothing was locked."""
        if not (self.waits or self.uses):
            return []
        out = ["\nHOSTLOCK RECAP " + "*" * 64]
        per_host: dict[str, list[float]] = {}
        for host, waited, held in self.waits:
            acc = per_host.setdefault(host, [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += waited
            acc[2] += held
        for host, (plays, waited, held) in sorted(per_host.items()):
            out.append("%-26s : serialize  plays=%d  waited=%.2fs  held=%.2fs" % (host, plays, waited, held))
        for (host, name), use in sorted(self.uses.items()):
            out.append(
                "%-26s : lock %-16s uses=%d  waited=%.2fs (max %.2fs)  held=%.2fs  conflicts=%d"
                % (host, name, use["uses"], use["waited"], use["max_waited"], use["held"], use["conflicts"])
            )
        return out

    def leases_left(self) -> list[str]:
        """A warning for every lease this run took and did not release that still runs."""
        now = time.time()
        out = []
        for (host, name), leases in sorted(self.leases.items()):
            for lease in leases.values():
                expires = lease.get("lease_expires")
                if expires and expires > now:
                    out.append(
                        "hostlock: {}: lock {} is still held by a lease of this run until {} ({:.0f}s from now); "
                        "release it with hostlock.core.lock state=released and its token, or wait for the lease".format(
                            host, name, time.strftime("%H:%M:%S", time.localtime(expires)), expires - now
                        )
                    )
        return out
