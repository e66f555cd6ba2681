# GENERATED from lib/hostlock/__main__.py by `make module-utils`: do not edit; edit lib/hostlock instead.
# SPDX-License-Identifier: GPL-3.0-or-later
"""`python -m hostlock ...` runs the command line."""

from .cli import main

if __name__ == "__main__":  # not when merely imported (e.g. by ansible-test's import sanity test)
    raise SystemExit(main())
