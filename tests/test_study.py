"""The CPU study (python -m ebpo_verl.study): tasks, sampler, MSE check, and the tiny preset end to end."""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy import stats as sps

from ebpo_verl.study.mse import DISTRIBUTIONS, GROUP_SIZES, beta_moments, simulate
from ebpo_verl.study.policy import TinyPolicy, exact_pass_at_1, sample
from ebpo_verl.study.presets import LR_GRID, PRESETS
from ebpo_verl.study.rl import RLConfig, run_rl
from ebpo_verl.study.tasks import EOS, PAD, decode, encode, make_splits, misconceived, verify

TINY = PRESETS["tiny"]


# ---------------------------------------------------------------- tasks


def test_encode_hand_computed():
    prompts, targets = encode("add", np.array([96, 5]), np.array([89, 0]), np.array([185, 5]))
    assert decode(prompts[0].tolist()) == "<bos>096+089="
    assert decode(targets[0].tolist()) == "581"  # least-significant digit first
    assert targets[0].tolist()[3:] == [EOS, PAD]
    assert decode(targets[1].tolist()) == "5" and targets[1].tolist()[1] == EOS
    # carry-free misconception: 96 + 89 -> digits (6+9)%10=5, (9+8)%10=7 -> 75; 743 - 199 -> 654 (no borrows)
    assert misconceived("add", np.array([96]), np.array([89])).tolist() == [75]
    assert misconceived("sub", np.array([743]), np.array([199])).tolist() == [654]
    assert misconceived("mul", np.array([28]), np.array([4])).tolist() == [82]  # 2*4=8, 8*4=32 -> 2
    assert misconceived("mod", np.array([607]), np.array([6])).tolist() == [1]  # 7 % 6


def test_verify_exact_match_only():
    _, t = encode("sub", np.array([50]), np.array([8]), np.array([42]))
    target = torch.from_numpy(t)
    right = target.clone()
    no_eos = torch.tensor([[DIG(2), DIG(4), DIG(0), DIG(0), DIG(0)]])
    extra_digit = torch.tensor([[DIG(2), DIG(4), DIG(0), EOS, PAD]])
    wrong = torch.tensor([[DIG(2), DIG(5), EOS, PAD, PAD]])
    got = verify(torch.cat([right, no_eos, extra_digit, wrong]), target.repeat(4, 1))
    assert got.tolist() == [1.0, 0.0, 0.0, 0.0]


def DIG(d: int) -> int:  # noqa: N802 - token id of a digit
    return 3 + d


def test_splits_are_disjoint_and_correct():
    splits = make_splits({"heldout": 10, "train": 30, "sft": 200}, seed=1)
    seen = {}
    for name, ps in splits.items():
        for row in ps.prompts.tolist():
            assert tuple(row) not in seen, f"{decode(row)} in {name} and {seen.get(tuple(row))}"
            seen[tuple(row)] = name
        # the answer recomputed from the prompt text
        for i in range(0, len(ps), 37):
            a, op, b = re.fullmatch(r"<bos>(\d{3})([-+*%])(\d{3})=", decode(ps.prompts[i])).groups()
            want = {"+": operator.add, "-": operator.sub, "*": operator.mul, "%": operator.mod}[op](int(a), int(b))
            assert decode(ps.targets[i])[::-1] == str(want) == str(ps.answer[i])


# ---------------------------------------------------------------- policy


def test_sampler_log_probs_match_teacher_forcing():
    torch.manual_seed(0)
    model = TinyPolicy(TINY.policy)
    data = make_splits({"heldout": 4}, seed=0)["heldout"]
    responses, mask, logp = sample(model, data.prompts, 3, torch.Generator().manual_seed(0))
    assert responses.shape == (3 * len(data), 5)
    forced = torch.log_softmax(model.response_logits(data.prompts.repeat_interleave(3, 0), responses), -1)
    forced = forced.gather(-1, responses.unsqueeze(-1)).squeeze(-1) * mask
    assert torch.allclose(logp, forced, atol=1e-5)
    # after the first EOS everything is PAD and masked
    for r, m in zip(responses.tolist(), mask.tolist(), strict=True):
        if EOS in r:
            k = r.index(EOS)
            assert all(m[: k + 1]) and not any(m[k + 1 :]) and all(t == PAD for t in r[k + 1 :])


@pytest.mark.slow
def test_exact_pass_at_1_matches_sampling_frequency():
    """The teacher-forced probability of the target equals the frequency of exact hits among many samples."""
    torch.manual_seed(3)
    model = TinyPolicy(TINY.policy)
    data = make_splits({"heldout": 1}, seed=0, topics=("mod",), levels=(1,))["heldout"]
    exact = exact_pass_at_1(model, data)
    n = 20000
    responses, _, _ = sample(model, data.prompts, n, torch.Generator().manual_seed(0))
    freq = verify(responses, data.targets.repeat_interleave(n, 0)).view(len(data), n).mean(1)
    sd = torch.sqrt(exact * (1 - exact) / n)
    assert torch.all((freq - exact).abs() <= 5 * sd + 1e-4), (freq, exact)


# ---------------------------------------------------------------- MSE theorem


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_beta_moments_by_integration(name):
    a, b = DISTRIBUTIONS[name]
    mu, tau2, sigma2 = beta_moments(a, b)
    pdf = sps.beta(a, b).pdf
    assert mu == pytest.approx(integrate.quad(lambda t: t * pdf(t), 0, 1)[0], rel=1e-6)
    assert sigma2 == pytest.approx(integrate.quad(lambda t: t * (1 - t) * pdf(t), 0, 1)[0], rel=1e-6)
    assert tau2 == pytest.approx(sps.beta(a, b).var(), rel=1e-9)


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_mse_ratio_matches_closed_form(name):
    a, b = DISTRIBUTIONS[name]
    _, tau2, sigma2 = beta_moments(a, b)
    for g in GROUP_SIZES:
        row = simulate(a, b, g, n_prompts=200_000, seed=g)
        assert row["closed_form"] == pytest.approx(1 - (sigma2 / g) / (sigma2 / g + tau2))
        assert abs(row["empirical"] / row["closed_form"] - 1) < 0.05, (name, g, row)
        assert row["empirical"] < 1  # shrinkage beats the sample mean whenever tau^2 > 0


