"""How an option is declared, checked and parsed: the one schema of every options section of the package.

A section is a frozen :class:`OptionSection` dataclass, each field declared once with :func:`option` (as TRL's
``GRPOConfig``). From it come the checks (``__post_init__``), config parsing (:meth:`OptionSection.from_mapping`,
naming the closest unknown key), the Hydra config, ``ebpo-train --help`` and the README's options table. Also the
value predicates the options and data checks share. Imports nothing of ebpo_verl (the bottom layer).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

import numpy as np
import pandas as pd

T = TypeVar("T", bound="OptionSection")


def is_finite_number(x: Any) -> bool:
    """A finite real number, numpy's too (not a bool; an int too large for a float is not finite)."""
    if isinstance(x, bool | np.bool_) or not isinstance(x, numbers.Real):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def is_real(x: Any) -> bool:
    """A finite Python int or float (not a bool, not numpy's: what a parsed config holds)."""
    return isinstance(x, int | float) and is_finite_number(x)


def is_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def is_missing(value: Any) -> bool:
    """A per-row label that counts as absent: None, NaN (float or numpy), pandas' NA/NaT."""
    return value is None or (np.ndim(value) == 0 and bool(pd.isna(value)))


@dataclass(frozen=True)
class Rule:
    """A kind of value an option accepts besides its listed choices: a predicate and how it reads in messages."""

    test: Callable[[Any], bool]
    text: str
    edges: tuple[Any, ...] = ()
    """The extreme values it accepts (each option is tested at each edge of its rule)."""


def _bound(x: float) -> str:
    return "2**53" if x == 2**53 else f"{x:g}"


def reals(low: float | None = None, high: float | None = None, *, open_low=False, open_high=False) -> Rule:
    """Finite numbers in an interval (None: unbounded on that side, up to the largest finite float)."""

    def test(x: Any) -> bool:
        if not is_real(x):
            return False
        above = low is None or (x > low if open_low else x >= low)
        return above and (high is None or (x < high if open_high else x <= high))

    if low is not None and high is not None:
        text = f"a float in {'(' if open_low else '['}{_bound(low)}, {_bound(high)}{')' if open_high else ']'}"
    elif low is not None:
        text = f"a float {'>' if open_low else '>='} {low:g}"
    else:
        text = "a finite number"
    top = sys.float_info.max
    lo = -top if low is None else math.nextafter(low, top) if open_low else low
    hi = top if high is None else math.nextafter(high, -top) if open_high else high
    return Rule(test, text, (lo, hi))


def ints(low: int, high: int | None = None) -> Rule:
    """Integers >= ``low`` (and <= ``high``)."""
    if high is not None:
        return Rule(lambda x: is_int(x) and low <= x <= high, f"an integer in [{low}, {_bound(high)}]", (low, high))
    return Rule(lambda x: is_int(x) and x >= low, "a positive integer" if low == 1 else f"an integer >= {low}", (low,))


def text(what: str) -> Rule:
    """A non-empty string (``what`` names it in messages)."""
    return Rule(lambda x: isinstance(x, str) and bool(x), what)


PATH = text("a path")
"""The rule of an option that names a file or folder (a non-empty string)."""


def option(
    default: Any,
    help: str,
    *,
    choices: Sequence[Any] = (),
    rule: Rule | None = None,
    metavar: str | None = None,
    flag: str | None = None,
    many: bool | None = None,
) -> Any:
    """The declaration of one option: its default (``MISSING``: required, keyword-only), its help, the values it
    accepts (``choices`` and/or ``rule``; for a tuple, each item: ``many``, default whether the default is a
    tuple), and on a command line its ``metavar`` and ``flag`` (default ``--<name with dashes>``; a word without
    dashes: a positional argument)."""
    metadata = {"help": " ".join(help.split()), "choices": tuple(choices), "rule": rule, "metavar": metavar}
    metadata |= {"flag": flag, "many": isinstance(default, tuple) if many is None else many}
    if default is MISSING:
        return field(kw_only=True, metadata=metadata)
    return field(default=default, metadata=metadata)


def one_of(**meanings: str) -> Any:
    """The declaration of an option that takes one of the words of ``meanings`` (in order; the first is the
    default), its help ``word (meaning) | ...`` (a word whose meaning is empty stands alone)."""
    help = " | ".join(f"{word} ({meaning})" if meaning else word for word, meaning in meanings.items())
    return option(next(iter(meanings)), help, choices=tuple(meanings))


def nullable(help: str, rule: Rule) -> Any:
    """The declaration of an option whose default is null (``help`` says what null means) and that otherwise takes
    what ``rule`` accepts."""
    return option(None, help, choices=(None,), rule=rule)


def resume_option(help: str) -> Any:
    """The declaration of a stateful estimator's ``on_resume_mismatch`` (``error``, ``reset`` or ``keep``)."""
    return option("error", help, choices=("error", "reset", "keep"))


