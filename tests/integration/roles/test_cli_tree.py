"""The cli role installs in one module run what it installed file by file before (commit BASE): the same paths,
types, modes, owners and contents on a fresh host, check mode first changing nothing; and the role applied over
BASE's install changes nothing at all (make test-roles runs this beside the Molecule scenarios).

Each host is a fresh target.sh namespace with ansible-playbook run inside it on the local connection
(roletarget.py), applying the cli role with its defaults.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import roletarget
from roletarget import CLI_PATHS, Target, collection_at, collection_here, differences

# The last commit whose cli role copied the package one module run per file (ansible.builtin.copy in a loop).
BASE = "14ae2f5"
PACKAGE = roletarget.REPO / "plugins" / "module_utils" / "hostlock"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="target.sh mounts overlays: root only"),
    pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="target.sh runs sshd (make roles-deps)"),
]


@pytest.fixture(scope="module")
def work():
    # Not under /tmp: target.sh hides /tmp inside the target (its own tmpfs), and refuses such a directory.
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="hostlock-cli-tree.", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def base_collection(work):
    try:
        return collection_at(BASE, work / "base-collection")
    except subprocess.CalledProcessError:
        pytest.fail(f"commit {BASE} is not in this checkout's history (a shallow clone?): fetch it to compare")


def test_same_tree_as_the_role_that_copied_file_by_file(work, base_collection):
    here = collection_here(work / "collection")
    # BASE's role, installing this checkout's package: any difference is the roles', not the package's.
    with Target(work / "base") as old:
        done = old.play(base_collection, "-e", f"hostlock_cli_source_dir={PACKAGE}", playbook="cli.yml")
        assert done.rc == 0, done.out
        expected = old.snapshot(CLI_PATHS)

        # Over BASE's install (an upgrade of the collection), the role finds everything as it would leave it.
        upgrade = old.play(here, playbook="cli.yml")
        assert upgrade.rc == 0 and upgrade.recap()["changed"] == 0, upgrade.out
        assert differences(expected, old.snapshot(CLI_PATHS)) == []

    with Target(work / "new") as new:
        fresh = new.snapshot(CLI_PATHS)
        check = new.play(here, "--check", playbook="cli.yml")
        assert check.rc == 0 and check.recap()["changed"] > 0, check.out
        assert "hostlock.core.cli : Install the hostlock package" in check.out
        assert differences(fresh, new.snapshot(CLI_PATHS)) == []  # check mode changed nothing

        converge = new.play(here, playbook="cli.yml")
        assert converge.rc == 0 and converge.recap()["changed"] > 0, converge.out
        assert differences(expected, new.snapshot(CLI_PATHS)) == []

        again = new.play(here, playbook="cli.yml")
        assert again.rc == 0 and again.recap()["changed"] == 0, again.out
        again_check = new.play(here, "--check", playbook="cli.yml")
        assert again_check.rc == 0 and again_check.recap()["changed"] == 0, again_check.out
