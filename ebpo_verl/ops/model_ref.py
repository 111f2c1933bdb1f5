"""What may name a model: a local folder or a Hugging Face hub id (``org/name``), checked before anything runs."""

from __future__ import annotations

import os
import re

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A hub repository id: ``org/name``, no leading ``/``, ``.`` or ``~`` (those are local paths)."""


def model_reference_problem(value: str) -> str | None:
    """Why ``value`` cannot name a model (None: a local folder, a hub id, or a remote URL this machine cannot
    check). A local path that does not exist, or exists and is not a folder, has a problem."""
    path = os.path.expanduser(value)
    if "://" in value or os.path.isdir(path):
        return None
    if os.path.exists(path):
        return f"{value} is a file, not a model folder"
    if HUB_ID.fullmatch(value):
        return None
    return f"{value}: no such folder, and not a hub id of the form org/name"
