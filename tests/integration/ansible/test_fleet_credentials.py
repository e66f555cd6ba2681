"""The fleet plugins take the same password file as the command (issue 24, item 5), on the controller.

`hostlock.core.lock`, `locked` and `lock_info` with `fleet: etcd://USER@...` log in with the controller's
$HOSTLOCK_FLEET_PASSWORD_FILE; a file other users could read is refused, each task failing with one line that
names it; the password never shows in the run's output.
"""

from __future__ import annotations

import os

SECRET = "ansible-s3cret"
PLUGIN_TASKS = ("Lease on the wrong fleet", "Locked on the wrong fleet", "Lock info on the wrong fleet")


def _auth(etcd) -> None:
    for args in (("user", "add", "root:rootpw"), ("user", "add", "ops:" + SECRET), ("role", "add", "locks"),
                 ("role", "grant-permission", "locks", "--prefix=true", "readwrite", "hostlock/"),
                 ("user", "grant-role", "ops", "locks"), ("auth", "enable")):
        r = etcd.etcdctl(*args)
        assert r.returncode == 0, r.stderr


def test_the_plugins_log_in_with_a_password_file_and_refuse_a_readable_one(ansible, etcd, tmp_path):
    _auth(etcd)
    pw = tmp_path / "etcd-password"
    pw.write_text(SECRET + "\n")
    fleet = "etcd://ops@" + etcd.endpoint
    for mode, ok in ((0o600, True), (0o644, False)):
        os.chmod(str(pw), mode)
        run = ansible.play("fleet_wrong.yml", extra_vars=dict(pattern="loc", fleet=fleet),
                           HOSTLOCK_FLEET_PASSWORD_FILE=str(pw))
        assert run.rc == 0, run.out  # every task ignores its error; the test reads them
        results = run.results()
        for task in PLUGIN_TASKS:
            result = results[task]["loc"]
            if ok and task.startswith("Locked"):  # logged in: it found the lease the task before took
                assert "held by this same playbook run" in result["msg"], (task, result)
            elif ok:
                assert result["_status"] != "failed", (task, result)
            else:
                assert result["_status"] == "failed", (task, result)
                assert "fleet password file %s ($HOSTLOCK_FLEET_PASSWORD_FILE) may be read or written by other " \
                       "users" % pw in result["msg"], (task, result)
        assert SECRET not in run.out
