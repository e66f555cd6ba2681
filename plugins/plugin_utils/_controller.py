# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: controller-side helpers of the hostlock.core action and callback plugins.

Not a public API; other collections must not import it.
"""

from __future__ import annotations

import getpass
import os
import socket
import typing as t

from ansible_collections.hostlock.core.plugins.plugin_utils._job import job_text

# Longest label we store: it shows in `hostlock status` lines and in other tasks' error messages.
LABEL_MAX = 160


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no $USER (containers)
        return str(os.getuid())


def controller_id() -> str:
    """user@host of the control node running this playbook: who to look for when a lock is busy."""
    return f"{_user()}@{socket.gethostname()}"


def task_label(task: t.Any, task_vars: dict | None) -> str:
    """Default lock label naming the play, the task and the controller (shown by `hostlock status`), and the
    AWX/AAP job from its extra variables (for display only: plugin_utils/_job.py)."""
    play = (task_vars or {}).get("ansible_play_name") or "?"
    try:
        name = task.get_name()
    except Exception:  # a label must never break the task it describes
        name = getattr(task, "action", "?")
    job = job_text(task_vars)
    label = f"ansible {controller_id()}{' ' + job if job else ''}: play '{play}', task '{name}'"
    return label if len(label) <= LABEL_MAX else label[: LABEL_MAX - 3] + "..."


def _play_strategy(task: t.Any) -> str:
    """The strategy of the play `task` runs in (its `strategy:` keyword, else the configured default)."""
    node = task
    for _depth in range(64):  # task -> block -> ... -> the play's block
        play = getattr(node, "_play", None)
        if play is not None:
            return str(getattr(play, "strategy", None) or "linear")
        node = getattr(node, "_parent", None)
        if node is None:
            break
    from ansible import constants as C

    return str(C.DEFAULT_STRATEGY or "linear")


def _forks() -> int:
    from ansible import constants as C
    from ansible import context

    try:
        return int(context.CLIARGS.get("forks") or C.DEFAULT_FORKS)
    except (TypeError, ValueError):
        return int(C.DEFAULT_FORKS)


def turns(task: t.Any, task_vars: dict) -> dict:
    """How this task's inventory host may wait for another host of the run on the same machine (module_utils/_turns).

    Waiting works where the holder runs on to its release meanwhile: under `host_pinned` (at most `forks` hosts
    are active, each with its worker) and under `free` while the batch cannot fill every fork with waiting hosts.
    Under `linear` (and `debug`) no host runs its next task before every host has finished this one.
    """
    from ansible_collections.hostlock.core.plugins.module_utils._turns import host_tag

    host = str(task_vars.get("inventory_hostname") or "")
    batch = [str(h) for h in (task_vars.get("ansible_play_batch") or [host])]
    strategy = _play_strategy(task)
    kind = strategy.rpartition(".")[2]
    forks = _forks()
    delegated = bool(getattr(task, "delegate_to", None))
    if kind.endswith("host_pinned"):
        wait, why, works = True, "", []
    elif kind.endswith("free"):
        wait = len(batch) <= forks
        why = (f"with {len(batch)} hosts in this batch and forks {forks}, waiting hosts could take every fork and "
               "leave none for the holder's next task")
        works = [f"forks {len(batch)} or more (-f {len(batch)})", f"serial: {forks}", "strategy: host_pinned",
                 "hostlock.core.locked on each task instead of one lock around them"]
    else:
        wait = False
        why = (f"under strategy {strategy} no host runs its next task before every host of the batch has finished "
               "this one")
        works = ["serial: 1 on the play (one host at a time)", "strategy: free (or host_pinned) on the play",
                 "hostlock.core.locked on each task instead of one lock around them"]
    if delegated and not wait:
        works.append("for a lock delegated to one host for the play's hosts, take it once (run_once: true)")
    return dict(host=host_tag(host), batch={host_tag(h): h for h in batch}, wait=wait, why=why, works=works,
                delegated=delegated)


# The role whose lock tasks name the user's task that includes it (its own tasks are not the user's).
WITH_LOCK_ROLE = "hostlock.core.with_lock"


def in_with_lock(task: t.Any) -> bool:
    """Whether `task` is one of the hostlock.core.with_lock role's own tasks."""
    role = getattr(task, "_role", None)
    try:
        return role is not None and role.get_name() == WITH_LOCK_ROLE
    except Exception:  # noqa: BLE001 - a task we cannot place is not the role's
        return False


def including_task(task: t.Any) -> t.Any:
    """The include_role task that brought `task` in (the user's task around a role's tasks), or None."""
    node = getattr(task, "_parent", None)
    for _depth in range(64):
        if node is None:
            return None
        if type(node).__name__ == "IncludeRole":
            return node
        node = getattr(node, "_parent", None)
    return None


def included_by(task: t.Any) -> tuple[str, t.Any]:
    """(" (in ROLE, included by task 'NAME' at FILE:LINE)", that task's data for an error's origin, or None)."""
    role = WITH_LOCK_ROLE if in_with_lock(task) else "its role"
    outer = including_task(task)
    if outer is None:
        return f" (in {role})", None
    try:
        name, where = outer.get_name(), outer.get_path()
    except Exception:  # noqa: BLE001 - the message without the place is still the message
        return f" (in {role})", None
    return f" (in {role}, included by task '{name}' at {where})", getattr(outer, "_ds", None)
