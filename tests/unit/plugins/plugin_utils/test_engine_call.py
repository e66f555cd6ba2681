"""plugin_utils/_engine_call.py: one engine function on a host in one short interpreter run.

What it ships is the engine's own files (no second copy of the lease protocol), the smallest closure
the call needs; the token travels on standard input only; each supported Python runs it against a real
lease holder (a real `python -I -S` process, as the action runs it on a host).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ansible_collections.hostlock.core.plugins.module_utils import hostlock
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import lease as _lease
from ansible_collections.hostlock.core.plugins.plugin_utils import _engine_call
from ansible_collections.hostlock.core.plugins.plugin_utils._hostlease import _interpreter

ENGINE = Path(__file__).resolve().parents[4] / "plugins" / "module_utils" / "hostlock"
PYENV = Path("/root/.pyenv/versions")


def pythons() -> list:
    found = [sys.executable]
    for minor in ("3.8", "3.13"):
        found += [str(p / "bin" / "python3") for p in sorted(PYENV.glob(f"{minor}.*"))
                  if (p / "bin" / "python3").exists()][:1]
    return found


def run(python: str, args: str, data: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(f"{shlex.quote(python)} {args}", shell=True, input=data, capture_output=True, check=False)


def test_the_release_ships_the_engines_own_files_and_only_what_it_imports():
    modules = _engine_call.closure(_engine_call.RELEASE_ROOTS)
    assert sorted(modules) == [
        "hostlock", "hostlock.core", "hostlock.core.errors", "hostlock.core.names", "hostlock.core.text",
        "hostlock.core.tokens", "hostlock.host", "hostlock.host.channel", "hostlock.host.safepath",
    ]
    for name, (is_package, source) in modules.items():
        if is_package:
            assert source == "", name  # hostlock/__init__.py would import the whole engine
        else:
            assert source == (ENGINE / Path(*name.split(".")[1:])).with_suffix(".py").read_text(), name


def test_the_token_never_appears_on_the_command_line():
    token = "0123456789ab." + "f" * 32
    args, data = _engine_call.request(_engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, "x", token,
                                      directory="/d")
    assert token not in args and "ffff" not in args
    assert token.encode() in data


@pytest.mark.parametrize("python", pythons())
def test_a_real_lease_is_released_by_the_shipped_engine(python, tmp_path):
    lockdir = str(tmp_path / "locks")
    token = _lease.hold("quick", 60, directory=lockdir, in_flight=True)
    assert hostlock.status("quick", directory=lockdir).state == "held"
    args, data = _engine_call.request(_engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, "quick", token,
                                      directory=lockdir)
    done = run(python, args, data)
    assert _engine_call.outcome(done.stdout.decode()) == (True, ""), done
    assert hostlock.status("quick", directory=lockdir).state == "free"
    # A second release: the engine's own error, as one line the caller can read
    again = run(python, args, data)
    ok, why = _engine_call.outcome(again.stdout.decode())
    assert not ok and why.startswith("TokenError gone no lease"), again


def test_a_wrong_token_is_refused_by_the_holder_and_the_lease_lives_on(tmp_path):
    lockdir = str(tmp_path / "locks")
    token = _lease.hold("quick", 60, directory=lockdir)
    wrong = token.split(".")[0] + "." + "0" * 32
    args, data = _engine_call.request(_engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, "quick", wrong,
                                      directory=lockdir)
    ok, why = _engine_call.outcome(run(sys.executable, args, data).stdout.decode())
    assert not ok and "wrong token" in why
    assert hostlock.status("quick", directory=lockdir).state == "held"
    _lease.release("quick", token, directory=lockdir)


def test_only_our_own_last_line_counts():
    assert _engine_call.outcome("motd\nhostlock-call: ok\n") == (True, "")
    assert _engine_call.outcome("hostlock-call: ok trailing\n")[0] is False
    assert _engine_call.outcome("ok\n") == (False, "no answer from the host's interpreter")


def test_tagged_strings_are_sent_as_plain_ones():
    class Tagged(str):
        pass

    args, data = _engine_call.request(_engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, Tagged("n"),
                                      Tagged("t"), directory=Tagged("/d"))
    assert args and data
    with pytest.raises(TypeError):
        _engine_call.request(_engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, object())


@pytest.mark.parametrize("shebang,expected", [
    ("#!/usr/bin/python3", "/usr/bin/python3"),
    ("#!/usr/bin/env python3", None),  # not a plain path: the module release is used
    ("#!python3", None),
    (None, None),
    ("", None),
])
def test_the_release_runs_only_a_plain_interpreter_path(shebang, expected):
    assert _interpreter(shebang) == expected


def test_the_remote_users_python_environment_changes_nothing(tmp_path):
    """-I: a PYTHONPATH in the environment the command runs with (a user's profile) is not searched."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "ran"
    for name in ("hmac", "hashlib", "_sha256", "_sha2", "_socket", "socket", "zlib", "marshal"):
        (planted / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    lockdir = str(tmp_path / "locks")
    token = _lease.hold("quick", 60, directory=lockdir)
    args, data = _engine_call.request(_engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, "quick", token,
                                      directory=lockdir)
    done = subprocess.run(f"{shlex.quote(sys.executable)} {args}", shell=True, input=data, capture_output=True,
                          check=False, env=dict(os.environ, PYTHONPATH=str(planted)))
    assert _engine_call.outcome(done.stdout.decode()) == (True, ""), done
    assert not marker.exists()


MU = "ansible_collections/hostlock/core/plugins/module_utils"
EXPORT = r"""
import sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hostlock.core.plugins.module_utils import _zipimport
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.host import channel
sys.stdout.buffer.write(_zipimport.exported())
"""


def compiled_by(python: str, tmp_path: Path, marker: Path | None = None) -> bytes:
    """What a locked module run of `python` hands back (module_utils/_zipimport.exported()), from an AnsiballZ
    layout zip of the real engine; with `marker`, its channel.release first creates that file (a change the
    shipped sources do not have: the proof that the code given is the code run)."""
    path = tmp_path / f"payload-{abs(hash(python))}-{bool(marker)}.zip"
    with zipfile.ZipFile(path, "w") as z:
        for package in ("ansible_collections", "ansible_collections/hostlock", "ansible_collections/hostlock/core",
                        "ansible_collections/hostlock/core/plugins", MU):
            z.writestr(f"{package}/__init__.py", "")
        z.writestr(f"{MU}/_zipimport.py", (ENGINE.parent / "_zipimport.py").read_text())
        for source in ENGINE.rglob("*.py"):
            text = source.read_text()
            if marker and source.name == "channel.py":
                text += (f"\n_release = release\n\ndef release(*a, **k):\n    open({str(marker)!r}, 'w').close()\n"
                         "    return _release(*a, **k)\n")
            z.writestr(f"{MU}/hostlock/{source.relative_to(ENGINE)}", text)
    return subprocess.run([python, "-I", "-c", EXPORT, str(path)], capture_output=True, check=True).stdout


@pytest.mark.parametrize("python", pythons())
def test_the_release_runs_the_code_the_hosts_interpreter_compiled(python, tmp_path):
    """Given what the same interpreter compiled in a locked module run, the release compiles nothing: the code
    it runs is that code (here marked by a changed channel.release)."""
    lockdir, marker = str(tmp_path / "locks"), tmp_path / "precompiled-release-ran"
    compiled = compiled_by(python, tmp_path, marker)
    token = _lease.hold("quick", 60, directory=lockdir, in_flight=True)
    args, data = _engine_call.request(_engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, "quick", token,
                                      directory=lockdir, compiled=compiled)
    done = run(python, args, data)
    assert _engine_call.outcome(done.stdout.decode()) == (True, ""), done
    assert marker.exists(), "the release compiled its sources instead of running the code it was given"
    assert hostlock.status("quick", directory=lockdir).state == "free"


def test_code_another_interpreter_compiled_is_ignored_and_the_release_still_works(tmp_path):
    found = [p for p in pythons() if p != sys.executable]
    if not found:
        pytest.skip("needs a second Python")
    lockdir, marker = str(tmp_path / "locks"), tmp_path / "precompiled-release-ran"
    compiled = compiled_by(found[0], tmp_path, marker)  # e.g. 3.8's code, given to this interpreter
    for given in (compiled, compiled[:-20], b"junk"):
        token = _lease.hold("quick", 60, directory=lockdir, in_flight=True)
        args, data = _engine_call.request(_engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, "quick", token,
                                          directory=lockdir, compiled=given)
        done = run(sys.executable, args, data)
        assert _engine_call.outcome(done.stdout.decode()) == (True, ""), done
        assert not marker.exists()
        assert hostlock.status("quick", directory=lockdir).state == "free"