def word(value: Any) -> str:
    """A value as the user writes it on the command line (``null``, ``true``)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def shown(value: Any) -> str:
    """A default as the user writes it: :func:`word`, a list as its words separated by spaces (``none``: empty)."""
    if isinstance(value, tuple):
        return " ".join(word(v) for v in value) or "none"
    return word(value)


def _either(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def allowed(f: Field) -> str:
    """What option ``f`` accepts, in words (``gaussian or beta_binomial``, ``auto or a float in [0, 1]``)."""
    rule = f.metadata["rule"]
    return _either([*(word(c) for c in f.metadata["choices"]), *([rule.text] if rule else [])])


def accepts(f: Field, value: Any) -> bool:
    """Whether option ``f`` accepts ``value`` (a listed choice of the same type, or what its rule accepts; for an
    option whose default is a tuple, a non-empty tuple of such values)."""
    if f.metadata.get("many", isinstance(f.default, tuple)) and isinstance(value, tuple):
        return bool(value) and all(accepts(_item(f), v) for v in value)
    if any(value == c and type(value) is type(c) for c in f.metadata["choices"]):
        return True
    rule = f.metadata["rule"]
    return rule is not None and rule.test(value)


def env_value(f: Field, variable: str, raw: str) -> Any:
    """The value of option ``f`` that ``variable=raw`` sets: the first of ``null``, an integer, a number and the text
    itself that the option's rules accept; ValueError in one line naming the variable and what it accepts."""
    word = raw.strip()
    readings: list[Any] = [None] if word.lower() in ("null", "none") else []
    for cast in (int, float):
        with suppress(ValueError):
            readings.append(cast(word))
    for value in (*readings, word):
        if accepts(f, value):
            return value
    raise ValueError(f"{variable}={raw!r} is invalid; use {allowed(f)}")


def _item(f: Field) -> Field:
    """The declaration one item of a tuple option is checked by."""
    return field(default=None, metadata={**f.metadata, "many": False})


def unknown_option_message(key: str, section: str, valid: Sequence[str], *, list_valid: bool = True) -> str:
    """The one error for a key that does not exist, with the closest valid key (and the valid keys if asked)."""
    where = f"{section}." if section else ""
    key = key if key.isidentifier() else repr(key)  # a key with a newline or a space stays one line, visibly
    close = difflib.get_close_matches(key, valid, n=1)
    parts = [f"did you mean {where}{close[0]}?"] if close else []
    parts += [f"valid keys: {', '.join(valid)}"] if list_valid else []
    return f"unknown option {where}{key}" + (f"; {' '.join(parts)}" if parts else "")


class OptionSection:
    """Base of every options dataclass: its fields are the section's options (declared with :func:`option`).

    Subclasses set :attr:`SECTION` (the config path, for messages) and are ``@dataclass(frozen=True)``; a
    subclass's own ``__post_init__`` (checks between options) calls this one first.
    """

    SECTION: ClassVar[str]
    ENV: ClassVar[dict[str, str]] = {}
    """Option -> the environment variable that replaces it when set to a non-empty value."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not accepts(f, value):
                raise ValueError(f"{self.SECTION}.{f.name}={value!r} is invalid; use {allowed(f)}")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def declarations(cls) -> tuple[Field, ...]:
        """The options' declarations (default, ``help``, ``choices``, ``rule`` in their metadata), in order."""
        return fields(cls)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    @classmethod
    def from_mapping(cls: type[T], mapping: Any) -> T:
        """The options of a config node (a dict or OmegaConf node; None -> the defaults).

        A value that is not a mapping (``algorithm.ebpo=5``) and an unknown key raise ValueError naming the key;
        the values are checked by the class itself.
        """
        valid = cls.keys()
        if mapping is None:
            values: dict[str, Any] = {}
        elif isinstance(mapping, Mapping):
            values = dict(mapping.items())
        else:
            raise ValueError(
                f"{cls.SECTION}={mapping!r} is not a mapping of options: set each option on its own, "
                f"{cls.SECTION}.<option>=<value>, with <option> one of {', '.join(valid)}"
            )
        unknown = sorted(set(values) - set(valid))
        if unknown:
            raise ValueError(unknown_option_message(unknown[0], cls.SECTION, valid))
        return cls(**values)

    @classmethod
    def env_values(cls, env: Mapping[str, str], variables: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Option -> value for each variable of ``variables`` (option -> variable; default :attr:`ENV`) set, not
        empty, in ``env`` (checked: :func:`env_value`)."""
        declared = {f.name: f for f in fields(cls)}
        return {
            key: env_value(declared[key], variable, env[variable])
            for key, variable in (cls.ENV if variables is None else variables).items()
            if env.get(variable, "").strip()
        }

    @classmethod
    def from_variables(cls: type[T], env: Mapping[str, str]) -> T:
        """Switches: options named as environment variables, each set one read by :meth:`env_values`, the others
        their declared defaults (an unset and an empty variable are the same)."""
        return cls(**cls.env_values(env, {name: name for name in cls.keys()}))

    def with_env(self: T, env: Mapping[str, str]) -> T:
        """These options with each variable of :attr:`ENV` set in ``env`` replacing its option."""
        replaced = self.env_values(env)
        return dataclasses.replace(self, **replaced) if replaced else self
