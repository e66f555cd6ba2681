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
