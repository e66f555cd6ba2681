"""The version and the supported ansible-core range are stated in several files: keep them in step."""

import ast
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible.release import __version__ as ansible_core_version
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]


def galaxy():
    return yaml.safe_load((ROOT / "galaxy.yml").read_text())


def test_galaxy_and_lib_versions_agree():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert galaxy()["version"] == pyproject["project"]["version"]


def test_engine_version_agrees():
    init = ROOT / "plugins/module_utils/hostlock/__init__.py"
    if not init.exists():
        pytest.skip("plugins/module_utils/hostlock/__init__.py does not exist yet")
    versions = [
        node.value.value
        for node in ast.parse(init.read_text()).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
        and isinstance(node.value, ast.Constant)
    ]
    assert versions == [galaxy()["version"]], "hostlock.__version__ must be a literal equal to galaxy.yml's version"


def test_requires_ansible_covers_the_tested_ansible_core():
    runtime = yaml.safe_load((ROOT / "meta/runtime.yml").read_text())
    assert ansible_core_version in SpecifierSet(runtime["requires_ansible"])


def test_galaxy_metadata_is_complete():
    meta = galaxy()
    assert (meta["namespace"], meta["name"]) == ("hostlock", "core")
    assert meta["license"] == ["GPL-3.0-or-later"]
    assert {".venv", "tests/output"} <= set(meta["build_ignore"])
