"""The GPU self-check (ebpo_verl.smoke.selfcheck) in its CPU form, as CI runs it, and the checks' own logic:
its comparison against hand-computed differences, a planted device difference it must report, the train
check's resume comparison fed broken runs, its time limit, and the check itself on the CPU; vLLM's skip."""

from __future__ import annotations

import json
import math
import os
import re

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
    assert line.startswith(f"{len(registry.ours())} estimators equal with scores on cpu and cpu (host float64 math")
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


def test_token_rewards_put_each_score_on_the_last_token_of_its_response():
    scores, _, valid, _ = selfcheck.batches()[0]
    rewards, mask = selfcheck.token_rewards(scores, valid, length=3)
    lengths = mask.sum(dim=1)
    assert lengths[:-1].tolist() == [1 + i % 3 for i in range(len(scores) - 1)] and lengths[-1] == 0
    assert torch.equal(rewards.sum(dim=1), torch.where(valid, scores.double(), torch.zeros(())))
    assert torch.equal(rewards * mask, rewards)  # nothing outside a response
    view = selfcheck.placer("cpu", torch.bfloat16, contiguous=False)(rewards)
    assert view.dtype == torch.bfloat16 and not view.is_contiguous() and torch.equal(view.double(), rewards)


@pytest.mark.parametrize("path", [selfcheck.trainer_path, selfcheck.trl_path], ids=["ebpo-train", "trl"])
@pytest.mark.parametrize("name", ["ebpo", "bnpo", "krpo"])
def test_each_path_in_each_dtype_differs_from_float64_by_its_one_rounding(path, name):
    """The check's difference is the float64 advantages' own rounding into the dtype (computed here by casting
    them), within the dtype's tolerance; diagnostics and state equal."""
    reference = path(name, lambda t: t)
    for dtype, tolerance in selfcheck.TOLERANCE.items():
        rounded = [v.to(dtype).double() for v in reference[0]]
        scales = [torch.maximum(r.abs(), v.abs()).clamp_min(torch.finfo(dtype).tiny) for r, v in
                  zip(rounded, reference[0], strict=True)]  # fmt: skip
        want = max(float(((r - v).abs() / m).max()) for r, v, m in zip(rounded, reference[0], scales, strict=True))
        for contiguous in (True, False):
            diff, problem = selfcheck._compare(name, path, "cpu", dtype, contiguous, reference)
            assert problem is None and diff == pytest.approx(want, rel=1e-9, abs=0) and diff <= tolerance


def test_the_paths_check_reports_a_wrong_dtype_a_wrong_value_and_a_wrong_state():
    reference = selfcheck.trainer_path("ebpo", lambda t: t)

    def planted(change):
        def path(name, place):
            values, diagnostics, state = selfcheck.trainer_path(name, place)
            return change(values, diagnostics, state)

        return selfcheck._compare("ebpo", path, "cpu", torch.float16, True, reference)[1]

    assert "advantages in float32 on cpu, not float16 on cpu" == planted(lambda v, d, s: ([x.float() for x in v], d, s))
    assert "differ by" in planted(lambda v, d, s: ([x * (1 + 2**-9) for x in v], d, s))
    inf = planted(lambda v, d, s: ([x.masked_fill(x != 0, math.inf) for x in v], d, s))  # an fp16 overflow
    assert "differ by inf relative" in inf
    state = planted(lambda v, d, s: (v, d, {**s, "prompts_seen": s["prompts_seen"] + 1}))
    assert "diagnostics or state differ" in state


def test_the_paths_check_is_skipped_with_the_reason_without_verl_or_trl(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("verl", "trl") else real(name))
    with pytest.raises(selfcheck.Skipped, match=r"ebpo-train \(verl not installed\), trl \(trl not installed\)"):
        selfcheck.check_paths("cpu", tmp_path)


def _logs(seen_b: int = 12) -> tuple[dict[int, dict], dict[int, dict]]:
    """Made-up metrics of runs a (steps 1-3) and b (step 3, resumed): 4 prompts a step, b's step 3 = a's."""
    a = {s: {"ebpo/prompts_seen": 4 * s, "ebpo/mu_glob": 0.25 * s, "actor/grad_norm": 0.5} for s in (1, 2, 3)}
    return a, {3: {**a[3], "ebpo/prompts_seen": seen_b}}


