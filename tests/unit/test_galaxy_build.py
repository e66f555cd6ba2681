"""The published tarball (`ansible-galaxy collection build`) ships what users need and nothing for developers.

Built from the files a fresh clone has (tracked, plus untracked-but-not-ignored work in progress), like
`make sanity`'s copy, so leftovers in a developer's checkout do not change the answer.
"""

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GALAXY = Path(sys.executable).with_name("ansible-galaxy")

# What users of the collection get: the plugins (the engine in module_utils/hostlock, its data: what the cli role
# installs), the roles, the runtime metadata, the manual, the licence and the changelog.
SHIPPED_TOP = {"CHANGELOG.md", "COPYING", "FILES.json", "MANIFEST.json", "README.md",
               "changelogs", "docs", "meta", "plugins", "roles"}
NEVER = ("tests/", "benchmarks/", "demo/", "tools/", "requirements/", "mk/", "changelogs/fragments/",
         "/molecule/", "__pycache__", ".venv", "Makefile", "pytest.ini", "mypy.ini", "ruff.toml",
         "pyproject.toml", "setup.py", "scripts/", "extensions/")


def checkout_files():
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return sorted(f for f in out.split("\0") if f and (ROOT / f).exists())


@pytest.fixture(scope="module")
def tarball_names(tmp_path_factory):
    if not GALAXY.exists():
        pytest.skip("ansible-galaxy is not installed next to this interpreter (run under make's .venv)")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the file list of a fresh clone is unknown")
    src = tmp_path_factory.mktemp("src") / "core"
    for f in checkout_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f, follow_symlinks=False)
    out = tmp_path_factory.mktemp("out")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    subprocess.run([str(GALAXY), "collection", "build", "--output-path", str(out), str(src)],
                   check=True, capture_output=True, env=env)
    (tarball,) = out.glob("hostlock-core-*.tar.gz")
    with tarfile.open(tarball) as tar:
        return {m.name + ("/" if m.isdir() else "") for m in tar.getmembers()}


def test_tarball_ships_only_what_users_need(tarball_names):
    assert {n.split("/")[0] for n in tarball_names} == SHIPPED_TOP
    leaked = sorted(n for n in tarball_names if any(bad in "/" + n for bad in NEVER))
    assert leaked == []


def test_tarball_has_the_engine_and_every_plugin(tarball_names):
    engine = {p.relative_to(ROOT).as_posix() for p in (ROOT / "plugins/module_utils/hostlock").rglob("*.py")
              if "__pycache__" not in p.parts}
    assert engine and engine <= tarball_names
    plugins = {f for f in checkout_files() if f.startswith("plugins/") and f.endswith(".py")}
    assert plugins <= tarball_names


def test_tarball_has_every_role_file_and_the_cli_role_data(tarball_names):
    roles = {f for f in checkout_files() if f.startswith("roles/") and "/molecule/" not in f}
    assert roles and roles <= tarball_names
    data_dir = ROOT / "plugins/module_utils/hostlock/data"
    data = {data_dir.relative_to(ROOT).as_posix() + "/" + p.name for p in data_dir.iterdir()}
    assert data and data <= tarball_names


def test_tarball_has_licence_changelog_and_metadata(tarball_names):
    assert {"COPYING", "CHANGELOG.md", "changelogs/changelog.yaml", "meta/runtime.yml", "README.md"} <= tarball_names
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    for key in ("repository", "documentation", "homepage", "issues"):
        assert galaxy[key].startswith("https://"), key
