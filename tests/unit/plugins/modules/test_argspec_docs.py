"""The options users read (ansible-doc) are the options the plugins take, and none of the internal ones.

hostlock.core.lock and locked are documentation-only module files (their actions run the internal lock_host and
locked_host on the host), so ansible-test's validate-modules cannot compare their docs with a spec: this does,
with the doc fragments merged as ansible-doc merges them (an option's keys in the module override the fragment's).
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import yaml
from ansible_collections.hostlock.core.plugins.doc_fragments.lock import ModuleDocFragment
from ansible_collections.hostlock.core.plugins.module_utils import _argspec

MODULES = Path(__file__).resolve().parents[4] / "plugins" / "modules"
PREFIX = "hostlock.core.lock"


def _literal(path: Path, name: str) -> str:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
            return node.value.value
    raise AssertionError(f"{path} has no {name}")


def documented_options(module: str) -> dict:
    """The module's options as ansible-doc shows them: its own merged over its hostlock.core fragments."""
    doc = yaml.safe_load(_literal(MODULES / f"{module}.py", "DOCUMENTATION"))
    options: dict = {}
    for fragment in doc.get("extends_documentation_fragment", []):
        if not fragment.startswith(PREFIX):
            continue
        var = fragment[len(PREFIX) + 1:].upper() or "DOCUMENTATION"
        for key, value in (yaml.safe_load(getattr(ModuleDocFragment, var))["options"]).items():
            options[key] = copy.deepcopy(value)
    for key, value in (doc.get("options") or {}).items():
        options[key] = dict(options.get(key, {}), **value)
    return options


def _same(spec: dict, docs: dict, where: str) -> None:
    assert set(spec) == set(docs), f"{where}: spec {sorted(spec)} vs docs {sorted(docs)}"
    for key, s in spec.items():
        d = docs[key]
        assert d.get("type", "str") == s.get("type", "str"), (where, key)
        assert d.get("default") == s.get("default"), (where, key)
        assert d.get("choices") == s.get("choices"), (where, key)
        assert bool(d.get("required")) == bool(s.get("required")), (where, key)
        assert d.get("description"), (where, key)
        if "options" in s:
            _same(s["options"], d.get("suboptions") or {}, f"{where}.{key}")


@pytest.mark.parametrize(
    ("module", "spec"),
    [
        ("lock", _argspec.LOCK),
        ("lock_info", _argspec.LOCK_INFO),
        ("lock_host", _argspec.HOST_LOCK),
        ("locked_host", _argspec.HOST_LOCKED),
    ],
)
def test_docs_and_specs_agree(module, spec):
    _same(spec, documented_options(module), module)


def test_locked_documents_the_options_a_task_writes():
    """locked's `task` is written in the task's own shape ({MODULE: ARGS}), which the action reads; its documented
    suboptions are the other shape ({module: M, args: A}), the one the host's side takes."""
    spec = dict(_argspec.LOCKED, task=_argspec.INTERNAL_LOCKED["task"])
    _same(spec, documented_options("locked"), "locked")


@pytest.mark.parametrize(("module", "internal"), [("lock", _argspec.INTERNAL_LOCK),
                                                  ("locked", set(_argspec.INTERNAL_LOCKED) - {"task"})])
def test_the_users_page_has_no_internal_option(module, internal):
    assert not set(internal) & set(documented_options(module))
