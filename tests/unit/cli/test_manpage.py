"""The man page and the bash completion shipped in the package's data/: they list every command and every
flock(1) option `hostlock flock` accepts, render without warnings, and complete what they should."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hostlock.cli import _ADMIN
from hostlock.cli import flock as _cli_flock

DATA = Path(__file__).resolve().parents[3] / "plugins" / "module_utils" / "hostlock" / "data"
COMMANDS = ["run", "flock", "cron", *_ADMIN]


def test_man_page_lists_every_command_and_flock_option():
    text = (DATA / "hostlock.1").read_text().replace("\\-", "-")
    for command in COMMANDS:
        assert re.search(r"^\.B(R)? .*\b%s\b" % command, text, re.M), command
    for option in _cli_flock._SPEC:
        if option != "-?":
            assert option in text, option
    for option in ("--fleet", "--ttl", "HOSTLOCK_FENCE", "HOSTLOCK_FLEET"):
        assert option in text, option


def test_man_page_and_manual_list_every_exit_code():
    from hostlock.cli import common as c

    codes = {v for k, v in vars(c).items() if k.startswith("EX_") and isinstance(v, int)} - {0}
    man = (DATA / "hostlock.1").read_text().split(".SH EXIT STATUS", 1)[1].split(".SH", 1)[0]
    manual = (DATA.parents[3] / "docs" / "cli.md").read_text().split("## Exit status", 1)[1].split("\n## ", 1)[0]
    for code in codes:
        assert re.search(r"\b%d\b" % code, man), code
        assert "| %d |" % code in manual, code


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_man_page_renders_cleanly():
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(DATA / "hostlock.1")], capture_output=True,
                       text=True, check=False)
    assert (r.returncode, r.stderr) == (0, "")


def _complete(line: str) -> list[str]:
    words = line + ("''" if line.endswith(" ") else "")
    cword = len(line.split()) - (0 if line.endswith(" ") else 1)
    script = ("source %s\nCOMP_LINE=%r\nCOMP_WORDS=(%s)\nCOMP_CWORD=%d\n_hostlock\n"
              "printf '%%s\\n' \"${COMPREPLY[@]}\"\n" % (DATA / "hostlock.bash", line, words, cword))
    r = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, text=True, check=True,
                       env=dict(os.environ, HOSTLOCK_DIR="/nonexistent"))
    return r.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion():
    assert "flock" in _complete("hostlock fl")
    assert _complete("hostlock flock --fc") == ["--fcntl"]
    assert set(_complete("hostlock flock --n")) == {"--nb", "--nonblocking", "--no-fork"}
    assert _complete("hostlock status --pa") == ["--path"]
    assert set(_complete("hostlock run --mechanism ")) == {"auto", "ofd", "flock", "record"}
    assert _complete("hostlock run --tt") == ["--ttl"]
    for command in ("run", "cron", "status", "list", "hold", "renew", "release", "break"):
        fleet = ["--fleet", "--fleet-password-file"] if command in ("run", "cron") else ["--fleet"]
        assert sorted(_complete("hostlock %s --fle" % command)) == fleet, command
    assert _complete("hostlock gc --fle") == []
