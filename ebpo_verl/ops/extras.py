"""What an optional extra of the package adds, refused with one line naming the extra when it is missing."""

from __future__ import annotations

import importlib.util


class MissingExtraError(ValueError):
    """A feature's packages are not installed; the message names the extra that brings them."""


def require(extra: str, feature: str, *modules: str) -> None:
    """MissingExtraError unless every top-level module in ``modules`` can be imported (found, not imported)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtraError(
            f"{feature} needs the '{extra}' extra ({', '.join(missing)} not installed): "
            f"pip install 'ebpo-verl[{extra}]'"
        )
