"""How an options section (``algorithm.ebpo``, ``algorithm.spo``, ``data.curriculum``) becomes a frozen dataclass.

Every options class of the package is parsed by :func:`parse_section`: one check that the section is a mapping,
one unknown-key message (:func:`unknown_option_message`, with the closest valid key) and the dataclass's own
``__post_init__`` for the values, whose defaults are the one source of defaults. :data:`PARSES` counts the
sections parsed in this process (how often the boundary in :mod:`ebpo_verl.trainer.run_options` is crossed; see
``tests/test_options.py``). Also the two value predicates the options and the data checks share.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

import numpy as np
import pandas as pd

T = TypeVar("T")

PARSES: Counter[str] = Counter()
"""Section name -> how many times :func:`parse_section` parsed it in this process."""


def unknown_option_message(key: str, section: str, valid: Sequence[str]) -> str:
    """The one error for an option key that does not exist, with the closest valid key."""
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"did you mean {section}.{close[0]}? " if close else ""
    return f"unknown option {section}.{key}; {hint}valid keys: {', '.join(valid)}"


def option_keys(cls: type) -> tuple[str, ...]:
    """The option names of an options dataclass, in declaration order."""
    return tuple(f.name for f in fields(cls))


def parse_section(cls: type[T], mapping: Any, section: str) -> T:
    """``cls(**mapping)`` for the section ``section`` (a dict or OmegaConf node; None -> the defaults).

    A value that is not a mapping (``algorithm.ebpo=5``) and an unknown key raise ValueError naming the key; the
    values are checked by ``cls`` itself.
    """
    valid = option_keys(cls)
    if mapping is None:
        values: dict[str, Any] = {}
    elif isinstance(mapping, Mapping):
        values = dict(mapping.items())
    else:
        raise ValueError(
            f"{section}={mapping!r} is not a mapping of options: set each option on its own, "
            f"{section}.<option>=<value>, with <option> one of {', '.join(valid)}"
        )
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(unknown_option_message(unknown[0], section, valid))
    PARSES[section] += 1
    return cls(**values)


def is_real(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_missing(value: Any) -> bool:
    """A per-row label that counts as absent: None, NaN (float or numpy), pandas' NA/NaT."""
    return value is None or (np.ndim(value) == 0 and bool(pd.isna(value)))
