"""What the fuzz properties share: running a property against a mutant of its loader (one that refuses
everything) to show that the property fails there, so that it cannot pass by refusing."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis.errors import HypothesisException

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
