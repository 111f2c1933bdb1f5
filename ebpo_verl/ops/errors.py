"""The one error of a refused configuration or data file, and the one way to put any error on one line."""

from __future__ import annotations

import reprlib

MESSAGE_LIMIT = 300
"""The most characters a reader's refusal holds, whatever the input (its fixed text plus values quoted by
:func:`shorten`; :class:`OneLineMessage` cuts at it)."""
LINE_LIMIT = 1000
"""The most characters any one-line message holds (:func:`one_line`'s cut): a pre-flight refusal whose fix takes
a few sentences stays whole, and no input makes one longer."""

_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = _QUOTE.maxlong = 40
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 4
_QUOTE.maxlevel = 2


class EBPOConfigError(ValueError):
    """A configuration or data problem found before the first rollout (its message names the key and the fix)."""


QUOTE_LIMIT = 60
"""The most characters :func:`shorten` gives, whatever the value."""


def shorten(value: object) -> str:
    """``repr(value)`` with long strings, integers and containers cut (``...``), at most :data:`QUOTE_LIMIT`
    characters, for quoting a value read from a file or a command line inside a one-line refusal."""
    try:
        text = _QUOTE.repr(value)
    except Exception:  # a value whose repr raises (a deep or broken object): its type is still worth naming
        text = f"<{type(value).__name__}>"
    return text if len(text) <= QUOTE_LIMIT else text[: QUOTE_LIMIT - 3] + "..."


def one_line(err: BaseException, limit: int = LINE_LIMIT) -> str:
    """``str(err)`` with its lines stripped and joined by spaces (the exception's type name when it is empty), cut to
    ``limit`` characters."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OneLineMessage(Exception):
    """A mixin for a refusal's exception (``class E(OneLineMessage, ValueError)``): its message is :func:`one_line`
    of the text it is given, one line of at most :data:`MESSAGE_LIMIT` characters whatever a caller quotes."""

    def __init__(self, message: object = "") -> None:
        super().__init__(one_line(Exception(str(message)), MESSAGE_LIMIT))