def test_estimator_ratio_standard_error_matches_seed_spread():
    """The delta-method standard error of the estimator's MSE ratio agrees with the spread over 24 seeds."""
    from ebpo_verl.study.mse import estimator_ratio

    out = np.array([estimator_ratio(1.0, 1.0, 4, 6, 128, seed, {}) for seed in range(24)])
    spread, se = out[:, 0].std(ddof=1), out[:, 1].mean()
    assert 0.6 < spread / se < 1.5, (spread, se)


def test_mse_findings_counts_cells():
    from ebpo_verl.study.mse import ESTIMATOR_VARIANTS, findings

    d, t, w = ESTIMATOR_VARIANTS  # default, debiased tau^2, within sigma^2
    rows = [
        {"distribution": "A", "G": 2, "closed_form": 0.5, d: 0.6, t: 1.2, w: 0.49, t + " se": 0.1, w + " se": 0.005},
        {"distribution": "B", "G": 4, "closed_form": 0.8, d: 0.9, t: 0.85, w: 0.95},
    ]
    text = findings(rows)
    assert text.startswith("In 4 of the 6 estimator cells the ratio lies between the optimum 1 - S and 1")
    assert f"above 1, worse than the group mean, in 1 ({t}: A G=2)" in text
    assert f"below 1 - S in 1 ({w}: A G=2), by at most 2.0 standard errors" in text


# ---------------------------------------------------------------- the tiny preset end to end


