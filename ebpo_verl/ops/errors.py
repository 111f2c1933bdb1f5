"""The one error of a refused configuration or data file, and the one way to put any error on one line."""

from __future__ import annotations


class EBPOConfigError(ValueError):
    """A configuration or data problem found before the first rollout (its message names the key and the fix)."""


def one_line(err: BaseException) -> str:
    """``str(err)`` with its lines stripped and joined by spaces (the exception's type name when it is empty)."""
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
