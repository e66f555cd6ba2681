"""Build hook for `pip install .`: the `hostlock` launcher gets its `#!/bin/sh` line when it is built.

Why here: scripts/hostlock is a sh and Python polyglot (it says why), and ansible-test sanity forbids
shebangs and executable files in the collection, so the source carries neither.
"""

from __future__ import annotations

import os

from setuptools import Distribution, setup

# setuptools' own build_scripts command (distutils'), asked for by name: it has no public module path.
_BuildScriptsBase = Distribution().get_command_class("build_scripts")


class BuildScripts(_BuildScriptsBase):
    """Copy the scripts, then make each one start with /bin/sh and be executable."""

    def run(self) -> None:
        super().run()
        for name in os.listdir(self.build_dir):
            path = os.path.join(self.build_dir, name)
            with open(path, encoding="utf-8") as f:
                body = f.read()
            if not body.startswith("#!"):
                with open(path, "w", encoding="utf-8") as f:
                    f.write("#!/bin/sh\n" + body)
            os.chmod(path, 0o755)


setup(cmdclass={"build_scripts": BuildScripts})
