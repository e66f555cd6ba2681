"""The engine's layout (docs/layout.md) kept so: no import circle, arrows one way, nothing of the fleet or the
command line imported by what runs on a managed host.

Every import statement counts, those inside functions and under `if TYPE_CHECKING:` too: Ansible's module
dependency finder follows them all into a module's payload, and a circle through a function-level import
is still a circle a reader has to untangle. (tests/integration/ansible/test_payloads.py reads the payloads
Ansible really builds.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "plugins" / "module_utils" / "hostlock"
PREFIX = "ansible_collections.hostlock.core.plugins.module_utils.hostlock"

# What each part may import (besides itself). The policy (api) and the read side (queries) reach fleet/ only by name
# (core.model.fleet_backend's __import__).
ALLOWED = {
    "core": {"core"},
    "host": {"core", "host"},
    "fleet": {"core", "fleet"},
    "proc": {"core", "proc"},
    "queries": {"core", "host"},
    "api": {"core", "host", "queries"},
    "lease": {"api", "queries", "core", "host", "proc"},
    "__init__": {"api", "queries", "lease", "core", "host"},
    "cli": {"__init__", "api", "queries", "lease", "core", "host", "fleet", "proc", "cli"},
    "__main__": {"cli"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ENGINE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["hostlock", *parts])


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ENGINE.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The engine modules `name` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith(("hostlock", PREFIX)):
                target = "hostlock" + node.module[len(PREFIX):] if node.module.startswith(PREFIX) else node.module
            else:
                continue
            for alias in node.names:  # `from . import kernel` imports a module, `from .api import Lock` a name
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("hostlock")}
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def part(name: str) -> str:
    parts = name.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return found


def test_the_engine_has_every_part():
    parts = {part(m) for m in modules()}
    assert parts == set(ALLOWED), parts


def test_no_import_circle():
    assert cycles(graph()) == []


def test_arrows_point_one_way():
    wrong = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                   if part(b) not in ALLOWED[part(a)] | {part(a)})
    assert wrong == []


@pytest.mark.parametrize("plugin", sorted(
    [*(ROOT / "plugins" / "modules").glob("*.py"), *(ROOT / "plugins" / "module_utils").glob("*.py")]),
    ids=lambda p: p.name)
def test_what_runs_on_a_host_imports_no_fleet_or_command_line(plugin):
    known = set(modules())
    name = "hostlock._plugin_" + plugin.stem  # resolved as if beside the engine: only absolute imports count
    found = {m for m in imports(name, plugin, known) if part(m) in ("fleet", "cli", "__main__")}
    text = plugin.read_text()
    relative = {m for m in ("fleet", "cli") if f".hostlock.{m}" in text or f"from .hostlock import {m}" in text}
    assert found == set() and relative == set()


def test_the_checker_sees_function_level_and_type_only_imports(tmp_path):
    """The checker itself: an import inside a function or under TYPE_CHECKING is an arrow too."""
    f = tmp_path / "x.py"
    known = {"hostlock.host.x", "hostlock.fleet.url", "hostlock.cli.common", "hostlock.cli"}
    f.write_text("TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from ..fleet.url import FleetURL\n")
    assert imports("hostlock.host.x", f, known) == {"hostlock.fleet.url"}
    f.write_text("def f():\n    from ..cli import common\n")
    assert imports("hostlock.host.x", f, known) == {"hostlock.cli.common"}
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


LAYOUT_DOC = ROOT / "docs" / "layout.md"


def named_in_layout(text: str) -> set[str]:
    """What docs/layout.md names: every `path` in backticks, and in a table row whose first cell is `DIR/`, every
    `name` of that row as DIR/name (the engine's paths relative to plugins/module_utils/hostlock, the others'
    relative to plugins/)."""
    import re

    named = set(re.findall(r"`([^`\s]+)`", text))
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) > 2:
            first = re.fullmatch(r"\s*`([^`]+/)`.*", cells[1])
            if first:
                named |= {first.group(1) + n for n in re.findall(r"`([^`\s/]+)`", "|".join(cells[2:]))}
    return named


def layout_files() -> list[str]:
    """Every file of plugins/ as docs/layout.md should name it."""
    out = []
    for p in sorted((ROOT / "plugins").rglob("*")):
        if p.is_dir() or "__pycache__" in p.parts:
            continue
        out.append(str(p.relative_to(ENGINE)) if ENGINE in p.parents else str(p.relative_to(ROOT / "plugins")))
    return out


def test_the_layout_names_every_file_of_plugins():
    named = named_in_layout(LAYOUT_DOC.read_text())
    assert [f for f in layout_files() if f not in named] == []


def test_the_layout_checker_sees_rows_and_paths():
    text = "| `core/` | x | `a.py` (`b`) |\n\nsee `proc/job.py`, and `modules/lock.py`\n"
    assert {"core/a.py", "proc/job.py", "modules/lock.py"} <= named_in_layout(text)
    assert "core/c.py" not in named_in_layout(text) and "proc/a.py" not in named_in_layout(text)
