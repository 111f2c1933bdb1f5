"""The one codec of the estimators' saved states: each state class declares its fields and their domains as a
:class:`Record` (its ``FIELDS``), and :func:`decode` checks a saved state's types and domains on load, refusing in
one line that names the field, the value (shortened) and the rule. Math-free: no numpy, torch or verl.

Domains follow the meaning of a field: an integer count within the exactly representable range (:data:`COUNT`), a
rate in [0, 1] (:data:`RATE`), a weighted count or pseudo-count in [0, 2**53] (:data:`WEIGHT`), a mean within
+-1e100 (:data:`MEAN`), a sum of squared deviations in [0, 1e300] (:data:`SQUARES`). With rewards within
``grouping.REWARD_LIMIT`` no step leaves them, except a count run for 2**53 steps: :func:`saturated` keeps it at
the edge (docs/estimator.md#saved-state).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ebpo_verl.ops.errors import shorten
from ebpo_verl.options.parsing import Rule, is_int, is_real

MAX_COUNT = 2**53
"""The largest count a float64 holds exactly, with every integer below it."""
MAX_MEAN = 1e100
"""The bound of a saved mean: means of rewards within ``REWARD_LIMIT`` (1e30), or of their variances (4e60)."""
MAX_SQUARES = 1e300
"""The bound of a saved sum of squared deviations: 2**53 of them, each at most (8e60)**2, stay far below it."""


@dataclass(frozen=True)
class Domain:
    """Finite numbers in [low, high] (integers only, with ``integer``; None too, with ``null``), named in refusals
    as ``text``; the edges a test sets a field to are ``low`` and ``high``."""

    low: float
    high: float
    text: str
    integer: bool = False
    null: bool = False

    def test(self, x: Any) -> bool:
        if x is None:
            return self.null
        return (is_int(x) if self.integer else is_real(x)) and self.low <= x <= self.high


COUNT = Domain(0, MAX_COUNT, "an integer in [0, 2**53]", integer=True)
RATE = Domain(0.0, 1.0, "a rate in [0, 1]")
WEIGHT = Domain(0.0, MAX_COUNT, "a number in [0, 2**53]")
MEAN = Domain(-MAX_MEAN, MAX_MEAN, "a number in [-1e100, 1e100]")
SQUARES = Domain(0.0, MAX_SQUARES, "a number in [0, 1e300]")
NAME = Rule(lambda x: isinstance(x, str), "a string")
KEY = Rule(lambda x: isinstance(x, str) and "\0" not in x, "a string without NUL (numpy's strings drop them)")


def nullable(domain: Domain) -> Domain:
    """``domain`` or null."""
    return dataclasses.replace(domain, null=True, text=f"null or {domain.text}")


def saturated(count: int, more: int = 1) -> int:
    """``count + more`` kept within [0, :data:`MAX_COUNT`] (a count at the edge of its domain stays there)."""
    return min(count + more, MAX_COUNT)


@dataclass(frozen=True)
class Seq:
    """A JSON list whose items obey ``item``, at most ``longest`` long (an int, or the option bounding it, read
    from the options the state was written under); ``increasing``: strictly (sorted and unique)."""

    item: Any
    longest: int | str | None = None
    shortest: int = 0
    increasing: bool = False


@dataclass(frozen=True)
class Fixed:
    """A JSON list of exactly one item per rule, each named (``[n, mean, m2]``)."""

    names: tuple[str, ...]
    rules: tuple[Domain, ...]


@dataclass(frozen=True)
class Table:
    """A JSON object mapping strings to values that obey ``item``."""

    item: Any


@dataclass(frozen=True)
class Record:
    """A JSON object holding exactly ``fields`` (those in ``optional`` may be absent); the list fields of
    ``same_length`` have one length."""

    fields: Mapping[str, Any]
    optional: tuple[str, ...] = ()
    same_length: tuple[str, ...] = ()
    version: int | None = field(default=None)


class StateError(ValueError):
    """A saved state outside its declared domain (one line: field, value, rule)."""


def refuse(where: str, value: Any, rule: str) -> StateError:
    """The one refusal: ``<where>=<value, shortened> is refused: it must be <rule>``."""
    return StateError(f"{where}{' ' if where.endswith(':') else '='}{shorten(value)} is refused: it must be {rule}")


def decode(spec: Any, value: Any, where: str, options: Mapping[str, Any] | None = None) -> Any:
    """``value`` (parsed JSON) checked against ``spec`` (a :class:`Rule`, :class:`Seq`, :class:`Fixed`,
    :class:`Table` or :class:`Record`) and returned as is; ``where`` names it in the refusal (StateError; a state's
    label ends in ``:``, ``EBPO state:``, its fields follow it after a space, nested ones after a dot);
    ``options``: the values of the options bounding a :class:`Seq` (None: those bounds are not checked)."""
    if isinstance(spec, Rule | Domain):
        if not spec.test(value):
            raise refuse(where, value, spec.text)
    elif isinstance(spec, Seq):
        _decode_seq(spec, value, where, options)
    elif isinstance(spec, Fixed):
        if not isinstance(value, list) or len(value) != len(spec.rules):
            raise refuse(where, value, f"a list [{', '.join(spec.names)}]")
        for name, rule, item in zip(spec.names, spec.rules, value, strict=True):
            decode(rule, item, f"{where}.{name}", options)
    elif isinstance(spec, Table):
        if not isinstance(value, Mapping):
            raise refuse(where, value, "an object (name -> value)")
        for key, item in value.items():
            decode(NAME, key, f"{where} key", options)
            decode(spec.item, item, f"{where}[{shorten(key)}]", options)
    else:
        _decode_record(spec, value, where, options)
    return value


def _decode_seq(spec: Seq, value: Any, where: str, options: Mapping[str, Any] | None) -> None:
    longest = spec.longest
    if isinstance(longest, str):  # an option's value; unknown without the options
        longest = options.get(longest) if options else None
    if not isinstance(value, list):
        raise refuse(where, value, "a list")
    if not spec.shortest <= len(value) <= (len(value) if longest is None else longest):
        bound = spec.longest if isinstance(spec.longest, int) else f"{spec.longest}={longest}"
        raise StateError(f"{where} has {len(value)} items: it must have {spec.shortest} to {bound}")
    for i, item in enumerate(value):
        decode(spec.item, item, f"{where}[{i}]", options)
    if spec.increasing and any(b <= a for a, b in zip(value[:-1], value[1:], strict=True)):
        raise refuse(where, value, "sorted and unique")


def _decode_record(spec: Record, value: Any, where: str, options: Mapping[str, Any] | None) -> None:
    if not isinstance(value, Mapping):
        raise refuse(where, value, "a JSON object")
    if spec.version is not None and value.get("version") != spec.version:
        raise refuse(f"{where} version", value.get("version"), f"{spec.version} (the version this code reads)")
    known = {*spec.fields, *(["version"] if spec.version is not None else [])}
    missing = sorted(set(spec.fields) - set(value) - set(spec.optional))
    unknown = sorted(map(str, set(value) - known))
    if missing or unknown:
        problems = [f"missing field(s) {missing}"] * bool(missing)
        problems += [f"unknown field(s) {shorten(unknown)}"] * bool(unknown)
        raise StateError(f"{where} {' and '.join(problems)}")
    for name, item in value.items():
        if name != "version":
            decode(spec.fields[name], item, f"{where}{' ' if where.endswith(':') else '.'}{name}", options)
    lengths = {len(value[name]) for name in spec.same_length if name in value}
    if len(lengths) > 1:
        raise StateError(f"{where} fields {', '.join(spec.same_length)} must have one length, got {sorted(lengths)}")
