"""hostlock.core.cron refuses, before changing anything, a host without crontab (ansible.builtin.cron needs it)."""

from __future__ import annotations

import os
import shutil

import pytest

CRONTAB = shutil.which("crontab")


def _path_without_crontab(tmp_path):
    """A PATH with every tool the modules need (symlinked) but crontab."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep) + ["/usr/sbin", "/usr/bin", "/bin"]:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            src, dst = os.path.join(d, name), bindir / name
            if name != "crontab" and not dst.exists() and os.path.isfile(src) and os.access(src, os.X_OK):
                dst.symlink_to(src)
    return str(bindir)


@pytest.fixture
def cron_setup(ansible, tmp_path):
    cron_dir = tmp_path / "cron.d"
    cron_dir.mkdir()
    fake = tmp_path / "hostlock"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    return cron_dir, str(fake)


@pytest.mark.skipif(CRONTAB is None, reason="needs crontab(1) for the control run (apt-get install cron)")
def test_cron_role_writes_the_entry_where_crontab_exists(ansible, cron_setup):
    cron_dir, fake = cron_setup
    search_path = os.path.dirname(CRONTAB) + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
    run = ansible.play("cron_role.yml", extra_vars=dict(search_path=search_path, cron_dir=str(cron_dir),
                                                        hostlock_bin=fake))
    assert run.rc == 0, run.out
    assert "hostlock cron --name nightly" in (cron_dir / "hostlock-nightly").read_text()


def test_cron_role_without_crontab_fails_clearly_and_changes_nothing(ansible, cron_setup, tmp_path):
    cron_dir, fake = cron_setup
    search_path = _path_without_crontab(tmp_path)
    run = ansible.play("cron_role.yml", extra_vars=dict(search_path=search_path, cron_dir=str(cron_dir),
                                                        hostlock_bin=fake))
    assert run.rc != 0, run.out
    assert "hostlock.core.cron: crontab is not installed on loc" in run.out, run.out
    assert "Nothing was changed" in run.out
    assert list(cron_dir.iterdir()) == []
