"""The engine compiled once per host in a run (plugin_utils/_hostcode.py), through real ansible-playbook runs.

Between a host's first and second locked runs, the code the controller kept is replaced by a build of the
engine, compiled by the host's interpreter, whose `_runner` and `channel.release` leave a mark: the mark
proves the later runs execute the kept code instead of compiling the shipped sources, the result proves
they still work, and the results prove the code never reaches them.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

SWAP = textwrap.dedent(r'''
    import base64, glob, os, subprocess, sys, zipfile
    local_tmp, python, engine, marks, zip_path = sys.argv[1:6]
    kept = glob.glob(os.path.join(local_tmp, "ansible-local-*", "hostlock-compiled", "*"))
    assert len(kept) == 1, kept  # one host, one user, one interpreter: one key
    assert not os.listdir(marks), "marked code ran before it was given"
    mu = "ansible_collections/hostlock/core/plugins/module_utils"
    mark = "open(os.path.join(%r, %r), 'w').close()\n"
    with zipfile.ZipFile(zip_path, "w") as z:
        for package in ("ansible_collections", "ansible_collections/hostlock", "ansible_collections/hostlock/core",
                        "ansible_collections/hostlock/core/plugins", mu):
            z.writestr(package + "/__init__.py", "")
        for root, _dirs, files in os.walk(engine):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(root, f)
                rel = os.path.relpath(path, engine)
                text = open(path).read()
                if rel == "_runner.py":
                    text += "\nimport os\n" + mark % (marks, "runner")
                if rel == os.path.join("hostlock", "host", "channel.py"):
                    text += ("\n_release = release\n\ndef release(*a, **k):\n    " + mark % (marks, "release")
                             + "    return _release(*a, **k)\n")
                z.writestr(mu + "/" + rel, text)
    probe = ("import sys; sys.path.insert(0, sys.argv[1])\n"
             "from ansible_collections.hostlock.core.plugins.module_utils import _zipimport\n"
             "from ansible_collections.hostlock.core.plugins.module_utils import _runner\n"
             "from ansible_collections.hostlock.core.plugins.module_utils.hostlock.host import channel\n"
             "sys.stdout.buffer.write(_zipimport.exported())\n")
    blob = subprocess.run([python, "-I", "-c", probe, zip_path], capture_output=True, check=True).stdout
    for name in os.listdir(marks):  # exporting imported the marked modules here: not a host run
        os.unlink(os.path.join(marks, name))
    with open(kept[0], "w") as f:
        f.write(base64.b64encode(blob).decode())
    print("swapped")
''')


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_later_locked_runs_execute_the_code_the_first_one_compiled(ansible, engine, target, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "swap.py"
    script.write_text(SWAP)
    module_utils = ansible.collections / "ansible_collections" / "hostlock" / "core" / "plugins" / "module_utils"
    swap = " ".join([sys.executable, str(script), str(ansible.work / "ansible-local"), ansible.python,
                     str(module_utils), str(marks), str(tmp_path / "marked.zip")])
    run = ansible.play("locked_compiled.yml", extra_vars=dict(target=target, swap=swap))
    assert run.rc == 0, run.out
    r = {task: hosts[target] for task, hosts in run.results().items()}
    assert r["Swap the code the controller kept for a marked build"]["msg"] == "swapped", r
    assert r["First locked run on this host"]["ping"] == "first"
    assert r["Second locked run on this host"]["ping"] == "second"
    copied = r["A copy under a lease, released by one short interpreter run"]
    assert copied["hostlock"]["released"] is True, copied
    assert (ansible.work / f"{target}-compiled.txt").read_text() == "copied\n"
    # the second run and the copy's first step ran the kept code; the release ran its part of it
    assert sorted(p.name for p in marks.iterdir()) == ["release", "runner"], list(marks.iterdir())
    for name, result in r.items():
        assert "compiled" not in result.get("hostlock", {}), (name, result)
        assert "hostlock-code" not in str(result), name
    assert not engine.status("compiled", directory=str(ansible.lockdir)).holders