@pytest.fixture()
def one_thread():
    """Runs are deterministic for a seed at a fixed thread count; the study uses one torch thread per run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    from ebpo_verl.study.__main__ import main

    out = tmp_path_factory.mktemp("study")
    before = torch.get_num_threads()
    try:
        assert main(["--preset", "tiny", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(before)
    return out


def _md_table(text: str, heading: str) -> list[list[str]]:
    """The first markdown table after ``heading``, as rows of cells (separator row dropped)."""
    lines = text.split(heading, 1)[1].splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    block = []
    for ln in lines[first:]:
        if not ln.startswith("|"):
            break
        if not set(ln) <= set("|-"):
            block.append([c.strip() for c in ln.strip("|").split("|")])
    return block


@pytest.mark.slow
def test_tiny_writes_everything(tiny_study):
    for name in (
        "study.md",
        "runs.json",
        "learning_curves.png",
        "zero_signal.png",
        "grad_norm.png",
        "entropy.png",
        "kl.png",
        "ordering_curves.png",
        "pass_at_k.png",
        "summary.json",
        "study_config.json",
        "base.json",
        "base_model.pt",
    ):
        path = tiny_study / name
        assert path.is_file() and path.stat().st_size > 0, name
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tiny_study.glob("*.tmp*")) and not list(tiny_study.glob("runs/*.tmp"))
    saved_runs = json.loads((tiny_study / "runs.json").read_text())
    runs, n_heldout = saved_runs["runs"], saved_runs["base"]["n_heldout"]
    n_cells = len(TINY.estimators) * len(TINY.group_sizes) + len(TINY.order_estimators) * (len(TINY.orders) - 1)
    assert len(runs) == n_cells * TINY.seeds == TINY.n_runs()
    # every run is also saved on its own, as the resume reads it
    for run in runs:
        c = run["config"]
        saved = tiny_study / "runs" / f"{c['estimator']}-g{c['group_size']}-{c['order']}-s{c['seed']}.json"
        assert json.loads(saved.read_text()) == run
    assert len(list((tiny_study / "runs").iterdir())) == len(runs)
    for run in runs:
        m = run["metrics"]
        assert len(m["reward"]) == len(m["grad_norm"]) == len(m["step_kl"]) == TINY.rl["steps"]
        assert m["eval_step"][0] == 0 and m["eval_step"][-1] == TINY.rl["steps"]
        assert all(0 <= x <= 1 for x in m["accuracy"] + m["zero_signal"] + m["heldout_pass_final"])
        # the final per-prompt probabilities are the last evaluation's: their float32 mean (torch's, as the
        # evaluation takes it) is its accuracy
        assert len(m["heldout_pass_final"]) == n_heldout == len(saved_runs["base"]["heldout_pass"])
        assert torch.tensor(m["heldout_pass_final"], dtype=torch.float32).mean().item() == m["accuracy"][-1]
        if run["config"]["estimator"] == "grpo":  # GRPO has no signal exactly in the groups with equal rewards
            assert m["zero_signal"] == m["uniform_groups"]


@pytest.mark.slow
def test_tiny_tables_well_formed(tiny_study):
    text = (tiny_study / "study.md").read_text()
    cell = re.compile(r"^\d\.\d{3} ± \d\.\d{3}$")
    head, *rows = _md_table(text, "## Final held-out accuracy")
    assert head == ["estimator"] + [f"G={g}" for g in TINY.group_sizes]
    assert [r[0] for r in rows] == list(TINY.estimators)
    assert all(cell.match(c) for r in rows for c in r[1:]), rows
    head, *rows = _md_table(text, "## Stream order")
    assert head == ["estimator"] + [f"order={o}" for o in TINY.orders]
    assert [r[0] for r in rows] == list(TINY.order_estimators)
    assert all(cell.match(c) for r in rows for c in r[1:]), rows
    head, *rows = _md_table(text, "## Fraction of groups with zero advantage")
    ebpo = next(r for r in rows if r[0] == "ebpo")
    assert all(c.startswith("0.000") for c in ebpo[1:])  # EB shrinkage leaves no group without signal


@pytest.mark.slow
def test_runs_are_deterministic(tiny_study, one_thread):
    base = _tiny_base(tiny_study)
    runs = json.loads((tiny_study / "runs.json").read_text())["runs"]
    first = runs[0]
    splits = make_splits(TINY.split_sizes, seed=0, topics=TINY.topics, levels=TINY.levels)
    train_pass = exact_pass_at_1(base, splits["train"])
    cfg = RLConfig(**first["config"])
    again = run_rl(base, splits["train"], splits["heldout"], train_pass.numpy(), cfg)
    assert np.allclose(again["accuracy"], first["metrics"]["accuracy"], atol=1e-6)
    assert np.allclose(again["reward"], first["metrics"]["reward"])


def _tiny_base(tiny_study) -> TinyPolicy:
    base = TinyPolicy(TINY.policy)
    base.load_state_dict(torch.load(tiny_study / "base_model.pt", weights_only=True))
    return base


@pytest.mark.slow
def test_warm_start_above_chance(tiny_study):
    """The warm start answers far better than its random initialisation, and its pass rates spread."""
    info = json.loads((tiny_study / "runs.json").read_text())["base"]
    splits = make_splits(TINY.split_sizes, seed=0, topics=TINY.topics, levels=TINY.levels)
    held = splits["heldout"]
    torch.manual_seed(0)
    untrained = exact_pass_at_1(TinyPolicy(TINY.policy), held).mean().item()
    warm = exact_pass_at_1(_tiny_base(tiny_study), held)
    assert warm.mean().item() == pytest.approx(info["heldout_accuracy"], abs=1e-6)
    assert untrained < 0.01 and warm.mean().item() > 0.2
    assert (warm < 0.1).float().mean() > 0.05 and (warm > 0.8).float().mean() > 0.1  # hard and easy prompts


@pytest.mark.slow
def test_grpo_learns_addition(tiny_study, one_thread):
    """GRPO at G=8 on the addition topic raises held-out exact pass@1.

    The evaluation is exact (no sampling noise) on a fixed held-out set, so a change can only come from
    training; with this warm start two seeds gained +0.07 and +0.09 in 40 steps, and a learning rate too high
    for the toy (1e-3) makes it fall by 0.2-0.3. The bar, +0.04 on average and +0.02 for each seed, is half
    the observed gain and far above zero.
    """
    base = _tiny_base(tiny_study)
    splits = make_splits(TINY.split_sizes, seed=0, topics=TINY.topics, levels=TINY.levels)
    train = splits["train"].subset(np.flatnonzero(splits["train"].topic == "add"))
    held = splits["heldout"].subset(np.flatnonzero(splits["heldout"].topic == "add"))
    train_pass = exact_pass_at_1(base, train).numpy()
    gains = []
    for seed in (0, 1):
        cfg = RLConfig("grpo", 8, seed=seed, steps=40, responses_per_step=128, eval_every=10)
        acc = run_rl(base, train, held, train_pass, cfg)["accuracy"]
        gains.append(acc[-1] - acc[0])
    assert np.mean(gains) > 0.04 and min(gains) > 0.02, gains


# ---------------------------------------------------------------- otb: verl's Optimal Token Baseline


def _otb_by_hand(rewards, lengths, old_logp, spp, groups):
    """OTB's formula, written out per group, token and response in plain Python (arXiv 2602.07078 as verl 0.9.1
    implements it): w_t = 1 - 2 pi_t + sum pi^2, W_t = w_1 + ... + w_t, B_t = sum_i G_i W_it / (sum_i W_it + 1e-8)
    over the group's responses still running at t, the unique longest response's baseline 0 past the second
    longest, A_t = G_t - B_t with the outcome reward as the return G_t at every token of the response."""
    n, width = len(rewards), max(lengths)
    w_cum = [[0.0] * width for _ in range(n)]
    for i in range(n):
        total = 0.0
        for t in range(lengths[i]):
            total += 1.0 - 2.0 * float(np.exp(old_logp[i][t])) + spp[i][t]
            w_cum[i][t] = total
    adv = [[0.0] * width for _ in range(n)]
    for members in groups:
        by_length = sorted(lengths[i] for i in members)
        longest = [i for i in members if lengths[i] == by_length[-1]]
        for t in range(width):
            live = [i for i in members if t < lengths[i]]
            num = sum(rewards[i] * w_cum[i][t] for i in live)
            den = sum(w_cum[i][t] for i in live) + 1e-8
            for i in live:
                tail = len(longest) == 1 and i == longest[0] and by_length[-1] > by_length[-2] and t >= by_length[-2]
                adv[i][t] = rewards[i] - (0.0 if tail else num / den)
    return adv


def test_otb_advantages_are_verls_registered_formula():
    """The study's otb advantages (verl's registered optimal_token_baseline, fed old_log_probs and sum_pi_squared)
    equal OTB's formula computed by hand: two groups of three, one with a unique longest response."""
    from ebpo_verl.study.rl import ESTIMATORS, _advantages

    rewards = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    lengths = [1, 4, 2, 3, 3, 1]
    gen = torch.Generator().manual_seed(0)
    old_logp = -torch.rand(6, 4, generator=gen) * 2
    spp = 0.2 + 0.7 * torch.rand(6, 4, generator=gen)
    mask = torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]
    old_logp = old_logp * mask  # as the sampler returns them: 0 past the end
    index = np.array(["a"] * 3 + ["b"] * 3, dtype=object)
    got = _advantages(
        ESTIMATORS["otb"], torch.tensor(rewards), mask, index, np.array(["add"] * 6), np.arange(6), (old_logp, spp)
    )
    want = _otb_by_hand(rewards, lengths, old_logp.tolist(), spp.tolist(), [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_allclose(got.numpy(), np.array(want), atol=1e-6)
    assert got[1, 2:].tolist() == [1.0, 1.0]  # the unique longest response past the second longest: A = G = 1
    with pytest.raises(ValueError, match="otb needs"):
        _advantages(ESTIMATORS["otb"], torch.tensor(rewards), mask, index, np.array(["add"] * 6), np.arange(6))


def test_sum_pi_squared_is_the_policys_collision_probability():
    """The sum of squared next-token probabilities from verl's logsumexp form equals softmax(logits)**2 summed,
    and lies in [1/V, 1]."""
    from ebpo_verl.study.rl import sum_pi_squared
    from ebpo_verl.study.tasks import VOCAB_SIZE

    torch.manual_seed(0)
    model = TinyPolicy()
    splits = make_splits({"heldout": 8, "train": 8, "sft": 8}, seed=0, topics=("add",))
    prompts, targets = splits["train"].prompts, splits["train"].targets
    got = sum_pi_squared(model, prompts, targets)
    with torch.no_grad():
        probs = torch.softmax(model.response_logits(prompts, targets).double(), dim=-1)
    assert got.shape == targets.shape
    assert torch.allclose(got.double(), (probs**2).sum(-1), atol=1e-6)
    assert (got >= 1 / VOCAB_SIZE - 1e-6).all() and (got <= 1 + 1e-6).all()


def test_otb_trains_through_run_rl(one_thread):
    """A short otb run: finite metrics, and no zero-signal group where the rewards differ within the group."""
    torch.manual_seed(0)
    model = TinyPolicy()
    splits = make_splits({"heldout": 16, "train": 64, "sft": 8}, seed=0, topics=("add",))
    train, held = splits["train"], splits["heldout"]
    base_pass = exact_pass_at_1(model, train).numpy()
    cfg = RLConfig("otb", 4, seed=0, steps=2, responses_per_step=32, eval_every=2)
    out = run_rl(model, train, held, base_pass, cfg)
    assert all(np.isfinite(out[k]).all() for k in ("grad_norm", "entropy", "accuracy", "zero_signal"))
    assert (out["zero_signal"] <= out["uniform_groups"] + 1e-9).all()


# ---------------------------------------------------------------- resume, refusal, summary


def _without(text: str, prefix: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith(prefix))


@pytest.mark.slow
def test_interrupted_study_resumes(tiny_study, tmp_path, monkeypatch):
    """An interrupted study (some runs saved, a torn temp file, no report yet) rerun with the same command runs
    only the missing runs, reuses the saved warm start, and ends with the uninterrupted run's report."""
    import shutil

    from ebpo_verl.study import runner
    from ebpo_verl.study.__main__ import main

    out = tmp_path / "study"
    shutil.copytree(tiny_study, out)
    for name in ("study.md", "runs.json", "summary.json", *(p.name for p in out.glob("*.png"))):
        (out / name).unlink()
    lost = sorted(p.name for p in (out / "runs").glob("*-s1.json"))  # the runs of seed 1 had not finished
    assert len(lost) == TINY.n_runs() // 2
    for name in lost:
        (out / "runs" / name).unlink()
    (out / "runs" / "grpo-g4-random-s1.json.tmp").write_text('{"config": {"estim')  # killed mid-write
    computed = []
    real_run_one = runner._run_one

    def counting(cfg):
        computed.append(runner.run_path(out, cfg).name)
        return real_run_one(cfg)

    def no_warm_start(*args, **kwargs):
        raise AssertionError("the saved warm start should have been reused")

    monkeypatch.setattr(runner, "_run_one", counting)
    monkeypatch.setattr(runner, "warm_start", no_warm_start)
    before = torch.get_num_threads()
    try:
        assert main(["--preset", "tiny", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(before)
    assert sorted(computed) == lost
    want, got = (json.loads((d / "runs.json").read_text()) for d in (tiny_study, out))
    assert got["base"] == want["base"]
    assert [(r["config"], r["metrics"]) for r in got["runs"]] == [(r["config"], r["metrics"]) for r in want["runs"]]

    # the report is the uninterrupted one's, except for the command and its timings (wall and CPU seconds: the
    # CPU time of the rerun runs is measured anew) and the source lines under the tables (they name the start time)
    def report(folder: Path) -> str:
        text = _without(_without((folder / "study.md").read_text(), "Command:"), "*Source:")
        return re.sub(r"^\(\d+ CPU-seconds for the warm start and the runs\)", "(CPU-seconds)", text, flags=re.M)

    assert report(out) == report(tiny_study)
    assert report(out) != _without(_without((out / "study.md").read_text(), "Command:"), "*Source:")  # it matched
    timing = ("command", "wall_seconds", "cpu_seconds", "resumed_runs", "provenance")
    want, got = (json.loads((d / "summary.json").read_text()) for d in (tiny_study, out))
    assert {k: v for k, v in got.items() if k not in timing} == {k: v for k, v in want.items() if k not in timing}
    assert got["resumed_runs"] == TINY.n_runs() - len(lost) and want["resumed_runs"] == 0


@pytest.mark.slow
def test_report_command_rewrites_the_report_from_saved_runs(tiny_study, tmp_path, monkeypatch):
    """``report --study DIR --out DIR2`` trains nothing and writes nothing into DIR; it writes the study's own
    summary.json (the same numbers, wall time and provenance, as the study recorded them), figures and report
    (plus one paragraph naming where they come from). Without the study's summary.json, the wall time is the span
    of its files: study_config.json to the last saved run."""
    import shutil

    from ebpo_verl.study import runner
    from ebpo_verl.study.__main__ import main

    def no_training(*args, **kwargs):
        raise AssertionError("the report trains nothing")

    monkeypatch.setattr(runner, "warm_start", no_training)
    monkeypatch.setattr(runner, "run_rl", no_training)
    before = {p: p.stat().st_mtime_ns for p in tiny_study.rglob("*")}
    out = tmp_path / "report"
    threads = torch.get_num_threads()
    try:
        assert main(["report", "--study", str(tiny_study), "--out", str(out)]) == 0
        assert {p: p.stat().st_mtime_ns for p in tiny_study.rglob("*")} == before
        want, got = (json.loads((d / "summary.json").read_text()) for d in (tiny_study, out))
        assert got == want and got["wall_seconds"] > 0
        text = (out / "study.md").read_text()
        origin = re.compile(r"\nThis report was written by `python -m ebpo_verl\.study report --study [^\n]*\n")
        assert len(origin.findall(text)) == 1 and "the same code" in text and "the wall time is the one" in text
        assert origin.sub("", text) == (tiny_study / "study.md").read_text()
        assert {p.name for p in out.glob("*.png")} == {p.name for p in tiny_study.glob("*.png")}

        copy = tmp_path / "copy"
        shutil.copytree(tiny_study, copy)  # file times kept
        (copy / "summary.json").unlink()
        assert main(["report", "--study", str(copy), "--out", str(tmp_path / "again")]) == 0
    finally:
        torch.set_num_threads(threads)
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    span = max(p.stat().st_mtime for p in (copy / "runs").iterdir()) - (copy / "study_config.json").stat().st_mtime
    assert again["wall_seconds"] == pytest.approx(span, abs=0.06) and again["cells"] == want["cells"]
    assert "measured from its files" in (tmp_path / "again" / "study.md").read_text()


def test_the_report_prints_the_wall_time_summary_json_keeps(tiny_study, tmp_path, monkeypatch):
    """A wall time of 35.46 s is kept as 35.5 in summary.json; study.md prints that value (36 s), so a report
    rewritten later from summary.json prints the same seconds (study.md said 35 s and the rewrite 36 s)."""
    from ebpo_verl.study import saved
    from ebpo_verl.study.__main__ import main

    measured = saved.study_timing

    def timing(*args, **kwargs):
        return dataclasses.replace(measured(*args, **kwargs), seconds=35.46)

    monkeypatch.setattr(saved, "study_timing", timing)
    threads = torch.get_num_threads()
    try:
        assert main(["report", "--study", str(tiny_study), "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert json.loads((tmp_path / "summary.json").read_text())["wall_seconds"] == 35.5
    assert re.findall(r"RL runs[^,]*, (\d+) s wall time", (tmp_path / "study.md").read_text()) == ["36"]


@pytest.mark.slow
def test_other_preset_in_same_dir_is_refused(tiny_study, capsys):
    from ebpo_verl.study.__main__ import main

    config = (tiny_study / "study_config.json").read_text()
    assert main(["--preset", "quick", "--out", str(tiny_study)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m ebpo_verl.study: error: ") and len(err.splitlines()) == 1
    assert "holds a study of preset 'tiny'" in err and "--out" in err
    assert (tiny_study / "study_config.json").read_text() == config


def test_help_lists_presets_with_sizes(capsys):
    from ebpo_verl.study.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    # quick: 4 estimators x 3 G = 12 cells x 4 seeds; tune: 4 estimators x 4 rates x G=4 x 3 seeds
    assert "quick: 4 estimators x G in [2, 4, 8], 4 seeds, 120 steps -> 48 runs, " in text
    assert "tune: 4 estimators x G in [], 3 seeds, 120 steps (+ lr grid x G in [4] x 3 seeds) -> 48 runs" in text
    assert "tiny: 2 estimators x G in [4, 8], 2 seeds, 8 steps -> 10 runs" in text
    # full: 8 estimators x 4 G x 5 seeds + 8 x 4 rates x G=4 x 2 seeds
    assert f"-> {8 * 4 * 5 + 8 * 4 * 2} runs" in text


@pytest.mark.slow
def test_summary_matches_runs_and_report(tiny_study):
    """summary.json (what the README is generated from) holds the report's numbers, recomputed here from the
    per-run accuracies: mean and half-width of the 95% t-interval over seeds."""
    from ebpo_verl.study.readme_tables import render

    summary = json.loads((tiny_study / "summary.json").read_text())
    runs = json.loads((tiny_study / "runs.json").read_text())["runs"]
    for cell in summary["cells"]:
        key = (cell["estimator"], cell["group_size"], cell["order"])
        finals = [
            r["metrics"]["accuracy"][-1]
            for r in runs
            if (r["config"]["estimator"], r["config"]["group_size"], r["config"]["order"]) == key
        ]
        n = len(finals)
        half = sps.t.ppf(0.975, n - 1) * np.std(finals, ddof=1) / np.sqrt(n)
        assert cell["final_accuracy"] == pytest.approx([np.mean(finals), half, n], abs=1e-6)
    assert summary["warm_start_heldout_accuracy"] == pytest.approx(
        json.loads((tiny_study / "runs.json").read_text())["base"]["heldout_accuracy"], abs=1e-6
    )
    # every cell carries its runs' learning rate; paired differences recomputed from the per-run finals
    final = {(r["config"]["estimator"], r["config"]["group_size"], r["config"]["order"], r["config"]["seed"]):
             r["metrics"]["accuracy"][-1] for r in runs}  # fmt: skip
    for cell in summary["cells"]:
        assert cell["lr"] == TINY.lr[cell["estimator"]]
    pairs = [(p["baseline"], p["group_size"]) for p in summary["paired"]]
    assert pairs == [("grpo", g) for g in TINY.group_sizes]
    for p in summary["paired"]:
        diff = [final["ebpo", p["group_size"], "random", s] - final["grpo", p["group_size"], "random", s]
                for s in range(TINY.seeds)]  # fmt: skip
        half = sps.t.ppf(0.975, len(diff) - 1) * np.std(diff, ddof=1) / np.sqrt(len(diff))
        assert p["diff"] == pytest.approx([np.mean(diff), half, TINY.seeds], abs=1e-6)
        assert p["wins"] == sum(d > 0 for d in diff)
    _check_coverage(summary, runs, json.loads((tiny_study / "runs.json").read_text())["base"])
    block = render(summary)
    report = _md_table((tiny_study / "study.md").read_text(), "## Final held-out accuracy")
    readme = _md_table(block, "Final held-out exact pass@1")
    assert [r[1:] for r in readme] == [r[1:] for r in report]
    assert [r[0] for r in readme[1:]] == [f"{e} ({TINY.lr[e]:g})" for e in TINY.estimators]
    assert _md_table(block, "Paired difference") == _md_table((tiny_study / "study.md").read_text(), "## Paired")


def _check_coverage(summary: dict, runs: list[dict], base: dict) -> None:
    """Every cell's pass@8 and pass@64, the warm start's pass@k and the paired EBPO - GRPO at each k, recomputed
    from the per-prompt probabilities with numpy (pass@1's pairs are ``paired``'s)."""

    def cover(probs, k):
        return float(np.mean(1 - (1 - np.asarray(probs)) ** k))

    at = {(r["config"]["estimator"], r["config"]["group_size"], r["config"]["order"], r["config"]["seed"]): r
          for r in runs}  # fmt: skip
    for cell in summary["cells"]:
        for k in (8, 64):
            vals = [cover(r["metrics"]["heldout_pass_final"], k) for key, r in at.items()
                    if key[:3] == (cell["estimator"], cell["group_size"], cell["order"])]  # fmt: skip
            half = sps.t.ppf(0.975, len(vals) - 1) * np.std(vals, ddof=1) / np.sqrt(len(vals))
            assert cell[f"pass_at_{k}"] == pytest.approx([np.mean(vals), half, len(vals)], abs=1e-6)
            assert cell[f"pass_at_{k}"][0] >= cell["final_accuracy"][0] - 1e-6
    warm = summary["warm_start_heldout_pass_at_k"]
    assert warm == pytest.approx({"1": base["heldout_accuracy"], "8": cover(base["heldout_pass"], 8),
                                  "64": cover(base["heldout_pass"], 64)}, abs=1e-6)  # fmt: skip
    assert summary["paired_pass_at_k"]["1"] == summary["paired"]
    for k in (8, 64):
        for p in summary["paired_pass_at_k"][str(k)]:
            g = p["group_size"]
            diff = [cover(at["ebpo", g, "random", s]["metrics"]["heldout_pass_final"], k)
                    - cover(at[p["baseline"], g, "random", s]["metrics"]["heldout_pass_final"], k)
                    for s in range(summary["seeds"])]  # fmt: skip
            half = sps.t.ppf(0.975, len(diff) - 1) * np.std(diff, ddof=1) / np.sqrt(len(diff))
            assert p["diff"] == pytest.approx([np.mean(diff), half, len(diff)], abs=1e-6)
            assert p["wins"] == sum(d > 0 for d in diff)


@pytest.mark.slow
def test_tiny_summary_and_report_carry_provenance(tiny_study):
    """summary.json holds a complete provenance record (this checkout's commit, the runs' seeds); study.md
    prints the preset, commit and hardware under every table."""
    from ebpo_verl.ops.provenance import KEYS, check, describe_hardware, short_commit

    record = check(json.loads((tiny_study / "summary.json").read_text())["provenance"], "summary.json")
    assert list(record) == list(KEYS)
    assert record["seed"] == {"runs": list(range(TINY.seeds)), "warm_start": 0}
    assert record["command"].startswith("python -m ebpo_verl.study --preset tiny")
    text = (tiny_study / "study.md").read_text()
    source = f"*Source: preset tiny; ebpo-verl commit {short_commit(record)}; {describe_hardware(record)};"
    tables = sum(
        1
        for a, b in zip(text.splitlines(), text.splitlines()[1:] + [""], strict=True)
        if a.startswith("|") and not b.startswith("|")
    )
    assert tables >= 5 and text.count(source) == tables


def test_figure_styles_tell_estimators_apart():
    """Every estimator has its own colour and marker; ebpo and ebpo_batch differ in colour, marker and line style."""
    from ebpo_verl.study.report import LEGEND_PT, STYLES, _style
    from ebpo_verl.study.rl import ESTIMATORS

    assert set(STYLES) <= set(ESTIMATORS) and LEGEND_PT >= 9
    assert len({c for c, _, _ in STYLES.values()}) == len(STYLES) == len({m for _, m, _ in STYLES.values()})
    styles = {e: _style(e, 0) for e in ESTIMATORS}  # the named ones and the default of an estimator added since
    assert len({s["color"] for s in styles.values()}) == len(styles)
    a, b = _style("ebpo", 2), _style("ebpo_batch", 3)
    assert a["color"] != b["color"] and a["marker"] != b["marker"] and a["ls"] != b["ls"]


@pytest.mark.slow
def test_spo_frac_seen_counts_recurring_prompts(tiny_study, one_thread):
    """spo runs log the share of each step's prompts that the tracker saw at an earlier step, recomputed here
    from the stream: 0 at every step while a run covers less than one epoch, > 0 once prompts recur."""
    from ebpo_verl.study.rl import order_stream

    base = _tiny_base(tiny_study)
    splits = make_splits(TINY.split_sizes, seed=0, topics=TINY.topics, levels=TINY.levels)
    for n_train in (len(splits["train"]), 12):  # the whole split (< 1 epoch) and 12 prompts (recurring)
        train = splits["train"].subset(np.arange(n_train))
        train_pass = exact_pass_at_1(base, train).numpy()
        cfg = RLConfig("spo", 8, seed=0, steps=4, responses_per_step=64, eval_every=4)
        got = run_rl(base, train, splits["heldout"], train_pass, cfg)["spo_frac_seen"]
        stream, p = order_stream(train, cfg, train_pass), cfg.prompts_per_step
        want = []
        for step in range(cfg.steps):
            batch = set(stream[step * p : (step + 1) * p].tolist())
            want.append(len(batch & set(stream[: step * p].tolist())) / len(batch))
        np.testing.assert_allclose(got, want, atol=0)
        assert (max(want) == 0) == (n_train > cfg.steps * p)


def test_spo_note_states_the_caveat_where_no_prompt_recurs():
    from ebpo_verl.study.writeup import spo_note

    by_cell = {("spo", 2, "random"): [{"spo_frac_seen": 0.25}, {"spo_frac_seen": 0.35}], ("spo", 8, "random"): [
        {"spo_frac_seen": 0.0}, {"spo_frac_seen": 0.0}]}  # fmt: skip
    text = spo_note(by_cell, ["grpo", "spo"], [2, 8])
    assert "G=2 30%, G=8 0%" in text and "At G = 8 a run covers less than one epoch" in text
    assert "EVERY SPO baseline stays 0.5" in text and spo_note(by_cell, ["grpo"], [2, 8]) == ""


@pytest.mark.slow
def test_study_config_records_the_code_and_refuses_other_code(tiny_study, tmp_path, capsys):
    """study_config.json holds the version and a hash of the sources that decide the numbers (recomputed here);
    a rerun with other code is refused instead of reusing the old run files."""
    import hashlib
    from pathlib import Path

    import ebpo_verl
    from ebpo_verl.study.__main__ import main

    root = Path(ebpo_verl.__file__).parent
    files = sorted([*root.glob("algos/*.py"), root / "trainer" / "adapter.py", *root.glob("study/*.py")])
    assert {root / "study" / "rl.py", root / "algos" / "ebpo_math.py", root / "algos" / "tracker.py"} <= set(files)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    config = json.loads((tiny_study / "study_config.json").read_text())
    assert config["code"] == {"version": ebpo_verl.__version__, "source_sha256": digest.hexdigest()}

    out = tmp_path / "old"
    out.mkdir()
    config["code"]["source_sha256"] = "0" * 64  # as if the runs were made before a code change
    (out / "study_config.json").write_text(json.dumps(config))
    assert main(["--preset", "tiny", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds runs made by other code (ebpo-verl 0.1.0, sources 000000000000" in err
    assert "pass a new --out" in err and not (out / "runs").exists()


def _without_timings(obj):
    """A results structure with its wall/CPU time fields dropped (the only fields a rerun may change)."""
    if isinstance(obj, dict):
        return {k: _without_timings(v) for k, v in obj.items() if not k.endswith("seconds")}
    if isinstance(obj, list):
        return [_without_timings(v) for v in obj]
    return obj


@pytest.mark.slow
def test_tiny_preset_rerun_is_identical(tiny_study, tmp_path):
    """The study's output is a function of the code and the machine: a second run of the whole tiny preset (warm
    start included) in a new folder gives bit-identical models and numbers. (No golden floats: these runs are
    chaotic, and another machine's kernels move them by more than their rounding, docs/study.md "Precision";
    what ties a results file to the code is the source hash in study_config.json, tested above, and the
    invariants checked in test_summary_matches_runs_and_report and test_committed_quick_summary_is_consistent.)"""
    from ebpo_verl.study.__main__ import main

    before = torch.get_num_threads()
    try:
        assert main(["--preset", "tiny", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(before)
    first, again = (torch.load(d / "base_model.pt", weights_only=True) for d in (tiny_study, tmp_path))
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    for name in ("runs.json", "summary.json"):
        want, got = (_without_timings(json.loads((d / name).read_text())) for d in (tiny_study, tmp_path))
        want.pop("command", None), got.pop("command", None)
        want.pop("provenance", None), got.pop("provenance", None)  # the start time and command differ
        assert got == want, name
    for saved in sorted((tiny_study / "runs").iterdir()):
        assert _without_timings(json.loads((tmp_path / "runs" / saved.name).read_text())) == _without_timings(
            json.loads(saved.read_text())
        ), saved.name


def test_committed_quick_summary_is_consistent():
    """docs/study_quick.json (what the README reports) satisfies relations computed independently of the code
    that wrote it: one cell per estimator x G (and order), each over every seed, gain = final accuracy - the
    warm start (same seeds, so the same interval half-width), zero-signal shares in [0, 1]."""
    from pathlib import Path

    summary = json.loads((Path(__file__).resolve().parents[1] / "docs" / "study_quick.json").read_text())
    cells = summary["cells"]
    assert summary["n_runs"] == len(cells) * summary["seeds"]
    keys = {(c["estimator"], c["group_size"], c["order"]) for c in cells}
    assert len(keys) == len(cells)
    assert {(e, g) for e, g, _ in keys} >= {(e, g) for e in summary["estimators"] for g in summary["group_sizes"]}
    warm = summary["warm_start_heldout_accuracy"]
    for c in cells:
        (final, half, n), (gain, gain_half, gain_n) = c["final_accuracy"], c["gain"]
        assert n == gain_n == summary["seeds"], c
        assert gain == pytest.approx(final - warm, abs=2e-6) and gain_half == pytest.approx(half, abs=2e-6), c
        assert 0.0 <= final <= 1.0 and half >= 0.0
        assert 0.0 <= c["zero_signal"][0] <= 1.0
        assert c["lr"] == summary["lr_grid"][c["estimator"]]["chosen"]
        assert c["clipped"][0] < 0.5, c  # the clip binds in fewer than half of the updates in every cell
    # the acceptance, at the measured cross-machine precision: GRPO gains about +0.1 at G=8 (+0.107 and
    # +0.093 on two 2-core AMD EPYC machines, docs/study.md "Precision"); EBPO - GRPO paired at every G
    assert next(c for c in cells if (c["estimator"], c["group_size"]) == ("grpo", 8))["gain"][0] >= 0.09
    pairs = {(p["baseline"], p["group_size"]): p for p in summary["paired"]}
    assert {("grpo", g) for g in summary["group_sizes"]} <= set(pairs)
    for p in summary["paired"]:
        assert p["estimator"] == "ebpo" and p["diff"][2] == summary["seeds"] and 0 <= p["wins"] <= summary["seeds"]
        # the mean of paired differences is the difference of the two cells' means (same seeds)
        mean = {c["estimator"]: c["final_accuracy"][0] for c in cells if c["group_size"] == p["group_size"]}
        assert p["diff"][0] == pytest.approx(mean["ebpo"] - mean[p["baseline"]], abs=2e-6)
    assert all(len(g["values"]) >= 3 for g in summary["lr_grid"].values())


def _fake_run(est: str, g: int, seed: int, final: float, lr: float = 3e-4, split: str = "test") -> dict:
    config = {"estimator": est, "group_size": g, "order": "random", "seed": seed, "lr": lr, "split": split}
    return {"config": config, "metrics": {"accuracy": [0.3, final]}}


def test_paired_differences_by_hand():
    """EBPO - X per G over the seeds both ran: mean, t half-width and wins, written out by hand."""
    from ebpo_verl.study.report import paired

    runs = [_fake_run("ebpo", 2, s, f) for s, f in enumerate([0.50, 0.40, 0.45])]
    runs += [_fake_run("grpo", 2, s, f) for s, f in enumerate([0.40, 0.42, 0.40])]
    runs += [_fake_run("otb", 2, s, f) for s, f in enumerate([0.30, 0.30])]  # seed 2 missing: 2 pairs
    out = paired(runs, ["grpo", "ebpo", "otb"], [2])
    d = [0.10, -0.02, 0.05]
    sd = (sum((x - 0.13 / 3) ** 2 for x in d) / 2) ** 0.5
    assert out[0]["baseline"] == "grpo" and out[0]["wins"] == 2
    assert out[0]["diff"] == pytest.approx([0.13 / 3, 4.302653 * sd / 3**0.5, 3], abs=1e-5)
    assert out[1]["baseline"] == "otb" and out[1]["wins"] == 2
    assert out[1]["diff"] == pytest.approx([0.15, 12.706205 * 0.05, 2], abs=1e-5)  # sd 0.05 * sqrt(2), n = 2
    assert paired(runs, ["grpo", "otb"], [2]) == []


def test_pass_at_k_by_hand():
    """pass@k = mean over prompts of 1 - (1 - p)^k, by hand for p = 0, 1 and 0.5 at k = 1, 8, 64."""
    from ebpo_verl.study.report import pass_at_k, run_pass_at_k

    for k in (1, 8, 64):
        assert pass_at_k([0.0], k) == 0.0 and pass_at_k([1.0], k) == 1.0
    assert pass_at_k([0.5], 1) == 0.5
    assert pass_at_k([0.5], 8) == 255 / 256
    assert pass_at_k([0.5], 64) == pytest.approx(1 - 2.0**-64, abs=0)  # rounds to 1.0 in float64
    assert pass_at_k([0.0, 1.0, 0.5], 8) == pytest.approx((0 + 1 + 255 / 256) / 3, abs=1e-15)
    assert pass_at_k([0.0, 1.0, 0.5], 1) == pytest.approx(0.5, abs=1e-15)
    assert pass_at_k([0.1, 0.2], 8) == pytest.approx(1 - (0.9**8 + 0.8**8) / 2, abs=1e-15)
    run = {"metrics": {"accuracy": [0.2, 0.3], "heldout_pass_final": [0.1, 0.5]}}
    assert run_pass_at_k(run, 1) == 0.3  # the evaluation's own pass@1, not a recomputation
    assert run_pass_at_k(run, 8) == pytest.approx(1 - (0.9**8 + 0.5**8) / 2, abs=1e-15)
    assert math.isnan(run_pass_at_k({"metrics": {"accuracy": [0.3]}}, 8))  # a run saved without the probabilities


def test_paired_pass_at_k_by_hand():
    """EBPO - X in pass@8, paired by seed: each run's pass@8 and the t-interval written out by hand."""
    from ebpo_verl.study.report import paired

    def run(est, seed, probs):
        config = {"estimator": est, "group_size": 4, "order": "random", "seed": seed, "lr": 3e-4, "split": "test"}
        return {"config": config, "metrics": {"accuracy": [0.3, sum(probs) / 2], "heldout_pass_final": probs}}

    ebpo = [[0.5, 0.0], [0.25, 1.0], [0.1, 0.1]]
    grpo = [[0.5, 0.5], [0.0, 1.0], [0.2, 0.0]]
    runs = [run("ebpo", s, p) for s, p in enumerate(ebpo)] + [run("grpo", s, p) for s, p in enumerate(grpo)]
    d = [
        (1 - 0.5**8) / 2 - (1 - 0.5**8),  # seed 0: (255/256 + 0) / 2 - (255/256 + 255/256) / 2
        (1 - 0.75**8) / 2,  # seed 1: the second prompts cancel, grpo's first has p = 0
        (1 - 0.9**8) - (1 - 0.8**8) / 2,  # seed 2
    ]
    mean = sum(d) / 3
    sd = (sum((x - mean) ** 2 for x in d) / 2) ** 0.5
    (out,) = paired(runs, ["grpo", "ebpo"], [4], k=8)
    assert out["diff"] == pytest.approx([mean, 4.302653 * sd / 3**0.5, 3], abs=1e-6)
    assert out["wins"] == 2 and d[0] < 0 < d[1] and d[2] > 0


def test_learning_rate_choice_by_hand():
    """The rate with the highest mean score over its runs, a run's score being its mean validation accuracy after
    step 0 (here one evaluation, so the final one); the smaller rate on a tie."""
    from ebpo_verl.study.runner import choose_lrs

    runs = [
        _fake_run("grpo", 4, s, f, lr, "validation")
        for lr, fs in [(1e-4, [0.40, 0.42]), (3e-4, [0.50, 0.44]), (9e-4, [0.10, 0.80])]
        for s, f in enumerate(fs)
    ]
    runs += [_fake_run("otb", 4, 0, 0.5, lr, "validation") for lr in (2e-3, 1e-3)]  # fmt: skip
    got = choose_lrs(runs)
    assert got["grpo"]["values"] == [1e-4, 3e-4, 9e-4] and got["grpo"]["chosen"] == 3e-4
    assert got["grpo"]["validation"][0] == pytest.approx([0.41, 12.706205 * 0.01, 2], abs=1e-5)
    assert got["otb"]["chosen"] == 1e-3
    # a curve, not its end: 0.5 reached at once beats 0.2 then 0.6 (mean 0.5 > 0.4), whatever the last point
    curves = {1e-4: [0.3, 0.5, 0.5, 0.5], 2e-4: [0.3, 0.2, 0.4, 0.6]}
    runs = [{"config": {"estimator": "ebpo", "lr": lr}, "metrics": {"accuracy": a}} for lr, a in curves.items()]
    got = choose_lrs(runs)["ebpo"]
    assert got["chosen"] == 1e-4 and [v[0] for v in got["validation"]] == pytest.approx([0.5, 0.4])


def test_quick_preset_uses_the_committed_tuning_choice():
    """The quick preset's learning rates are the ones the committed tuning run chose on the validation split,
    with a grid of at least 3 rates per estimator; the full preset tunes its own."""
    from ebpo_verl.study.presets import LR_TUNING_FILE

    record = json.loads(LR_TUNING_FILE.read_text())
    assert record["split"] == "validation" and record["provenance"]["command"].startswith("python -m ebpo_verl.study")
    quick = PRESETS["quick"]
    assert quick.lr == {e: record["lr_grid"][e]["chosen"] for e in quick.estimators}
    for g in record["lr_grid"].values():
        assert len(g["values"]) >= 3 and g["chosen"] in g["values"]
        best = max(range(len(g["values"])), key=lambda i: g["validation"][i][0])
        assert g["values"][best] == g["chosen"]
    full = PRESETS["full"]
    assert full.tune and all(len(full.lr_grid[e]) >= 3 for e in full.estimators)
    assert {"grpo", "grpo_bn", "ebpo", "ebpo_batch", "otb", "rloo", "spo", "dbb"} == set(full.estimators)


FULL_RUN = Path(__file__).resolve().parents[1] / "docs" / "study_full"


def test_the_committed_full_run_is_its_runs():
    """docs/study_full (the full preset's committed run): every cell's final accuracy and every paired difference
    of summary.json recomputed here from the per-run files under runs/ (t-intervals by hand), the learning rates
    re-chosen from its tuning runs' curves (mean validation accuracy after step 0), and the run complete."""
    summary = json.loads((FULL_RUN / "summary.json").read_text())
    full = PRESETS["full"]
    assert summary["preset"] == "full" and summary["resumed_runs"] == 0
    runs = [json.loads(p.read_text()) for p in sorted((FULL_RUN / "runs").glob("*.json"))]
    test = [r for r in runs if r["config"]["split"] == "test"]
    tuning = [r for r in runs if r["config"]["split"] == "validation"]
    assert len(test) == len(full.cells()) * full.seeds
    assert len(tuning) == len(full.estimators) * len(full.tune["group_sizes"]) * len(LR_GRID) * full.tune["seeds"]

    def t_interval(x: list[float]) -> list[float]:
        n = len(x)
        return [float(np.mean(x)), sps.t.ppf(0.975, n - 1) * float(np.std(x, ddof=1)) / np.sqrt(n), n]

    final = {(r["config"]["estimator"], r["config"]["group_size"], r["config"]["seed"]): r["metrics"]["accuracy"][-1]
             for r in test}  # fmt: skip
    for cell in summary["cells"]:
        e, g = cell["estimator"], cell["group_size"]
        want = t_interval([final[e, g, s] for s in range(full.seeds)])
        assert cell["final_accuracy"] == pytest.approx(want, abs=1e-6)
    for pair in summary["paired"]:
        e, x, g = pair["estimator"], pair["baseline"], pair["group_size"]
        d = [final[e, g, s] - final[x, g, s] for s in range(full.seeds)]
        assert pair["diff"] == pytest.approx(t_interval(d), abs=1e-6)
        assert pair["wins"] == sum(v > 0 for v in d)
    for e, grid in summary["lr_grid"].items():
        curves = [(r["config"]["lr"], r["metrics"]["accuracy"]) for r in tuning if r["config"]["estimator"] == e]
        score = {lr: np.mean([np.mean(a[1:]) for v, a in curves if v == lr]) for lr in grid["values"]}
        assert grid["chosen"] == max(score, key=lambda lr: (score[lr], -lr))
        assert {c["lr"] for c in summary["cells"] if c["estimator"] == e} == {grid["chosen"]}
