"""Every command a recipe plans, read from ``--list`` output (its ``command`` column) or a dry run's log (the
``would prepare data`` / ``would evaluate`` / ``would tabulate`` lines), names things that exist in this
interpreter's install: its program is an executable file and each ``-m`` module is importable. No command names
the checkout. Usage: ``python check_planned.py CHECKOUT FILE...``; exit 1 with one line per problem."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys

MARKERS = re.compile(r"(?:would prepare data|would evaluate|would tabulate): (.*)$")


def commands(text: str) -> list[str]:
    out = []
    lines = text.splitlines()
    if lines and lines[0].split("\t")[-1] == "command":  # a --list table
        return [line.split("\t")[-1] for line in lines[1:] if line.strip()]
    for line in lines:
        match = MARKERS.search(line)
        if match:
            out.append(match[1])
    return out


def problems(command: str, checkout: str) -> list[str]:
    words = shlex.split(command)
    while words and (words[0] == "env" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0])):
        words.pop(0)
    found = []
    if not words or not (os.path.isfile(words[0]) and os.access(words[0], os.X_OK)):
        found.append(f"no executable {words[0] if words else '(none)'}")
    if len(words) > 2 and words[1] == "-m" and importlib.util.find_spec(words[2]) is None:
        found.append(f"no module {words[2]}")
    if checkout in command:
        found.append(f"names the checkout {checkout}")
    return [f"{p}: {command}" for p in found]


def main(argv: list[str]) -> int:
    checkout, files = os.path.realpath(argv[0]), argv[1:]
    seen, bad = 0, []
    for path in files:
        with open(path, encoding="utf-8") as f:
            planned = commands(f.read())
        if not planned:
            bad.append(f"{path}: no planned command found")
        seen += len(planned)
        bad += [f"{path}: {p}" for c in planned for p in problems(c, checkout)]
    print("\n".join(bad) or f"check_planned: {seen} planned commands in {len(files)} files, every one resolves")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
