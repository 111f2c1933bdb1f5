"""The GPU self-check (ebpo_verl.smoke.selfcheck) in its CPU form, as CI runs it, and the checks' own logic:
its comparison against hand-computed differences, a planted device difference it must report, the train
check's wiring to the smoke's one-node flow (which tests/test_cpu_smoke.py runs on the CPU), vLLM's skip."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ebpo_verl.algos import registry
from ebpo_verl.smoke import selfcheck


def test_max_rel_diff_against_hand_values():
    assert selfcheck.max_rel_diff(torch.tensor([1.0, 0.0, -2.0]), torch.tensor([1.0, 0.0, -2.0])) == 0.0
    assert selfcheck.max_rel_diff(torch.tensor([2.0, 4.0]), torch.tensor([2.0, 5.0])) == pytest.approx(0.2)
    assert selfcheck.max_rel_diff({"a": [1.0, 3]}, {"a": [1.0, 4]}) == pytest.approx(0.25)
    assert selfcheck.max_rel_diff({"a": 1.0}, {"b": 1.0}) == math.inf
    assert selfcheck.max_rel_diff([1.0], [1.0, 2.0]) == math.inf
    assert selfcheck.max_rel_diff(torch.zeros(2), torch.zeros(3)) == math.inf
    assert selfcheck.max_rel_diff("x", "y") == math.inf


def test_the_batches_hold_all_fail_all_pass_and_padding_groups():
    for scores, uids, valid, sample in selfcheck.batches():
        assert not valid[-1] and str(uids[-1]).startswith("pad")
        assert scores[: selfcheck.GROUPS].sum() == 0 and scores[selfcheck.GROUPS : 2 * selfcheck.GROUPS].min() == 1
        assert sorted(sample[: selfcheck.GROUPS]) == list(range(selfcheck.GROUPS))


def test_the_estimators_check_passes_on_the_cpu_and_sees_a_planted_difference(tmp_path, monkeypatch):
    line = selfcheck.check_estimators("cpu", tmp_path)
    assert line.startswith(f"{len(registry.ours())} estimators equal on cpu and cpu")
    real = selfcheck._run_estimator

    def off_by_a_little(name, device):
        values, diagnostics, state = real(name, "cpu")
        if name == "ebpo" and device == "cpu" and off_by_a_little.calls:
            values[1] = values[1] * (1 + 1e-5)
        off_by_a_little.calls += name == "ebpo"
        return values, diagnostics, state

    off_by_a_little.calls = 0
    monkeypatch.setattr(selfcheck, "_run_estimator", off_by_a_little)
    with pytest.raises(AssertionError, match="ebpo"):
        selfcheck.check_estimators("cpu", tmp_path)


def test_the_train_check_runs_the_smokes_one_node_flow_on_the_device(tmp_path, monkeypatch):
    from ebpo_verl.smoke import flows, settings

    seen = {}
    monkeypatch.setattr(settings, "prepare", lambda work: {"prepared": str(work)})
    monkeypatch.setattr(flows, "one_node", lambda work, files, timeout, vllm, device: seen.update(locals()))
    selfcheck.check_train("cuda", tmp_path, 77)
    assert seen["device"] == "cuda" and seen["timeout"] == 77 and seen["vllm"] is False
    assert seen["files"] == {"prepared": str(tmp_path / "train")}


def test_vllm_is_skipped_with_the_reason_when_not_installed(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(selfcheck.Skipped, match="vLLM is not installed"):
        selfcheck.check_vllm("cpu", tmp_path)


def test_bad_arguments_are_refused_in_one_line(tmp_path, capsys):
    for argv in (["--skip", "trl,gpu"], ["--device", "tpu"], ["--run-timeout", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            selfcheck.main(["--out", str(tmp_path / "a"), *argv])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "a").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(SystemExit, match="not empty"):
        selfcheck.main(["--device", "cpu", "--out", str(tmp_path / "full")])


@pytest.mark.slow
def test_the_cpu_form_runs_every_estimator_and_trl_and_writes_its_summary(tmp_path, capsys):
    pytest.importorskip("trl", reason="the [trl] extra (in [test]) is not installed")
    out = tmp_path / "selfcheck"
    code = selfcheck.main(["--device", "cpu", "--skip", "train,vllm", "--out", str(out)])
    printed = capsys.readouterr().out
    summary = json.loads((out / "selfcheck.json").read_text())
    assert code == 0, printed
    assert {name: c["status"] for name, c in summary["checks"].items()} == {
        "estimators": "ok", "trl": "ok", "train": "skipped", "vllm": "skipped"
    }  # fmt: skip
    resumed = summary["checks"]["trl"]["line"].split("resumed exactly: ")[1].split(", ")
    assert sorted(resumed) == sorted(registry.stateful())
    for name in selfcheck.CHECKS:
        assert f"[selfcheck] {name}: " in printed


def test_cuda_without_a_device_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="torch sees no CUDA device"):
        selfcheck.main(["--device", "cuda", "--out", str(tmp_path / "gpu")])
    assert not (tmp_path / "gpu").exists()
