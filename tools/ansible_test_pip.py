"""Write the pip bootstrap stand-in that ``ansible-test --venv`` looks for.

Why: ansible-test bootstraps pip in each venv it creates with a ``get-pip`` script downloaded from
a CI host this machine cannot reach, but it first looks in ``~/.ansible/test/cache/get_pip_<ver>.py``.
The stand-in does what that script does with the network we have: ``ensurepip``, then
``pip install`` of the pinned pip (``--no-setuptools``/``--no-wheel`` are get-pip-only flags).
"""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

STANDIN = '''\
"""Stand-in for get-pip.py written by hostlock's tools/ansible_test_pip.py (make sanity/units)."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"],
                      stdout=subprocess.DEVNULL)
subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet"] + args)
'''


def pip_versions() -> set[str]:
    """The pip versions ansible-test pins, read from the installed ansible-test itself."""
    try:
        from ansible_test._internal.python_requirements import get_venv_packages

        versions = set()
        for minor in range(6, 15):
            packages = get_venv_packages(types.SimpleNamespace(version=f"3.{minor}"))
            versions.add(packages["pip"])
        return versions
    except Exception:  # noqa: BLE001 - fall back to reading the source if the internals moved
        import ansible_test

        src = Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
        found = set(re.findall(r"pip='([0-9.]+)'", src.read_text()))
        if not found:
            sys.exit(f"ansible_test_pip: cannot find the pip version ansible-test pins in {src}")
        return found


def main() -> int:
    cache = Path(os.path.expanduser("~/.ansible/test/cache"))
    cache.mkdir(parents=True, exist_ok=True)
    for version in sorted(pip_versions()):
        path = cache / f"get_pip_{version.replace('.', '_')}.py"
        if path.exists() and path.read_text() == STANDIN:
            continue
        if path.exists() and "hostlock" not in path.read_text():
            continue  # a real get-pip script someone cached: keep it
        tmp = path.with_suffix(".tmp")
        tmp.write_text(STANDIN)
        tmp.replace(path)
        print(f"ansible_test_pip: wrote pip {version} bootstrap stand-in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
