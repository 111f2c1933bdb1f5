"""Generated blocks of a Markdown page: the text between ``<!-- generated:NAME:begin -->`` and
``<!-- generated:NAME:end -->`` lines, replaced whole (the one marker style; ``python -m ebpo_verl.docs_tables``
writes every block)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ebpo_verl.ops.atomic import atomic_write_text


def markers(name: str) -> tuple[str, str]:
    """The begin and end marker lines of block ``name``."""
    return f"<!-- generated:{name}:begin -->", f"<!-- generated:{name}:end -->"


def replace_marked_block(text: str, name: str, block: str) -> str:
    """``text`` with block ``name`` (between its :func:`markers`) replaced by ``block`` (which ends with a newline).
    Raises ValueError unless exactly one such pair is there, each marker on its own line."""
    begin, end = markers(name)
    pattern = re.compile(r"^" + re.escape(begin) + r"\n.*?^" + re.escape(end) + r"$", re.S | re.M)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"needs exactly one {begin} ... {end} pair (each on its own line)")
    return pattern.sub(lambda _: f"{begin}\n{block}{end}", text)


def check_or_write(page: Path, text: str, new: str, check: bool, command: str) -> int:
    """How a block-updating command ends, for ``page`` read as ``text`` and ``new`` its updated text: with ``check``,
    exit status 1 and a line naming ``command`` when they differ, else 0; without it, ``new`` written (atomically)
    when it differs, one line saying which, 0."""
    if check:
        if new != text:
            print(f"{page}: generated blocks out of date; run {command}", file=sys.stderr)
            return 1
        return 0
    if new != text:
        atomic_write_text(page, new)
    print(f"{page}: {'updated' if new != text else 'already up to date'}")
    return 0
