"""The suite runs from a clone in a private directory (a 0700 home, `mktemp -d`), as a newcomer's often is.

The tests that act as another user (setpriv 65534) start interpreters that import hostlock; from a private
checkout they can only do so through engine_helpers.LIB, the copy every user can read. This runs every such
test again from a copy of the checkout in a 0700 directory, so a test that reaches for the checkout's own
path as another user fails here, not on the first clone in a private home.

"Such a test" is found in its source: a test function whose code, or the code of a helper or fixture it names
(in its file, its conftest.py, tests/engine_helpers.py, tests/integration/cli/cli_support.py, followed name by
name), starts setpriv or calls as_member()/as_user() (docstrings and comments do not count). Only those run
again (in one pytest: its start costs more than most of them); the rest of their files runs as root's would.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
THIS = Path(__file__).resolve()
# What marks code that runs as another user: in an argv or a shell line (setpriv), or a call of these helpers.
OTHER_USER_MARKS = ("setpriv", "as_member(", "as_user(")
OTHER_USER_HELPERS = frozenset(("as_member", "as_user"))
# Where the helpers and fixtures a test names may live, besides its own file and its directory's conftest.py.
HELPER_FILES = ("tests/engine_helpers.py", "tests/integration/cli/cli_support.py")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("git"),
                                reason="needs root, setpriv and git")


def _git_files() -> list | None:
    """The checkout's tracked files, or None when this is not a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=False)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    return [f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


def _tracked_files() -> list:
    files = _git_files()
    if files is None:
        pytest.skip("not a git checkout")
    return files


def _docstrings(tree: ast.AST) -> set:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _marked(node: ast.AST, docs: set) -> bool:
    """Code (not a docstring) that runs something as another user."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in OTHER_USER_HELPERS:
            return True
        if (isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                and any(mark in n.value for mark in OTHER_USER_MARKS)):
            return True
    return False


def _top_level(tree: ast.Module) -> dict:
    """name -> the module-level definitions (functions, classes, assignments) of that name."""
    out: dict = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, []).append(node)
    return out


def _names(node: ast.AST) -> set:
    """The names a definition uses, its parameters (fixtures) included."""
    return ({n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            | {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)})


def other_user_tests(source: str, helpers: list) -> list:
    """The test functions of a test file's `source` (`name`, `Class::name`) that act as another user, with
    `helpers` the sources of the files its helpers and fixtures may come from."""
    tree = ast.parse(source)
    pool: dict = {}
    docs = _docstrings(tree)
    for text in [source, *helpers]:
        helper_tree = tree if text is source else ast.parse(text)
        docs |= _docstrings(helper_tree)
        for name, nodes in _top_level(helper_tree).items():
            pool.setdefault(name, []).extend(nodes)
    tests = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            tests.append((node.name, node))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            tests += [("%s::%s" % (node.name, m.name), m) for m in node.body
                      if isinstance(m, ast.FunctionDef) and m.name.startswith("test")]
    found = []
    for name, node in tests:
        seen: set = set()
        todo = [node]
        while todo:
            n = todo.pop()
            if _marked(n, docs):
                found.append(name)
                break
            for used in _names(n) - seen:
                seen.add(used)
                todo.extend(pool.get(used, ()))
    return found


def _selection(files: list) -> dict:
    """{test file: [node ids that act as another user]} among the engine's and the command line's tests."""
    helpers = [(ROOT / h).read_text() for h in HELPER_FILES if (ROOT / h).is_file()]
    out = {}
    for f in files:
        path = ROOT / f
        if (f.startswith(("tests/integration/engine/", "tests/integration/cli/")) and path.name.startswith("test_")
                and f.endswith(".py") and path != THIS):
            text = path.read_text()
            if not any(mark in text for mark in OTHER_USER_MARKS):
                continue
            conftest = path.parent / "conftest.py"
            found = other_user_tests(text, helpers + ([conftest.read_text()] if conftest.is_file() else []))
            if found:
                out[f] = ["%s::%s" % (f, name) for name in found]
    return out


_FILES = _git_files()
SELECTED = _selection(_FILES) if _FILES is not None else {}


# A path to the checkout's own lib/ built in a test file: what another user cannot import from a private clone.
CHECKOUT_LIB_PATH = re.compile(r"""parents\[\d\]\s*/\s*["']lib["']\s*$|["']\.\.["'],\s*["']lib["']\)""", re.M)


def test_no_test_that_acts_as_another_user_builds_its_own_path_to_the_checkouts_lib():
    """Static, for the suites the run below does not cover (fleet, ansible: they need servers)."""
    offenders = []
    for f in _tracked_files():
        path = ROOT / f
        if f.startswith("tests/") and f.endswith(".py") and path.name != "engine_helpers.py":
            text = path.read_text()
            if any(mark in text for mark in OTHER_USER_MARKS) and CHECKOUT_LIB_PATH.search(text):
                offenders.append(f)
    assert not offenders, "use engine_helpers.LIB (a copy every user can read) in: %s" % offenders


def test_the_finder_finds_code_that_runs_as_another_user_and_nothing_else():
    """The finder itself: setpriv in an argv or a code string, a helper's call, through a helper or a fixture
    it names; not a docstring, not a comment, not a test that names none of those."""
    helpers = ["import pytest\n@pytest.fixture\ndef nobody():\n    return ['setpriv', '--reuid=65534']\n"]
    source = (
        "import subprocess\n"
        "def _as_nobody(argv):\n    return subprocess.run(['setpriv', '--reuid=65534', *argv])\n"
        "def test_argv():\n    subprocess.run(['setpriv', '--reuid=65534', 'true'])\n"
        "def test_through_a_helper():\n    _as_nobody(['true'])\n"
        "def test_through_a_fixture(nobody):\n    subprocess.run([*nobody, 'true'])\n"
        "def test_member():\n    as_member(1, ['true'])\n"
        "def test_code_string():\n    run('print(as_user(65534, f))')\n"
        "class TestGroup:\n    def test_method(self):\n        _as_nobody([])\n"
        "def test_docstring_only():\n    \"\"\"Not as setpriv does.\"\"\"\n"
        "    # setpriv\n    subprocess.run(['true'])\n"
    )
    assert other_user_tests(source, helpers) == ["test_argv", "test_through_a_helper", "test_through_a_fixture",
                                                 "test_member", "test_code_string", "TestGroup::test_method"]


def test_the_finder_still_finds_the_tests_that_act_as_another_user():
    _tracked_files()
    assert len(SELECTED) >= 5, SELECTED
    assert sum(len(ids) for ids in SELECTED.values()) >= 20, SELECTED


def test_the_tests_that_act_as_another_user_pass_from_a_private_checkout():
    files = _tracked_files()
    assert SELECTED, "no test that acts as another user was found"
    top = tempfile.mkdtemp(prefix="hostlock-private-")  # mkdtemp makes it 0700: nobody else may enter
    try:
        assert os.stat(top).st_mode & 0o777 == 0o700
        copy = Path(top) / "checkout"
        for f in files:
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, copy / f, follow_symlinks=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HOSTLOCK_"))}
        ids = [i for f in sorted(SELECTED) for i in SELECTED[f]]
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", *ids], cwd=copy,
                           env=env, capture_output=True, text=True, timeout=540, check=False)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    finally:
        shutil.rmtree(top, ignore_errors=True)
