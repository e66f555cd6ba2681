#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serialized
short_description: Fail the run unless the hostlock.core.serialize callback holds this host
version_added: 0.2.0
description:
  - Put it first in C(pre_tasks) of a play that must not run unserialized. It passes when the
    C(hostlock.core.serialize) callback is active in this C(ansible-playbook) run and holds this host's lock;
    otherwise it fails the host with one line naming the setting that is missing or misspelt.
  - ansible-core runs a play without a callback it was never told to load, and says nothing for the removed
    C(callback_whitelist); for a misspelt C(callbacks_enabled) entry it only warns. This task turns each into
    a failure before the play's first real task, for example in CI.
  - Misspelt settings of the callback itself (a C([hostlock-serialize]) section, a C(timout) key, a
    E(HOSTLOCK_SERIALIZE_TIMOUT) variable) stop the run when the callback loads (status 64), before this task.
  - The proof is the callback's own state in this process (the worker that runs this task is forked from
    C(ansible-playbook) after the callback locked the play's hosts); no variable, file or environment a user
    sets can make it pass.
  - In check mode it passes when the callback is active (check mode takes no lock unless the play changes hosts
    for real; then it needs the lock as a real run does).
  - Runs on the controller only; nothing is sent to the host.
options: {}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: An action plugin on the controller does all the work; this module only documents it.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: It only reads the callback's state.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - plugin: hostlock.core.serialize
    plugin_type: callback
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
- name: Deploy, one run at a time per host
  hosts: web
  pre_tasks:
    - name: Refuse to run unless hostlock.core.serialize holds this host
      hostlock.core.serialized: {}
  roles:
    - myapp
"""

RETURN = r"""
msg:
  description: How the callback holds the host (or, on failure, the setting that is missing or misspelt).
  returned: always
  type: str
  sample: hostlock.core.serialize holds lock ansible-host@web1 for this run
"""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.fail_json(msg="hostlock.core.serialized runs on the controller (its action plugin): use it as a task")


if __name__ == "__main__":
    main()