def test_the_train_checks_comparison_passes_a_resume_and_names_each_broken_one():
    from ebpo_verl.smoke.train_check import compare

    state = {"steps": 3, "prompts_seen": 12}
    assert compare(*_logs(), state, dict(state)).startswith("a run resumed from step 2: step 3's 2 ebpo/* metrics")
    a, b = _logs()
    b[3]["ebpo/mu_glob"] = 0.75 * (1 + 1e-9)  # beyond 1e-12 relative
    broken = {
        "prompts by step 3, not 12": (*_logs(seen_b=4), state, state),  # a fresh start: one batch seen
        "ebpo/mu_glob: uninterrupted 0.75 != resumed": (a, b, state, state),
        "EB state saved after step 3 differs": (*_logs(), state, {**state, "prompts_seen": 13}),
        "logged steps: a [1, 2, 3], b [2, 3]": (_logs()[0], {2: {}, **_logs()[1]}, state, state),
        "not finite ['ebpo/mu_glob']": (
            {**_logs()[0], 2: {**_logs()[0][2], "ebpo/mu_glob": math.nan}},
            _logs()[1],
            state,
            state,
        ),  # fmt: skip
        "not finite ['actor/grad_norm']": (
            _logs()[0],
            {3: {**_logs()[1][3], "actor/grad_norm": math.inf}},
            state,
            state,
        ),  # fmt: skip
    }
    for found, args in broken.items():
        with pytest.raises(AssertionError, match=re.escape(found)):
            compare(*args)


def test_a_run_past_its_limit_is_killed_with_what_it_started(tmp_path, monkeypatch):
    """A stand-in for ebpo-train that starts a child and sleeps: killed at the limit, its child too, one error."""
    import psutil

    from ebpo_verl.smoke import train_check

    (tmp_path / "sleeper.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print('child', child.pid, flush=True)\ntime.sleep(300)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(train_check, "ENTRY", "sleeper")
    files = {"train": "t", "val": "v", "model": "m", "prompt_length": 10}
    with pytest.raises(AssertionError, match=r"ebpo-train run a exceeded 3 s \(--run-timeout\) and was killed"):
        train_check.run(tmp_path, files, "a", [], "cpu", 3)
    child = int((tmp_path / "a.log").read_text().split("child ")[1].split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
@pytest.mark.heavy("own_ray")
def test_the_train_check_runs_ebpo_train_and_its_resume_on_the_cpu(tmp_path):
    """The ``train`` check in its CPU form: two real ebpo-train runs, the second resumed from the first's step 2."""
    from ebpo_verl.smoke.train_check import check_train

    line = selfcheck.check_train("cpu", tmp_path, 500)  # two runs within the heavy tier's 1,200 s (5 min each, loaded)
    assert selfcheck.check_train is check_train
    assert line.startswith("ebpo-train on cpu (FSDP2, EBPO): a run resumed from step 2: step 3's ")
    assert (tmp_path / "train" / "ckpt_b" / "global_step_3").is_dir()


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
        "paths": "ok", "estimators": "ok", "trl": "ok", "train": "skipped", "vllm": "skipped"
    }  # fmt: skip
    resumed = summary["checks"]["trl"]["line"].split("resumed exactly: ")[1].split(", ")
    assert sorted(resumed) == sorted(registry.stateful())
    for name in selfcheck.CHECKS:
        assert f"[selfcheck] {name}: " in printed


def test_an_out_that_is_a_file_or_cannot_be_created_is_refused_in_one_line(tmp_path, capsys):
    from ebpo_verl.ops.errors import MESSAGE_LIMIT

    (tmp_path / "file").write_text("")
    cases = {str(tmp_path / "file"): "is a file", str(tmp_path / "file" / "sub"): "cannot be used (Not a directory)",
             str(tmp_path / ("x" * 200_000)): "cannot be used (File name too long)"}  # fmt: skip
    for out, found in cases.items():
        with pytest.raises(SystemExit) as err:
            selfcheck.main(["--device", "cpu", "--out", out, "--skip", ",".join(selfcheck.CHECKS)])
        message = str(err.value.code)
        assert found in message and "\n" not in message and len(message) <= MESSAGE_LIMIT, message
    assert (tmp_path / "file").read_text() == ""


def test_cuda_without_a_device_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="torch sees no CUDA device"):
        selfcheck.main(["--device", "cuda", "--out", str(tmp_path / "gpu")])
    assert not (tmp_path / "gpu").exists()
