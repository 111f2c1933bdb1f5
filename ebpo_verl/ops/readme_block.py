"""Generated blocks of a Markdown page: the text between a begin and an end marker line, replaced whole."""

from __future__ import annotations

import re


def replace_marked_block(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with the part between the lines ``begin`` and ``end`` replaced by ``block`` (which ends with a
    newline). Raises ValueError unless exactly one such pair is there, each marker on its own line."""
    pattern = re.compile(r"^" + re.escape(begin) + r"\n.*?^" + re.escape(end) + r"$", re.S | re.M)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"needs exactly one {begin} ... {end} pair (each on its own line)")
    return pattern.sub(lambda _: f"{begin}\n{block}{end}", text)
