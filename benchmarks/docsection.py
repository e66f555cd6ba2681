"""Each benchmark's table in docs/benchmarks.md: its own `## Heading` section replaced, the others left alone.

One function for every benchmark script (`--docs FILE`). A section runs from its heading line to the next `## `
heading; a new one goes just above `## History`, where the dated notes begin, so the current tables stay together.
"""

from __future__ import annotations

from pathlib import Path

HISTORY = "## History"
EMPTY = "# Benchmarks\n\nEach table says the command that printed it.\n"


def write_section(path: Path, section: str, keep_from: str | None = None) -> None:
    """Put `section` (its first line the `## Heading`) in place of that heading's section of `path`.

    With `keep_from`, the old section's lines from the one equal to it onward (hand-written notes under the
    generated table) are kept after the new text.
    """
    heading = section.split("\n", 1)[0].strip()
    section = section.rstrip("\n") + "\n"
    text = path.read_text() if path.exists() else EMPTY
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.strip() == heading), None)
    if start is None:
        history = next((i for i, line in enumerate(lines) if line.strip() == HISTORY), None)
        if history is None:
            text = text.rstrip("\n") + "\n\n" + section
        else:
            text = "".join(lines[:history]) + section + "\n" + "".join(lines[history:])
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        mark = None if keep_from is None else next(
            (i for i in range(start + 1, end) if lines[i].strip() == keep_from), None)
        notes = "" if mark is None else "\n" + "".join(lines[mark:end]).rstrip("\n") + "\n"
        text = "".join(lines[:start]) + section + notes + ("\n" if end < len(lines) else "") + "".join(lines[end:])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
