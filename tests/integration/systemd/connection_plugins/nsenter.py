# Test-only connection: run every task inside the namespaces of a systemd that tests/systemd_harness.py booted,
# through nsenter(1), as SSH would run it on a real host (modules, files, pipelining), without a network.
from __future__ import annotations

import os
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase

DOCUMENTATION = """
name: nsenter
short_description: Run tasks in the namespaces of a process (the hostlock systemd tests' booted systemd)
description:
  - Runs commands with C(nsenter -t PID -a) in a clean environment, and moves files through the same channel,
    so paths and links resolve inside the namespaces. Test-only (tests/systemd_harness.py).
options:
  remote_addr:
    description: The PID of the namespaces' init (the booted systemd as seen from the controller).
    vars:
      - name: inventory_hostname
      - name: ansible_host
  pipelining:
    description: Feed modules on stdin.
    default: true
    type: boolean
    vars:
      - name: ansible_pipelining
"""

INNER_ENV = ["env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
             "LANG=C.UTF-8"]


class Connection(ConnectionBase):
    transport = "nsenter"
    has_pipelining = True
    default_user = "root"

    def _pid(self) -> str:
        pid = str(self.get_option("remote_addr"))
        if not pid.isdigit() or not os.path.realpath("/proc/%s/exe" % pid).endswith("/systemd"):
            raise AnsibleConnectionFailure("nsenter: %s is not the pid of a running systemd" % pid)
        if os.readlink("/proc/%s/ns/pid" % pid) == os.readlink("/proc/self/ns/pid"):
            raise AnsibleConnectionFailure("nsenter: pid %s shares our PID namespace: not a booted test systemd" % pid)
        return pid

    def _connect(self):
        if not self._connected:
            self._pid()
            self._connected = True
        return self

    def _argv(self, *argv: str) -> list[str]:
        return ["nsenter", "-t", self._pid(), "-a", "--", *INNER_ENV, *argv]

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        proc = subprocess.run(self._argv("/bin/sh", "-c", to_text(cmd)), input=in_data, capture_output=True,
                              check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        if not os.path.exists(to_bytes(in_path)):
            raise AnsibleFileNotFound("nsenter: file to copy does not exist: %s" % in_path)
        with open(to_bytes(in_path), "rb") as src:
            proc = subprocess.run(self._argv("/bin/sh", "-c", 'cat > "$1"', "put", to_text(out_path)), stdin=src,
                                  capture_output=True, check=False)
        if proc.returncode != 0:
            raise AnsibleError("nsenter: could not write %s: %s" % (out_path, to_text(proc.stderr)))

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        with open(to_bytes(out_path), "wb") as dst:
            proc = subprocess.run(self._argv("cat", "--", to_text(in_path)), stdout=dst, stderr=subprocess.PIPE,
                                  check=False)
        if proc.returncode != 0:
            raise AnsibleError("nsenter: could not read %s: %s" % (in_path, to_text(proc.stderr)))

    def close(self):
        self._connected = False
