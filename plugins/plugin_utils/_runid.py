# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the id of this ansible-playbook run, as the hosts see it in lock labels.

A lock's owner is a task execution (hostlock.core.locked) or a lease (hostlock.core.lock); neither is
re-entrant. The run id lets a host recognise that a lock is held by the same run that now asks for it
(a lease taken earlier in the play, another host of the play whose lock is delegated to the same host),
which would never be released while the run waits: the modules then fail at once instead of waiting.
"""

from __future__ import annotations

import hashlib
import os
import socket

from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.procstat import start_ticks


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks (Linux /proc); a pid alone can be reused."""
    return start_ticks(pid) or "?"  # not Linux: the pid and host must do


def _controller_pid() -> int:
    """ansible-playbook's pid, from one of its forked workers; AnsibleError when it has died since it forked
    this worker (SIGKILL, the OOM killer): the worker, left to itself, must start nothing more on a host
    (its parent is then init or a subreaper, whose pid would name the wrong run and never end)."""
    import multiprocessing

    pid = os.getppid()
    parent = multiprocessing.parent_process()  # the worker's parent as forked (3.8+), whatever happened since
    if parent is not None and parent.pid is not None and parent.pid != pid:
        from ansible.errors import AnsibleError

        raise AnsibleError(f"ansible-playbook (pid {parent.pid}) is gone: this task of its run is not started")
    return pid


def run_id() -> str:
    """A short stable id for this ansible-playbook process, computed in its forked workers."""
    # Task workers are forked by the ansible-playbook process: from a worker, the run is the parent.
    pid = _controller_pid()
    seed = f"{socket.gethostname()}:{pid}:{_start_ticks(pid)}"
    return hashlib.sha256(seed.encode()).hexdigest()[:12]


# The connections whose host is this machine: there a module can watch the controller's processes itself.
LOCAL_TRANSPORTS = ("local", "ansible.builtin.local", "ansible.legacy.local")


def controller_process() -> str:
    """The ansible-playbook process as "PID:START" (start time in clock ticks), computed in a forked worker."""
    pid = _controller_pid()
    return f"{pid}:{_start_ticks(pid)}"


def run_marker(task: bool = False) -> str:
    """What the plugins append to a lock's label: the modules look for it among the holders.

    A lease ("[run ID]") lasts until a later task releases it: the run never waits for it. A task's own lock
    (`task`: "[run ID task]", hostlock.core.locked) ends by itself: the run's other hosts wait for it.
    """
    return f"[run {run_id()} task]" if task else f"[run {run_id()}]"
