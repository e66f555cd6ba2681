"""plugin_utils/_payload.py: the wrapped payload without the files the runner's zip carries alike."""

from __future__ import annotations

import base64
import io
import json
import zipfile
from types import SimpleNamespace

import pytest
from ansible import constants as C
from ansible_collections.hostlock.core.plugins.plugin_utils import _payload

SHARED = {"ansible/__init__.py": b"", "ansible/module_utils/basic.py": b"# basic\n" * 500}


def script(files: dict[str, bytes]) -> bytes:
    """An AnsiballZ script as ansible-core 2.19-2.21 renders it, around a zip of `files`."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    data = base64.b64encode(out.getvalue()).decode()
    return (f"def _ansiballz_main(**kw):\n    pass\n\n\nif __name__ == \"__main__\":\n    _ansiballz_main(\n"
            f"ansible_module='ansible.legacy.command',\nextensions={{}},\nzip_data='{data}',\n)\n").encode()


def members(text: bytes) -> dict[str, bytes]:
    found = _payload.ZIP_DATA.search(text)
    assert found is not None
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(found.group(1)))) as z:
        return {name: z.read(name) for name in z.namelist()}


def test_entries_the_runner_holds_alike_go_and_everything_else_stays_as_it_was():
    runner = _payload.entries(script({**SHARED, "ansible/module_utils/urls.py": b"# the runner's urls\n"}))
    wrapped = {**SHARED, "ansible/modules/command.py": b"# the module\n",
               "ansible/module_utils/urls.py": b"# another urls, same name\n",  # same name, other bytes: stays
               "ansible/module_utils/facts/__init__.py": b"# only the wrapped zip has it\n"}
    full = script(wrapped)
    slimmed = _payload.slim(full, runner)
    assert len(slimmed) < len(full)
    assert members(slimmed) == {k: v for k, v in wrapped.items() if k not in SHARED}
    assert slimmed.replace(_payload.ZIP_DATA.search(slimmed).group(1), b"") == \
        full.replace(_payload.ZIP_DATA.search(full).group(1), b"")  # the rest of the script unchanged


@pytest.mark.parametrize("text", [
    b"#!/usr/bin/python\nprint('not an AnsiballZ script')\n",
    script(SHARED).replace(b"zip_data='", b"zip_data='@@"),  # not base64: no match, sent as it is
    _payload.ZIP_DATA.sub(b"\nzip_data='QUJDREVG',\n", script(SHARED)),  # base64, but not a zip
])
def test_a_script_it_cannot_read_is_sent_unchanged(text):
    assert _payload.slim(text, _payload.entries(script(SHARED))) is text


def test_nothing_to_drop_or_no_runner_entries_sends_the_script_itself():
    only_own = script({"ansible/modules/command.py": b"# the module\n"})
    assert _payload.slim(only_own, _payload.entries(script(SHARED))) is only_own
    full = script(SHARED)
    assert _payload.slim(full, {}) is full


def test_the_runner_entries_are_read_once_per_run_and_kept(tmp_path, monkeypatch):
    local_tmp = tmp_path / "ansible-local-1234abcd"
    local_tmp.mkdir(mode=0o700)
    monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(local_tmp), raising=False)
    built = []

    def configure(name, args, task_vars):
        built.append(name)
        return SimpleNamespace(module_style="new", b_module_data=script(SHARED)), "/path"

    action = SimpleNamespace(_configure_module=configure)
    runner = "hostlock.core.locked_host"
    first = _payload.runner_entries(action, {}, runner)
    assert set(first) == set(SHARED) and built == [runner]
    assert json.loads((local_tmp / _payload.DIRECTORY / _payload.ENTRIES).read_text()) == first
    assert _payload.runner_entries(action, {}, runner) == first and len(built) == 1  # kept: not built again
    wrapped = script({**SHARED, "ansible/modules/ping.py": b"# ping\n"})
    assert set(members(base64.b64decode(_payload.encoded(action, wrapped, {}, runner)))) == {"ansible/modules/ping.py"}


def test_a_damaged_member_it_must_keep_sends_the_script_unchanged():
    own = b"# the module, long enough to be deflated into a stream we can damage\n" * 40
    text = script({**SHARED, "ansible/modules/command.py": own})
    found = _payload.ZIP_DATA.search(text)
    data = bytearray(base64.b64decode(found.group(1)))
    member = data.index(b"ansible/modules/command.py") + len("ansible/modules/command.py")  # its local header
    data[member + 5:member + 25] = b"\xff" * 20  # its deflate stream, not the central directory
    damaged = text[: found.start(1)] + base64.b64encode(bytes(data)) + text[found.end(1):]
    assert _payload.slim(damaged, _payload.entries(script(SHARED))) is damaged
