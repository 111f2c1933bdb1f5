"""What the fuzz properties share: mutations of a valid JSON document, the one-line check of a refusal, and running
a property against a mutant of its loader (one that refuses everything) to show that the property fails there, so
that it cannot pass by refusing."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from ebpo_verl.ops.errors import MESSAGE_LIMIT

edge_integers = st.sampled_from([2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**308, 10**309, 10**400, -(10**400)])
"""Integers at the edges: past float64's exact integers, at and past int64, around and past float overflow."""
edge_floats = st.sampled_from([1e308, -1.7976931348623157e308, math.inf, -math.inf, math.nan, 5e-324, -0.0])
"""Floats at overflow, the infinities, NaN, the smallest subnormal and negative zero."""
long_texts = st.sampled_from(["x" * 100_000, "é\n" * 50_000])
"""Strings of 100k characters (one with a newline in every other character)."""
edges = edge_integers | edge_floats | long_texts | st.integers(-(10**400), 10**400)
"""Values past every range a reader checks; mixed into each fuzz file's scalars."""


def paths(node: Any, prefix: tuple = ()) -> Any:
    """Every path (tuple of keys / indices) into a JSON document, the root included."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from paths(child, (*prefix, key))


def replaced(node: Any, path: tuple, value: Any) -> Any:
    """A copy of ``node`` with the part at ``path`` replaced by ``value``."""
    if not path:
        return value
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = replaced(node[path[0]], path[1:], value)
    return copy


def mutation(values: st.SearchStrategy, valid: Any) -> st.SearchStrategy:
    """``valid`` with one part (the whole included) replaced by a value drawn from ``values``."""
    return st.tuples(st.sampled_from(list(paths(valid))), values).map(lambda pv: replaced(valid, *pv))


def one_line(err: BaseException, name: str) -> None:
    """A refusal: one line naming ``name``, at most :data:`MESSAGE_LIMIT` characters whatever the input."""
    message = str(err)
    assert "\n" not in message and name in message, message[:2000]
    assert len(message) <= MESSAGE_LIMIT, f"a refusal of {len(message)} characters: {message[:400]}"


MUTANT = settings(max_examples=50, derandomize=True, database=None, deadline=None, phases=["explicit", "generate"])
"""A property run against a mutant: 50 derandomized examples, no shrinking (only to see it fail)."""


def refuse_all(*args: Any, **kwargs: Any) -> None:
    """A loader that refuses everything."""
    raise ValueError("mutant: refuses everything")


def refusing(error: type[Exception], message) -> Any:
    """A loader that refuses everything with the refusal the real one gives (``error``, one line
    ``message(*arguments)``), so that a property fails on its oracle, not on the message's form."""

    def mutant(*args: Any, **kwargs: Any) -> None:
        raise error(message(*args, **kwargs))

    return mutant


def fails_on_mutant(test, monkeypatch, target: Any, attribute: str, mutant=refuse_all, **arguments: Any) -> None:
    """``test`` (a ``@given`` property; ``arguments``: its other parameters) run with ``target.attribute`` (a module's
    attribute, or a key of a namespace dict such as a test module's ``globals()``) replaced by ``mutant`` must fail:
    an AssertionError, or the mutant's own exception escaping, not a Hypothesis error (a broken property)."""
    if isinstance(target, dict):
        monkeypatch.setitem(target, attribute, mutant)
    else:
        monkeypatch.setattr(target, attribute, mutant)
    try:
        MUTANT(given(**test.hypothesis._given_kwargs)(test.hypothesis.inner_test))(**arguments)
    except HypothesisException:  # a health check or a bad strategy: the property is broken, not failing
        raise
    except Exception:  # noqa: BLE001 (the property failed: what it is for)
        return
    raise AssertionError(f"{test.__name__} passes with {attribute} replaced by a mutant that refuses everything")
