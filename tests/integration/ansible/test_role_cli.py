"""hostlock.core.cli: check mode fails where the real run would, before anything on the host changes."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("bin_dir", ["missing", "a-file"])
def test_check_mode_refuses_a_launcher_directory_that_is_not_there(ansible, tmp_path, bin_dir):
    where = tmp_path / bin_dir
    if bin_dir == "a-file":
        where.write_text("")
    paths = dict(bin_dir=str(where), lib_dir=str(tmp_path / "role-lib"), lock_dir=str(tmp_path / "role-locks"),
                 tmpfiles_dir=str(tmp_path / "tmpfiles.d"))
    run = ansible.play("cli_role.yml", "--check", extra_vars=paths)
    assert run.rc != 0, run.out
    assert f"hostlock_cli_bin_dir {where} is not a directory on loc" in run.out, run.out
    assert not (tmp_path / "role-lib").exists() and not (tmp_path / "role-locks").exists()  # nothing changed


def test_check_mode_passes_with_an_existing_launcher_directory(ansible, tmp_path):
    (tmp_path / "bin").mkdir()
    paths = dict(bin_dir=str(tmp_path / "bin"), lib_dir=str(tmp_path / "role-lib"),
                 lock_dir=str(tmp_path / "role-locks"), tmpfiles_dir=str(tmp_path / "tmpfiles.d"))
    run = ansible.play("cli_role.yml", "--check", extra_vars=paths)
    assert run.rc == 0, run.out
    assert not (tmp_path / "bin" / "hostlock").exists() and not (tmp_path / "role-lib").exists()
