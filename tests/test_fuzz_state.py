"""Fuzzing the estimators' state files (``ebpo_state.json``, ``spo_state.json``, ``dbb_state.json``) as a resume
reads them: every file is restored exactly or refused with one line (ValueError naming the file), the state left
reset; never another exception, a silently truncated number or a half-loaded state."""

from __future__ import annotations

import functools
import json
import math
import operator

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpo_verl.algos import registry
from ebpo_verl.trainer.checkpoint.state import load_state, save_state
from tests.fuzzing import fails_on_mutant, paths, refusing, replaced

FUZZ = settings(
    max_examples=150, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
"""150 examples per property, derandomized (the same examples every run)."""

STATEFUL = registry.stateful()
ENTRIES = sorted(STATEFUL)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _filled(name: str):
    """A state with content: EBPO's from a real call, the trackers with three prompts, any other's from two calls."""
    entry = STATEFUL[name]
    state = entry.state_cls()
    if name == "ebpo":
        stats = {"rewards": [6.0, 0.5, 1.5], "group_means": [3.0, 0.5, 0.5], "within_var": [3.0, 0.3, 0.0]}
        stats["inv_group_size"] = [3.0, 0.5, 0.0]
        state.load_state_dict(
            {"version": 1, "steps": 2, "prompts_seen": 3, "responses_seen": 6, "global": stats, "clusters": {}}
        )
    elif name in ("spo", "dbb"):
        state.load_state_dict(
            {"version": 1, "steps": 2, "keys": ["a", "b", "c"], "alpha": [1.5, 2, 3], "beta": [1, 1, 2]}
        )
    else:  # another estimator of the registry: its state after two calls on a small batch (default options)
        estimator = registry.new_estimator(entry)
        for step in range(2):
            uids = np.array([f"{step}a", f"{step}a", f"{step}b", f"{step}b"], dtype=object)
            estimator(torch.tensor([1.0, 0.0, 1.0, 1.0]), uids, torch.ones(4, dtype=torch.bool))
        state = estimator.state
    return entry, state


def _load(name: str, folder, text: str, step: int = 4):
    """(returned value or the ValueError, the state after) of a resume reading ``text`` as the state file."""
    entry = STATEFUL[name]
    (folder / entry.state.file).write_text(text, encoding="utf-8")
    state = entry.state_cls()
    state.load_state_dict(_filled(name)[1].state_dict())  # a resume's state is reset before the load
    try:
        return load_state(entry, folder, state, entry.options_cls(), global_step=step), state
    except ValueError as err:
        return err, state


def _saved_payload(name: str, tmp_path) -> dict:
    """The file a resume of ``name``'s filled state reads (a copy: made once per estimator)."""
    if name not in _SAVED:
        entry, state = _filled(name)
        _SAVED[name] = save_state(entry, tmp_path, state, entry.options_cls(), global_step=4).read_text()
    return json.loads(_SAVED[name])


_SAVED: dict[str, str] = {}


def _assert_refused(result, state, name: str) -> None:
    assert isinstance(result, ValueError), result
    message = str(result)
    assert "\n" not in message and STATEFUL[name].state.file in message and len(message) < 600
    assert state.state_dict() == STATEFUL[name].state_cls().state_dict()  # left reset, nothing half-loaded


@pytest.mark.parametrize("name", ENTRIES)
def test_fuzz_state_deeply_nested_json_is_one_line(name, tmp_path):
    # today: RecursionError escapes from json.loads
    result, state = _load(
        name, tmp_path, '{"format": 1, "global_step": 4, "state": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    _assert_refused(result, state, name)
    assert "nested too deeply" in str(result)


@pytest.mark.parametrize("name", ENTRIES)
@pytest.mark.parametrize("step", [4.0, 1.9, "4", True, -1, None])
def test_fuzz_state_global_step_must_be_an_integer(name, step, tmp_path):
    # today: int(1.9) == 1 and int("4") == 4 were accepted silently
    payload = {**_saved_payload(name, tmp_path), "global_step": step}
    result, state = _load(name, tmp_path, json.dumps(payload), step=1)
    _assert_refused(result, state, name)
    assert "global_step must be an integer >= 0" in str(result)


@pytest.mark.parametrize("name", ENTRIES)
def test_fuzz_state_huge_integer_is_refused(name, tmp_path):
    # an integer beyond a float's range: OverflowError in math.isfinite before is_real caught it
    payload = _saved_payload(name, tmp_path)
    if name == "ebpo":
        payload["state"]["global"]["rewards"][1] = 10**400
    elif name in ("spo", "dbb"):
        payload["state"]["alpha"][0] = 10**400
    else:  # another estimator's: its first float
        state = payload["state"]
        path = next(p for p in paths(state) if p and isinstance(functools.reduce(operator.getitem, p, state), float))
        payload["state"] = replaced(state, path, 10**400)
    _assert_refused(*_load(name, tmp_path, json.dumps(payload)), name)


def _floats(node):
    """``node`` with every number as a float (a saved count 3 restores as 3.0: the same number)."""
    if isinstance(node, dict):
        return {k: _floats(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_floats(v) for v in node]
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else node


def _restores(name: str, doc, saved_options: dict) -> bool | None:
    """The oracle: whether a resume must restore ``doc`` (True) or refuse it (False); None when its options differ
    from the saved ones (refused or restored as ``on_resume_mismatch`` says). A valid file: an object with format 1,
    global_step the integer 4, the saved options and a state its state class loads (checked by the class alone)."""
    if not isinstance(doc, dict) or not {"format", "global_step", "state"} <= doc.keys() or doc["format"] != 1:
        return False
    step = doc["global_step"]
    if isinstance(step, bool) or not isinstance(step, int) or step != 4:
        return False
    if json.dumps(doc.get("options", {}), sort_keys=True) != json.dumps(saved_options, sort_keys=True):
        return None
    try:
        STATEFUL[name].state_cls().load_state_dict(doc["state"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def _check_load(name: str, folder, text: str, doc, saved_options: dict) -> None:
    """Load ``text`` (``doc`` parsed; a non-JSON text: no document) and check the outcome both ways."""
    result, state = _load(name, folder, text)
    must = False if doc is _NOT_JSON else _restores(name, doc, saved_options)
    if isinstance(result, ValueError):
        assert must is not True, result  # a valid file is restored, never refused
        return _assert_refused(result, state, name)
    assert isinstance(result, bool) and must is not False, (result, doc)
    # accepted: the state holds exactly what the file says (a number is never rounded or truncated)
    expected = STATEFUL[name].state_cls()
    if result:
        expected.load_state_dict(doc["state"])
        assert _floats(state.state_dict()) == _floats(doc["state"])
    assert state.state_dict() == expected.state_dict()


_NOT_JSON = object()


@pytest.mark.parametrize("name", ENTRIES)
@FUZZ
@given(data=st.data())
def test_fuzz_state_file_mutations(name, data, tmp_path_factory):
    """One part of a valid file replaced by any JSON value (or none: the file as saved): restored exactly when
    the oracle says it is valid, refused in one line when it says not."""
    folder = tmp_path_factory.mktemp("state")
    payload = _saved_payload(name, folder)
    path = data.draw(st.none() | st.sampled_from(list(paths(payload))), label="path")
    mutated = payload if path is None else replaced(payload, path, data.draw(json_values, label="value"))
    _check_load(name, folder, json.dumps(mutated), mutated, payload["options"])


def _parsed(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


@pytest.mark.parametrize("name", ENTRIES)
@FUZZ
@given(text=st.none() | st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_fuzz_state_file_any_text(name, text, tmp_path_factory):
    """Any text as the file (or none: the file as saved): refused with one line unless it is a valid file."""
    folder = tmp_path_factory.mktemp("state")
    payload = _saved_payload(name, folder)
    text = json.dumps(payload) if text is None else text
    _check_load(name, folder, text, _parsed(text), payload["options"])


def test_fuzz_state_properties_fail_on_a_refusing_loader(monkeypatch, tmp_path_factory):
    """Each property fails when the resume's loader refuses every file (they cannot pass by refusing)."""
    for test in (test_fuzz_state_file_mutations, test_fuzz_state_file_any_text):
        mutant = refusing(ValueError, lambda entry, *args, **kwargs: f"{entry.state.file}: mutant")
        fails_on_mutant(
            test, monkeypatch, globals(), "load_state", mutant, name="ebpo", tmp_path_factory=tmp_path_factory
        )


@FUZZ
@given(
    keys=st.lists(st.text(st.characters(exclude_characters="\0"), min_size=1, max_size=6), max_size=6, unique=True).map(
        sorted
    ),
    values=st.lists(st.floats(min_value=1e-300, max_value=2.0**53), min_size=12, max_size=12),
    steps=st.integers(0, 2**53),
)
def test_fuzz_tracker_round_trip(keys, values, steps, tmp_path_factory):
    """A valid tracker (any keys, any positive pseudo-counts up to 2**53) saves and restores bit for bit."""
    folder = tmp_path_factory.mktemp("state")
    for name in ("spo", "dbb"):
        entry = STATEFUL[name]
        state = entry.state_cls()
        saved = {
            "version": 1,
            "steps": steps,
            "keys": keys,
            "alpha": values[: len(keys)],
            "beta": values[6:][: len(keys)],
        }
        state.load_state_dict(saved)
        save_state(entry, folder, state, entry.options_cls(), global_step=4)
        restored = entry.state_cls()
        assert load_state(entry, folder, restored, entry.options_cls(), global_step=4)
        assert restored.state_dict() == saved
        assert all(math.isfinite(v) for v in np.concatenate([restored.alpha, restored.beta]))
