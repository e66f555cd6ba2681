# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the wrapped module's payload as hostlock.core.locked sends it, without what the
runner's own zip already carries.

The host-side runner (module_utils/_runner.py) runs the wrapped module's AnsiballZ script in a forked child
that reuses the runner's imports and finds any other module through the runner's zip as well as the wrapped
one. So the wrapped zip's copies of files the runner's zip holds (ansible.module_utils.basic and the rest:
about 110 kB of the command module's 130 kB zip) are dead weight, sent on every task. slim() drops them:
an entry goes only when the runner's zip has the same name with the same size and CRC-32, so the child
imports the same bytes either way.

The runner's entries are read once per ansible-playbook run (building its AnsiballZ script, as the task is
about to anyway) and kept in the run's own local temporary directory (plugin_utils/_hostcode.py).
A payload that is not an ansible-core 2.19+ AnsiballZ script, or that cannot be read, is sent unchanged.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import typing as t
import zipfile
import zlib

from ansible_collections.hostlock.core.plugins.plugin_utils import _hostcode

DIRECTORY = "hostlock-payload"  # beside _hostcode's, in the run's local temporary directory
ENTRIES = "runner-zip-entries"  # the file there that keeps the runner zip's entries
# The AnsiballZ script's zip, as ansible-core 2.19+ renders it: `zip_data='BASE64',` in the _ansiballz_main call.
ZIP_DATA = re.compile(rb"\nzip_data='([A-Za-z0-9+/=]+)',\n")
# A zip we cannot read (bad base64, not a zip, a damaged member): the script is sent as it is.
UNREADABLE = (binascii.Error, zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError)


def encoded(action: t.Any, script: bytes, task_vars: dict, runner: str) -> str:
    """`script` (the wrapped module's AnsiballZ script) slimmed for module `runner` (the host-side runner
    the task runs), base64: the `payload` option."""
    return base64.b64encode(slim(script, runner_entries(action, task_vars, runner))).decode("ascii")


def slim(script: bytes, runner: dict[str, list[int]]) -> bytes:
    """`script` without the zip entries `runner` ({name: [size, crc]}) holds alike; `script` itself if none."""
    got = _zip(script) if runner else None
    if got is None:
        return script
    found, old = got
    with old:
        kept = [i for i in old.infolist() if runner.get(i.filename) != [i.file_size, i.CRC]]
        if len(kept) == len(old.infolist()):
            return script
        out = io.BytesIO()
        try:
            with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as new:
                for info in kept:
                    new.writestr(info, old.read(info))
        except UNREADABLE:
            return script
    return b"".join((script[: found.start(1)], base64.b64encode(out.getvalue()), script[found.end(1):]))


def entries(script: bytes) -> dict[str, list[int]]:
    """{name: [size, crc]} of the zip in an AnsiballZ script; {} when it has none we can read."""
    got = _zip(script)
    if got is None:
        return {}
    with got[1] as z:
        return {i.filename: [i.file_size, i.CRC] for i in z.infolist()}


def _zip(script: bytes) -> tuple[re.Match[bytes], zipfile.ZipFile] | None:
    """Where an AnsiballZ script's zip is (the base64's match) and the zip, open; None when none can be read."""
    found = ZIP_DATA.search(script)
    if found is None:
        return None
    try:
        return found, zipfile.ZipFile(io.BytesIO(base64.b64decode(found.group(1), validate=True)))
    except UNREADABLE:
        return None


def runner_entries(action: t.Any, task_vars: dict, runner: str) -> dict[str, list[int]]:
    """The zip entries of module `runner`: kept for this run, else read from its script built now ({}: unknown)."""
    text = _hostcode.load(ENTRIES, DIRECTORY)
    if text:
        try:
            kept = json.loads(text)
        except ValueError:
            kept = None
        if isinstance(kept, dict):
            return kept
    bits, _path = action._configure_module(runner, {}, task_vars)
    found = entries(bits.b_module_data) if bits.module_style == "new" else {}
    if found:
        _hostcode.store(ENTRIES, json.dumps(found), DIRECTORY)
    return found
