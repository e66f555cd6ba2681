"""core/oslite.py: `os` without importing `os`. Its calls are posix's (the very functions `os` re-exports), its
Python parts behave as `os`'s, and the environment is the one `os.environ` shows, whether `os` was imported
before, after or never; a popped variable is gone for `os.environ` and for children."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostlock.core import oslite

ROOT = Path(__file__).resolve().parents[3]
OSLITE = ROOT / "plugins" / "module_utils" / "hostlock" / "core" / "oslite.py"


def test_its_calls_are_the_ones_os_exports():
    names = [n for n in vars(oslite) if not n.startswith("__") and n not in ("annotations", "sys", "TYPE_CHECKING")]
    ours = {"fsencode", "fsdecode", "environ", "environb", "getenv", "popenv"}
    for name in names:
        if name in ours or name.startswith("_") and name != "_exit":
            continue
        assert getattr(oslite, name) is getattr(os, name) or getattr(oslite, name) == getattr(os, name), name
    assert oslite.devnull == os.devnull and oslite.defpath == os.defpath


@pytest.mark.parametrize("name", ["plain", "caf\u00e9", "bad-\udcff-byte", b"bytes\xff"])
def test_fsencode_and_fsdecode_are_os_s(name):
    assert oslite.fsencode(name) == os.fsencode(name)
    assert oslite.fsdecode(name) == os.fsdecode(name)
    assert oslite.fsdecode(oslite.fsencode(name)) == os.fsdecode(name)


def _fresh(code: str, env: dict[bytes, bytes]) -> subprocess.CompletedProcess:
    """Run `code` in a new interpreter that has oslite (read from its file, not through the package, whose
    host modules import os) and has not imported os."""
    prelude = (
        "import sys\n"
        "ns = {'__name__': 'oslite'}\n"
        "exec(compile(open(%r).read(), %r, 'exec'), ns)\n"
        "class M: pass\n"
        "o = M(); o.__dict__.update(ns)\n"
        "assert 'os' not in sys.modules, 'os imported already'\n" % (str(OSLITE), str(OSLITE)))
    return subprocess.run([sys.executable, "-I", "-S", "-c", prelude + code], env=env, capture_output=True,
                          check=False)


def test_without_os_the_environment_is_posix_s_and_a_pop_reaches_children_and_a_later_os():
    code = (
        "assert o.getenv('HL_A') == '1' and o.getenv('HL_NONE') is None\n"
        "assert o.getenv('HL_RAW') == 'x\\udcffy'\n"
        "assert o.environ()['HL_A'] == '1' and o.environb()[b'HL_RAW'] == b'x\\xffy'\n"
        "assert o.popenv('HL_SECRET') == 's3cret' and o.popenv('HL_SECRET') is None\n"
        "assert o.getenv('HL_SECRET') is None and 'os' not in sys.modules\n"
        "import posix\n"
        "r, w = posix.pipe()\n"
        "pid = posix.fork()\n"
        "if pid == 0:\n"
        "    posix.dup2(w, 1)\n"
        "    posix.execv('/usr/bin/env', ['env'])\n"
        "posix.close(w)\n"
        "out = b''\n"
        "while True:\n"
        "    chunk = posix.read(r, 65536)\n"
        "    if not chunk: break\n"
        "    out += chunk\n"
        "posix.waitpid(pid, 0)\n"
        "assert b'HL_SECRET' not in out and b'HL_A=1' in out, out\n"
        "import os\n"
        "assert 'HL_SECRET' not in os.environ and os.environ['HL_A'] == '1'\n"
        "print('ok')\n")
    r = _fresh(code, {b"HL_A": b"1", b"HL_RAW": b"x\xffy", b"HL_SECRET": b"s3cret", b"PATH": b"/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout == b"ok\n", r.stderr.decode()


def test_once_os_is_imported_its_environ_counts():
    code = (
        "import os\n"
        "os.environ['HL_NEW'] = 'n'\n"
        "del os.environ['HL_A']\n"
        "assert o.getenv('HL_NEW') == 'n' and o.getenv('HL_A') is None\n"
        "assert o.environb()[b'HL_NEW'] == b'n' and b'HL_A' not in o.environb()\n"
        "assert o.environ() == dict(os.environ)\n"
        "assert o.popenv('HL_SECRET') == 's3cret' and 'HL_SECRET' not in os.environ\n"
        "import posix\n"
        "assert b'HL_SECRET' not in posix.environ\n"
        "print('ok')\n")
    r = _fresh(code, {b"HL_A": b"1", b"HL_SECRET": b"s3cret"})
    assert r.returncode == 0 and r.stdout == b"ok\n", r.stderr.decode()
