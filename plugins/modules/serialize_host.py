#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The host side of the hostlock.core.serialize callback: the in-flight wait it adds as the first task of a play
# (plugins/plugin_utils/_serialize_play.py); users enable the callback, documented in plugins/callback/serialize.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serialize_host
short_description: "Internal: the managed host's side of the hostlock.core.serialize callback; enable the callback"
version_added: 0.5.0
description:
  - The in-flight wait the C(hostlock.core.serialize) callback adds as the first task of a play, on each host an
    earlier run may have left work on. Enable the callback (C(ansible-doc -t callback hostlock.core.serialize));
    it adds this task and sets every option. Never write it in a task.
  - Waits until no process is left whose environment holds exactly the entry O(mark) and not O(unless), and whose
    real and effective uid are both this module's (another user's process copying the mark never stalls the run).
    Reads C(/proc/PID/environ) and C(/proc/PID/status); never signals anything. The callback's task carries
    E(HOSTLOCK_SERIALIZE_HOST=-) itself, so that two waits (left by killed runs) never wait for each other.
  - The first time it finds such processes it names them (RV(stdout)), and sets its own process name to
    C(hl-wait PID), the first of them (as C(ps) and C(top) show it), while it waits.
options:
  mark:
    description: The environment entry (C(KEY=VALUE)) of the processes to wait for, the host's
      E(HOSTLOCK_SERIALIZE_HOST) in the earlier runs' tasks.
    type: str
    required: true
  unless:
    description: The environment entry of processes not to wait for, this run's E(HOSTLOCK_SERIALIZE_RUN) in its
      own tasks.
    type: str
    required: true
  timeout:
    description: Seconds to wait; then the task fails (RV(rc) 75). Unset, it waits as long as it takes.
    type: float
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: It only reads C(/proc); the callback runs it in check mode as in a normal run.
  diff_mode:
    support: none
  platform:
    platforms: posix
    details: Linux (C(/proc)); a host without it fails the task.
notes:
  - While it waits it sleeps on the processes' pidfds (Linux 5.3+, Python 3.9+) and scans C(/proc) again when one
    ends (their children carry the mark too); elsewhere it scans every 0.2 s (the engine's C(proc/marks.py), as a
    lease's in-flight wait).
seealso:
  - plugin: hostlock.core.serialize
    plugin_type: callback
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
# Internal: enable the hostlock.core.serialize callback instead (ansible-doc -t callback hostlock.core.serialize),
# which adds this task to each play.
"""

RETURN = r"""
stdout:
  description:
    - "One line C(waiting for pid N: COMMAND LINE) for each process found the first time there were any (the command
      line cut to 200 characters, each that is not printable ASCII shown as C(?)), then, when they all ended,
      C(earlier runs' tasks ended). Empty when there were none."
    - The callback prints each line, naming the host.
  returned: always
  type: str
  sample: "waiting for pid 81234: /bin/sh -c apt-get -y upgrade"
rc:
  description: V(0); V(75) when O(timeout) was up with some left (the callback then ends the run with status 75);
    V(70) without C(/proc).
  returned: always
  type: int
  sample: 0
"""

import os

from ansible.module_utils.basic import AnsibleModule

# First: the engine below is then compiled once, not twice, from the AnsiballZ zip (see _zipimport).
from ansible_collections.hostlock.core.plugins.module_utils import _zipimport  # noqa: F401  # pylint: disable=unused-import
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.errors import EX_TEMPFAIL
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.proc.marks import shown_cmdline, wait_unmarked

EXIT_NO_PROC = 70  # EX_SOFTWARE: what the shell script before this module exited with there


def _entry(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")  # as the host's environment holds it


def _call_this_process(pid: int) -> None:
    """Our process name (`ps`, `top`, `pgrep`) says whom this wait waits for; the tests watch for it."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write("hl-wait %d" % pid)
    except OSError:  # a read-only /proc: only the name is lost
        pass


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            mark=dict(type="str", required=True),
            unless=dict(type="str", required=True),
            timeout=dict(type="float"),
        ),
        supports_check_mode=True,
    )
    if not os.path.isdir("/proc/self"):
        module.fail_json(msg="no /proc: cannot see earlier runs' tasks", rc=EXIT_NO_PROC, stdout="")
    lines: list[str] = []

    def seen(pids: list) -> None:
        lines.extend("waiting for pid %d: %s" % (pid, shown_cmdline(pid)) for pid in pids)
        _call_this_process(min(pids))

    ended = wait_unmarked(_entry(module.params["mark"]), os.geteuid(), unless=_entry(module.params["unless"]),
                          timeout=module.params["timeout"], seen=seen)
    if not ended:
        module.fail_json(msg="still running", rc=EX_TEMPFAIL, stdout="\n".join(lines))
    if lines:
        lines.append("earlier runs' tasks ended")
    module.exit_json(changed=False, rc=0, stdout="\n".join(lines))


if __name__ == "__main__":
    main()
