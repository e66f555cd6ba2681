"""What reaches a managed host: the AnsiballZ payloads of lock, lock_info and locked, read back from a real run.

The engine lives once, in plugins/module_utils/hostlock, grouped by where it runs (docs/layout.md): a
module's payload must carry the model (core/), the host mechanisms (host/) and the policy (api), and nothing
of the fleet (fleet/, run on the controller) or the command line (cli/). Ansible's dependency finder follows
every import statement it sees, those inside functions and under `if TYPE_CHECKING:` too, so one stray
import would ship them: this test reads the payloads Ansible really built (ANSIBLE_KEEP_REMOTE_FILES).
"""

from __future__ import annotations

import ast
import base64
import glob
import io
import json
import os
import re
import zipfile

import pytest

ENGINE = "ansible_collections/hostlock/core/plugins/module_utils/hostlock/"


def payloads(remote_tmp) -> dict[str, list[str]]:
    """{module: names in its AnsiballZ zip} for every AnsiballZ_*.py file left under remote_tmp."""
    found: dict[str, list[str]] = {}
    for wrapper in sorted(remote_tmp.rglob("AnsiballZ_*.py")):
        text = wrapper.read_text()
        # ansible-core 2.19 writes zip_data='...', earlier ones ZIPDATA = """..."""
        m = re.search(r"(?:ZIPDATA|zip_data)\s*=\s*r?('''|\"\"\"|'|\")(.*?)\1", text, re.S)
        assert m, f"no ZIPDATA in {wrapper}"
        names = zipfile.ZipFile(io.BytesIO(base64.b64decode(m.group(2)))).namelist()
        found.setdefault(wrapper.stem.removeprefix("AnsiballZ_"), names)
    return found


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_host_payloads_carry_no_fleet_or_command_line_code(ansible, tmp_path, target):
    remote_tmp = tmp_path / "remote-tmp"
    remote_tmp.mkdir(mode=0o700)
    run = ansible.play("payloads.yml", extra_vars=dict(target=target, lock="payload"),
                       ANSIBLE_KEEP_REMOTE_FILES="1", ANSIBLE_REMOTE_TMP=str(remote_tmp))
    assert run.rc == 0, run.out
    found = payloads(remote_tmp)
    # the modules the actions run on the host: lock and locked are documentation, run as lock_host and locked_host
    assert set(found) >= {"lock_host", "lock_info", "locked_host"}, sorted(found)
    for module, names in found.items():
        engine = sorted(n[len(ENGINE):] for n in names if n.startswith(ENGINE))
        assert "__init__.py" in engine and "api.py" in engine, (module, engine)
        assert any(n.startswith("host/") for n in engine) and any(n.startswith("core/") for n in engine)
        stray = [n for n in engine if n.startswith(("fleet/", "cli/")) or n == "__main__.py"]
        assert stray == [], f"{module}'s payload ships code that never runs on a host: {stray}"


ZIP_DATA = re.compile(r"\nzip_data='([A-Za-z0-9+/=]+)',\n")


def sent(kept: str) -> list[set[str]]:
    """The zip entries of each wrapped payload in the kept runner scripts, oldest first."""
    found = []
    for script in sorted(glob.glob(f"{kept}/*/AnsiballZ_locked_host.py"), key=os.path.getmtime):
        with open(script, encoding="utf-8") as f:
            params = re.search(r"\nparams=('.*'),\n", f.read())
        assert params is not None, script
        args = json.loads(ast.literal_eval(params.group(1)))["ANSIBLE_MODULE_ARGS"]
        wrapped = base64.b64decode(args["payload"]).decode()
        data = ZIP_DATA.search(wrapped)
        assert data is not None, wrapped[-500:]
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(data.group(1)))) as z:
            found.append(set(z.namelist()))
    return found


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_payloads_leave_out_what_the_runner_carries_and_the_modules_still_run(ansible, engine, target, tmp_path):
    kept = tmp_path / "remote-tmp"
    run = ansible.play("locked_payload.yml", extra_vars=dict(target=target),
                       ANSIBLE_KEEP_REMOTE_FILES="1", ANSIBLE_REMOTE_TMP=str(kept))
    assert run.rc == 0, run.out
    r = {task: hosts[target] for task, hosts in run.results().items()}
    assert r["A locked command"]["stdout"] == "first", r
    facts = r["A locked module with module_utils the runner's zip lacks"]["ansible_facts"]
    assert facts["ansible_python"]["executable"] == ansible.python, facts
    assert r["A locked copy, whose first step runs through the runner"]["hostlock"]["released"] is True
    assert (ansible.work / f"{target}-payload.txt").read_text() == "copied\n"
    payloads = sent(str(kept))
    assert len(payloads) == 3, payloads  # the command, setup, and the copy's first step (stat)
    for names, module in zip(payloads, ("command", "setup", "stat"), strict=True):
        assert f"ansible/modules/{module}.py" in names, (module, sorted(names))
        assert "ansible/module_utils/basic.py" not in names, (module, sorted(names))
    assert any(n.startswith("ansible/module_utils/facts/") for n in payloads[1]), sorted(payloads[1])
    assert not engine.status("payload", directory=str(ansible.lockdir)).holders
