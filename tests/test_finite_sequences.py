"""Every estimator of the registry, finite by construction (issue 53, item 1): each option at each edge of its rule
in turn (the others at their defaults) and each of its choices, over adversarial sequences (a prompt always
solved, always failed, alternating, groups of one, all-padding batches, one prompt repeated; rewards at the
two-level and the continuous extremes an estimator accepts, ``grouping.REWARD_LIMIT``), in fp16, bf16, fp32 and
fp64: each step returns advantages finite in the dtype they are written in, or refuses in one line; the state is
strict JSON, round-trips exactly and gives the same next step after a save/load at every step. Generated from the
registry: a new estimator, or one an installed package adds through the entry point (the toy of
tests/test_registry.py, installed here), is covered without a new line. ``-m slow``: 130 steps a sequence
(past dbb's old NaN at visit 121)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from ebpo_verl.algos import registry
from ebpo_verl.algos.estimator import FreshState
from ebpo_verl.algos.grouping import REWARD_LIMIT
from tests.test_registry import write_toy_site

TOY = "toy"
"""The out-of-tree estimator installed through the entry-point group (tests/test_registry.py's toy)."""
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
G = 4


def option_variants(spec: registry.EstimatorSpec) -> list[dict]:
    """The defaults, then each option at each edge of its rule and at each of its other choices, one at a time."""
    variants: list[dict] = [{}]
    for f in spec.options_cls.declarations() if spec.options_cls else ():
        rule = f.metadata["rule"]
        values = [*(rule.edges if rule else ()), *f.metadata["choices"]]
        variants += [{f.name: v} for v in values if v != f.default and not isinstance(f.default, tuple)]
    return variants


def batch(sequence: str, t: int, level: tuple[float, float]) -> tuple[list[str], list[float], list[bool]]:
    """(prompt keys, rewards, valid) of step ``t`` of ``sequence`` with rewards at ``level`` (low, high)."""
    lo, hi = level
    if sequence == "solved":
        return ["s"] * G, [hi] * G, [True] * G
    if sequence == "failed":
        return ["f"] * G, [lo] * G, [True] * G
    if sequence == "alternating":
        return ["a"] * G, [hi if t % 2 else lo] * G, [True] * G
    if sequence == "singletons":
        return ["s1", "s2", "s3", "s4"], [hi, lo, hi if t % 2 else lo, hi], [True] * 4
    keys = ["s"] * G + ["f"] * G + ["m"] * G  # mixed: solved, failed and a concentrated group
    rewards = [hi] * G + [lo] * G + [hi, lo, hi, hi]
    padding = sequence == "padding" and t % 2 == 1  # every other batch all padding
    return keys, rewards, [not padding] * len(keys)


SEQUENCES = ("solved", "failed", "alternating", "singletons", "mixed", "padding")


def levels(dtype: torch.dtype) -> list[tuple[float, float]]:
    """Two-level rewards (0/1, -1/+1) and the continuous extremes the dtype can hold within the reward limit."""
    top = min(REWARD_LIMIT, torch.finfo(dtype).max)
    return [(0.0, 1.0), (-1.0, 1.0), (-top, top)]


def call(estimator, keys: list[str], rewards: list[float], valid: list[bool], t: int, dtype: torch.dtype):
    uids = np.array([f"{k}-{t}" for k in keys], dtype=object)
    rows = np.array(keys, dtype=object)
    source = estimator.spec.row_source(estimator.options)
    values = None if source is None else np.arange(len(keys)) % G if source.sample_index else rows
    scores = torch.tensor(rewards, dtype=torch.float64).to(dtype)
    return estimator(scores, uids, torch.tensor(valid), values)


def restored(estimator):
    """A fresh estimator of the same options holding ``estimator``'s state read back from strict JSON."""
    copy = registry.new_estimator(estimator.spec, estimator.options)
    if estimator.state is None:
        return copy
    saved = json.loads(json.dumps(estimator.state.state_dict(), allow_nan=False))
    if isinstance(copy.state, FreshState):
        copy.state.load_state_dict(saved, dataclasses.asdict(estimator.options))
    else:
        copy.state.load_state_dict(saved)
    assert copy.state.state_dict() == estimator.state.state_dict()
    return copy


def refused(err: ValueError) -> None:
    """A refusal: one line (the longest of today's refusal templates, bnpo's, is ~450 characters), not the backstop
    that catches non-finite advantages (``grouping.scatter_rows``: a bug)."""
    assert "\n" not in str(err) and len(str(err)) <= 600 and "non-finite advantages" not in str(err), str(err)


def run_sequence(estimator, sequence: str, level: tuple[float, float], steps: int) -> int:
    """Run ``sequence``; every step finite in its dtype or refused (which ends the run); after each, a copy restored
    from the saved state gives the same next step. Returns the steps that ran."""
    for t in range(steps):
        dtype = DTYPES[t % len(DTYPES)]
        keys, rewards, valid = batch(sequence, t, level)
        twin = restored(estimator)
        try:
            result = call(estimator, keys, rewards, valid, t, dtype)
        except ValueError as err:
            refused(err)
            with pytest.raises(ValueError):
                call(twin, keys, rewards, valid, t, dtype)
            return t
        values = result.values
        assert values.dtype == dtype and bool(torch.isfinite(values).all()), (sequence, level, t, values)
        assert all(math.isfinite(v) for v in result.diagnostics.values()), result.diagnostics
        again = call(twin, keys, rewards, valid, t, dtype)
        assert torch.equal(again.values, values) and again.diagnostics == result.diagnostics
    return steps


@pytest.fixture
def spec_of(request, tmp_path, monkeypatch):
    """The spec of the parametrised name; the toy's entry point installed (and the registry re-read) for it."""
    name = request.param
    if name == TOY:
        monkeypatch.syspath_prepend(str(write_toy_site(tmp_path / "site")))
        registry.estimators.cache_clear()
        request.addfinalizer(registry.estimators.cache_clear)
    return registry.get(name)


def check_every_variant(spec: registry.EstimatorSpec, steps: int) -> None:
    """Every option variant over every sequence and reward level; all failures listed at once."""
    failures = []
    for options in option_variants(spec):
        try:
            fresh = registry.new_estimator(spec, options)
        except ValueError as err:  # an option edge refused with another option's default: in one line
            refused(err)
            continue
        for sequence in SEQUENCES:
            for level in levels(torch.float16):
                fresh.reset()
                try:
                    ran = run_sequence(fresh, sequence, level, steps)
                except AssertionError as err:
                    failures.append(f"{options} {sequence} {level}: {str(err)[:300]}")
                    continue
                plain = not options and level == (0.0, 1.0) and sequence != "singletons"
                if plain and ran < steps:
                    failures.append(f"defaults refused 0/1 rewards in {sequence}")
    assert not failures, "\n".join(failures[:30])


NAMES = [*sorted(registry.ours()), TOY]


@pytest.mark.parametrize("spec_of", NAMES, indirect=True)
def test_every_estimator_is_finite_over_adversarial_sequences(spec_of):
    check_every_variant(spec_of, steps=4)


@pytest.mark.slow
@pytest.mark.parametrize("spec_of", NAMES, indirect=True)
def test_every_estimator_is_finite_over_long_sequences(spec_of):
    check_every_variant(spec_of, steps=130)
