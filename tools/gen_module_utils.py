"""Generate plugins/module_utils/hostlock/ from lib/hostlock/ (``make module-utils``).

Why a copy: AnsiballZ ships a module's ``module_utils`` imports to the managed host, not pip packages,
so the Ansible modules can use the one lock engine only through this copy. lib/hostlock is the only
place the code is edited; every copied file says so in its first line. ``--check`` (the drift test in
tests/unit/test_module_utils_copy.py) exits 1 listing the files that differ, are missing, or are left over.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path("lib/hostlock")
DEST = Path("plugins/module_utils/hostlock")
SPDX = "# SPDX-License-Identifier: GPL-3.0-or-later"
MARKER = "# GENERATED from lib/hostlock/"


def header(rel: str) -> str:
    return f"{MARKER}{rel} by `make module-utils`: do not edit; edit lib/hostlock instead.\n"


def render(rel: str, text: str) -> str:
    """The generated file for lib/hostlock/<rel>: header, SPDX line unless the source has one, source."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].startswith("#!"):
        # module_utils are imported, never executed: ansible-test's shebang check rejects a shebang there.
        lines = lines[1:]
    out = header(rel)
    if "SPDX-License-Identifier:" not in "".join(lines[:10]):
        out += SPDX + "\n"
    return out + "".join(lines)


def expected_files(root: Path) -> dict[str, str]:
    """Map relative path -> generated content for every .py file under lib/hostlock."""
    src = root / SOURCE
    if not src.is_dir():
        sys.exit(f"gen_module_utils: {src} does not exist: run from a hostlock checkout")
    files = {}
    for path in sorted(src.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(src).as_posix()
        files[rel] = render(rel, path.read_text(encoding="utf-8"))
    return files


def existing_files(root: Path) -> dict[str, str]:
    dest = root / DEST
    if not dest.is_dir():
        return {}
    return {
        p.relative_to(dest).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(dest.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def drift(root: Path) -> tuple[dict[str, str], list[str], list[str], list[str]]:
    """(expected, changed-or-missing, left over and generated, left over and hand-written)."""
    want = expected_files(root)
    have = existing_files(root)
    stale = [rel for rel, text in want.items() if have.get(rel) != text]
    extra = [rel for rel in have if rel not in want]
    generated_extra = [rel for rel in extra if have[rel].startswith(MARKER)]
    foreign_extra = [rel for rel in extra if not have[rel].startswith(MARKER)]
    return want, stale, generated_extra, foreign_extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 listing drifted files")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    want, stale, generated_extra, foreign_extra = drift(root)
    dest = root / DEST

    if args.check:
        problems = [
            f"  {DEST / rel}: differs from {SOURCE / rel}"
            if (dest / rel).exists()
            else f"  {DEST / rel}: missing (new {SOURCE / rel})"
            for rel in stale
        ]
        problems += [f"  {DEST / rel}: left over ({SOURCE / rel} was removed)" for rel in generated_extra]
        problems += [
            f"  {DEST / rel}: hand-written file in a generated directory: move it to {SOURCE}" for rel in foreign_extra
        ]
        if problems:
            print(f"{DEST} has drifted from {SOURCE}; run `make module-utils` and commit the result:")
            print("\n".join(problems))
            return 1
        print(f"{DEST} matches {SOURCE} ({len(want)} files)")
        return 0

    if foreign_extra:
        print(
            "gen_module_utils: refusing to touch hand-written files in the generated directory; move them to "
            f"{SOURCE}: " + ", ".join(str(DEST / rel) for rel in foreign_extra),
            file=sys.stderr,
        )
        return 1
    for rel in stale:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(want[rel], encoding="utf-8")
        os.chmod(tmp, 0o644)
        tmp.replace(target)
        print(f"wrote {DEST / rel}")
    for rel in generated_extra:
        (dest / rel).unlink()
        print(f"removed {DEST / rel}")
    # Remove directories left empty by removed subpackages.
    for d in sorted((p for p in dest.rglob("*") if p.is_dir()), reverse=True):
        if d.name != "__pycache__" and not any(d.iterdir()):
            d.rmdir()
    if not stale and not generated_extra:
        print(f"{DEST} already matches {SOURCE} ({len(want)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
