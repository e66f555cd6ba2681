# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: a heartbeat lease on a managed host, for the action plugins that take one.

hostlock.core.lock takes one when asked (`heartbeat: true`); hostlock.core.locked takes one around a wrapped
task that has its own action plugin (copy, template, package, raw, ...): that task runs partly on the
controller and may call several modules on the host, so the lock cannot live inside one module run there.
The lease lives on the host (it excludes the host's own `hostlock run` jobs), is renewed from the control
node while the run lives, and when the run dies its holder frees the lock once the work it marked (the
lease's in-flight environment, given to the wrapped task) has ended on the host.
"""

from __future__ import annotations

import os
import typing as t

from ansible_collections.hostlock.core.plugins.plugin_utils import _heartbeat

LOCK_MODULE = "hostlock.core.lock"


def start_heartbeat(action: t.Any, args: dict, result: dict, task_vars: dict) -> dict:
    """Renew the lease from the control node until its release or the end of this run."""
    lease = float(result["lease"])
    renewal = {
        **{k: args[k] for k in ("name", "path") if args.get(k)},  # the one the lease was taken with
        "token": result["token"],
        "directory": result.get("directory") or args.get("directory"),
        "state": "acquired",
    }

    task_tmpdir = action._connection._shell.tmpdir

    def renew(seconds: float) -> str:  # runs in the heartbeat process, a copy of this worker
        if action._connection._shell.tmpdir == task_tmpdir:
            # the task's temporary directory is removed when the task ends: each renewal makes its own
            action._connection._shell.tmpdir = None
        try:
            got = action._execute_module(module_name=LOCK_MODULE, module_args=dict(renewal, lease=seconds),
                                         task_vars=task_vars)
        except Exception:  # noqa: BLE001 - connection failures: the next renewal tries again
            return _heartbeat.UNREACHABLE
        finally:
            try:
                action._remove_tmp_path(action._connection._shell.tmpdir)
            except Exception:  # noqa: BLE001 - a leftover temporary directory must not stop the heartbeat
                pass
        if got.get("unreachable"):
            return _heartbeat.UNREACHABLE
        if got.get("failed"):
            # only the holder saying the lease is gone ends the heartbeat; any other failure is retried
            return _heartbeat.GONE if "cannot renew" in str(got.get("msg")) else _heartbeat.UNREACHABLE
        return _heartbeat.OK

    # Workers are forked by the ansible-playbook process: the run is our parent.
    # The whole token: the heartbeat's socket name carries a proof made with its secret (_heartbeat._address).
    pid = _heartbeat.start(renew, result["token"], lease, os.getppid())
    return dict(pid=pid, every=round(lease / _heartbeat.RENEWALS_PER_LEASE, 3), lease=lease)
