"""The collection as users get it: ansible-doc renders every plugin, every EXAMPLES block runs."""

from __future__ import annotations

import ast
import subprocess

import pytest
import yaml
from harness import PLAYBOOKS, REPO, VENV_BIN

PLUGINS = [
    ("module", "hostlock.core.lock"),
    ("module", "hostlock.core.lock_info"),
    ("module", "hostlock.core.locked"),
    ("module", "hostlock.core.lock_host"),
    ("module", "hostlock.core.locked_host"),
    ("module", "hostlock.core.cli_install"),
    ("module", "hostlock.core.serialize_host"),
    ("callback", "hostlock.core.serialize"),
    ("role", "hostlock.core.cli"),
    ("role", "hostlock.core.cron"),
    ("role", "hostlock.core.with_lock"),
]


# The etcd the fleet examples name; test_examples_run runs them against a real one instead.
EXAMPLE_FLEET = "etcd://etcd.example.com:2379"


class _Indented(yaml.SafeDumper):
    """Indents block sequences under their key, as yamllint (and so ansible-lint) wants."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def _installed(collections_path):
    return collections_path / "ansible_collections" / "hostlock" / "core"


@pytest.mark.parametrize(("kind", "name"), PLUGINS)
def test_ansible_doc_renders(ansible, kind, name):
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "-t", kind, name],
        env=ansible.env(),
        cwd=ansible.work,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    assert name in proc.stdout and ("OPTIONS" in proc.stdout if kind != "role" else "ENTRY POINT:" in proc.stdout)


INTERNAL_OPTIONS = [
    ("hostlock.core.lock", ["controller", "turns"]),
    ("hostlock.core.locked", ["payload", "compiled", "controller", "heartbeat", "turns"]),
]


@pytest.mark.parametrize(("name", "internal"), INTERNAL_OPTIONS)
def test_ansible_doc_leads_with_what_a_user_sets(ansible, name, internal):
    """issue 40 item 4: locked's page was 450 lines, its internal options among the user's and in `-s`."""
    env = dict(ansible.env(), COLUMNS="120")
    page = subprocess.run([str(VENV_BIN / "ansible-doc"), name], env=env, cwd=ansible.work, capture_output=True,
                          text=True, check=True).stdout
    snippet = subprocess.run([str(VENV_BIN / "ansible-doc"), "-s", name], env=env, cwd=ansible.work,
                             capture_output=True, text=True, check=True).stdout
    for option in internal:
        assert f"{option}:" not in snippet and f"\n   {option} " not in page, option
    assert "with_lock" in page and "heartbeat block" not in page
    examples = page.partition("EXAMPLES:")[2]
    first = examples.split("- name:")[1]
    assert ("with_lock" in first) if name.endswith(".lock") else ("template" in first), first
    print(f"{name}: page {len(page.splitlines())} lines, -s {len(snippet.splitlines())} lines")


def _examples(path) -> list:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXAMPLES":
            return yaml.safe_load(node.value.value)
    raise AssertionError(f"{path} has no EXAMPLES")


def _task_names(tasks: list) -> set:
    """The names of the tasks that report results: a block's own name does not, its tasks do."""
    names = set()
    for task in tasks:
        if "block" in task:
            names |= _task_names(task["block"] + task.get("rescue", []) + task.get("always", []))
        else:
            names.add(task["name"])
    return names


@pytest.mark.parametrize("module", ["lock", "lock_info", "locked"])
def test_examples_run(ansible, collections_path, module, request):
    """Each module's EXAMPLES, taken from the installed copy, run as one play against this host.

    The host interpreter here is /usr/bin/python3: the locked example drives ansible.builtin.apt,
    which needs Debian's python3-apt.
    """
    tasks = _examples(_installed(collections_path) / "plugins" / "modules" / f"{module}.py")
    if any("fleet" in str(task) for task in tasks):
        # the fleet examples run against a real etcd of their own, in place of the documented one
        tasks = yaml.safe_load(yaml.safe_dump(tasks).replace(EXAMPLE_FLEET, request.getfixturevalue("etcd").url))
    # what the examples name beside the playbook: a template, a tasks file for with_lock
    (ansible.work / "templates").mkdir(exist_ok=True)
    (ansible.work / "templates" / "app.conf.j2").write_text("threads = 4 # {{ inventory_hostname }}\n")
    (ansible.work / "deploy-steps.yml").write_text(
        "- name: A deploy step\n  ansible.builtin.command: 'true'\n  changed_when: false\n")
    playbook = ansible.work / f"examples-{module}.yml"
    playbook.write_text(
        yaml.safe_dump(
            [dict(name=f"{module} examples", hosts="examples", gather_facts=False, tasks=tasks)], sort_keys=False
        )
    )
    ansible.inventory.write_text("examples ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n")
    run = ansible.play(str(playbook))
    assert run.rc == 0, run.out
    results = run.results()
    # every example reports (the with_lock examples add the role's own tasks' results)
    assert _task_names(tasks) <= set(results), sorted(_task_names(tasks) - set(results))
    statuses = {name: hosts["examples"]["_status"] for name, hosts in results.items()}
    assert "failed" not in statuses.values(), statuses


def test_target_interpreter_is_bare(ansible):
    """The modules' host interpreter has neither psutil nor hostlock: the engine travels with the module."""
    for mod in ("psutil", "hostlock"):
        proc = subprocess.run([ansible.python, "-c", f"import {mod}"], capture_output=True, check=False)
        assert proc.returncode != 0, f"{ansible.python} can import {mod}: the tests would not prove anything"


def test_ansible_lint_production(ansible, collections_path):
    """ansible-lint's production profile on the demo, the test playbooks, the targets and every EXAMPLES block."""
    examples = ansible.work / "examples"
    examples.mkdir()
    for module in ("lock", "lock_info", "locked"):
        tasks = _examples(_installed(collections_path) / "plugins" / "modules" / f"{module}.py")
        play = [dict(name=f"Examples of hostlock.core.{module}", hosts="all", gather_facts=False, tasks=tasks)]
        (examples / f"{module}.yml").write_text("---\n" + yaml.dump(play, Dumper=_Indented, sort_keys=False))
    paths = [str(REPO / "demo" / "ansible"), str(PLAYBOOKS), str(examples)]
    paths += [str(p) for p in sorted((REPO / "tests" / "integration" / "targets").glob("lock*"))]
    env = {k: v for k, v in ansible.env().items() if k not in ("ANSIBLE_CALLBACK_PLUGINS", "ANSIBLE_CALLBACKS_ENABLED")}
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-lint"), "--offline", "--profile", "production", "--nocolor", *paths],
        env=env,
        cwd=ansible.work,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Passed" in proc.stdout + proc.stderr
