"""`python -m hostlock ...` runs the command line."""

from .cli import main

if __name__ == "__main__":  # not when merely imported (e.g. by ansible-test's import sanity test)
    raise SystemExit(main())
