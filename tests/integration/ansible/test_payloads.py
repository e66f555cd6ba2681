"""What reaches a managed host: the AnsiballZ payloads of lock, lock_info and locked, read back from a real run.

The engine lives once, in plugins/module_utils/hostlock, grouped by where it runs (docs/layout.md): a
module's payload must carry the model (core/), the host mechanisms (host/) and the policy (api), and nothing
of the fleet (fleet/, run on the controller) or the command line (cli/). Ansible's dependency finder follows
every import statement it sees, those inside functions and under `if TYPE_CHECKING:` too, so one stray
import would ship them: this test reads the payloads Ansible really built (ANSIBLE_KEEP_REMOTE_FILES).
"""

from __future__ import annotations

import base64
import io
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
