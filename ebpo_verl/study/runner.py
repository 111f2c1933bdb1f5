"""Run a preset's grid: one warm-started base model, then every (estimator, G, order, seed) RL run. Runs are
deterministic for their seed (one torch thread, seeded generators, fresh estimator state), so they spread over
``preset.workers`` forked processes; each is saved when it ends, so a rerun resumes (``run_grid``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ebpo_verl.ops.atomic import atomic_write, atomic_write_text
from ebpo_verl.ops.errors import OneLineMessage, shorten
from ebpo_verl.study.policy import TinyPolicy, exact_pass_at_1
from ebpo_verl.study.presets import BASE_SEED, LR_TUNING_FILE, Preset, tuned_lrs
from ebpo_verl.study.rl import STEP_KEYS, RLConfig, run_rl, warm_start
from ebpo_verl.study.tasks import ProblemSet, make_splits

PROBE_SIZE = 256


@dataclass
class Base:
    """The warm-started model and the data every run shares."""

    model: TinyPolicy
    train: ProblemSet
    heldout: ProblemSet  # the test split
    val: ProblemSet  # the validation split (learning-rate choice)
    probe: ProblemSet
    train_pass: np.ndarray  # (len(train),) exact pass@1 of the base model, for the difficulty order
    heldout_pass: np.ndarray
    sft_seconds: float
    sft_cpu_seconds: float


def prepare_base(preset: Preset, out: Path, warm_seed: int = BASE_SEED, train: bool = True) -> Base:
    """Splits and the warm start (``preset.sft_steps``), loaded from or saved to ``out/base_model.pt``. The splits
    and the probe set come from :data:`BASE_SEED`; the initialisation and the SFT from ``warm_seed``. ``train=False``
    (a report): :class:`NotSavedYet` where none is saved."""
    splits = make_splits(preset.split_sizes, seed=BASE_SEED, topics=preset.topics, levels=preset.levels)
    torch.manual_seed(warm_seed)
    model = TinyPolicy(preset.policy)
    saved = None
    if (out / "base_model.pt").is_file():
        with contextlib.suppress(OSError, ValueError):  # no usable record: trained again
            saved = json.loads((out / "base.json").read_text())
    if saved is None and not train:
        raise NotSavedYet(f"{out} has no saved warm start (base_model.pt) yet")
    if saved is not None:
        model.load_state_dict(torch.load(out / "base_model.pt", weights_only=True))  # tensors only, no code
        sft_seconds, sft_cpu = saved["sft_seconds"], saved["sft_cpu_seconds"]
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        warm_start(model, splits["sft"], preset.sft_steps, seed=warm_seed, misconception=preset.misconception)
        sft_seconds, sft_cpu = time.perf_counter() - t0, time.process_time() - c0
    train, heldout = splits["train"], splits["heldout"]
    probe = train.subset(np.random.default_rng(BASE_SEED).permutation(len(train))[:PROBE_SIZE])
    base = Base(model, train, heldout, splits["val"], probe, exact_pass_at_1(model, train).numpy(),
                exact_pass_at_1(model, heldout).numpy(), sft_seconds, sft_cpu)  # fmt: skip
    if saved is None:
        atomic_write(out / "base_model.pt", lambda tmp: torch.save(model.state_dict(), tmp))
        write_json(out / "base.json", {"sft_seconds": sft_seconds, "sft_cpu_seconds": sft_cpu})
    return base


def grid(preset: Preset, lrs: dict[str, float]) -> list[RLConfig]:
    """Every run of the preset's tables (test split), in table order, each estimator at its rate in ``lrs``."""
    return [
        RLConfig(estimator=e, group_size=g, order=o, seed=s, lr=lrs[e], **preset.rl)
        for e, g, o in preset.cells()
        for s in range(preset.seeds)
    ]


def tuning_score(run: dict) -> float:
    """A tuning run's score: its mean validation accuracy after step 0 (area under the learning curve)."""
    return float(np.mean(run["metrics"]["accuracy"][1:]))


def rate_choice(scores: dict[float, list[float]]) -> dict:
    """From {rate: scores}: the rates tried (sorted), each one's [mean, half-width, n] and the best rate (highest
    mean, the smaller on a tie)."""
    from ebpo_verl.study.report import ci_record

    rates = sorted(scores)
    return {
        "values": rates,
        "validation": [ci_record(scores[v]) for v in rates],
        "chosen": max(rates, key=lambda v: (float(np.mean(scores[v])), -v)),
    }


def choose_lrs(runs: list[dict]) -> dict[str, dict]:
    """Per estimator, the :func:`rate_choice` of its tuning runs' :func:`tuning_score`."""
    by: dict[str, dict[float, list[float]]] = {}
    for run in runs:
        c = run["config"]
        by.setdefault(c["estimator"], {}).setdefault(c["lr"], []).append(tuning_score(run))
    return {est: rate_choice(scores) for est, scores in sorted(by.items())}


def lr_grid_of(preset: Preset, tuning: list[dict]) -> dict[str, dict]:
    """Each estimator's rates, scores, choice and ``source``: this run's tuning (:func:`choose_lrs`), else the
    preset's fixed rates, with the committed tuning grid (:data:`~ebpo_verl.study.presets.LR_TUNING_FILE`) when
    they are its choice."""
    from ebpo_verl.ops.provenance import short_commit

    if preset.tune:
        return {e: {**v, "source": "this run (validation split)"} for e, v in choose_lrs(tuning).items()}
    lrs = preset.lr
    if any(tuned_lrs().get(e) != lr for e, lr in lrs.items()):
        fixed = {"validation": [[None, None, 0]], "source": "fixed by the preset, not tuned"}
        return {e: {"values": [lr], "chosen": lr, **fixed} for e, lr in lrs.items()}
    record = json.loads(LR_TUNING_FILE.read_text())
    prov = record["provenance"]
    source = (
        f"ebpo_verl/study/{LR_TUNING_FILE.name}: preset {record['preset']} (validation split, G in "
        f"{record['tune']['group_sizes']}, {record['tune']['seeds']} seeds), commit {short_commit(prov)}, "
        f"started {prov.get('started')}"
    )
    return {e: {**record["lr_grid"][e], "source": source} for e in lrs}


class StudyDirError(OneLineMessage, ValueError):
    """The output directory holds a study with a different configuration."""


class NotSavedYet(LookupError):
    """A report without training reached a warm start or runs the study has not saved yet."""


RESULT_SOURCES = ("algos/*.py", "trainer/adapter.py", "study/*.py")
"""The package's source files (relative to ``ebpo_verl/``) that decide a study's numbers."""


def code_fingerprint() -> dict[str, str]:
    """The package version and a SHA-256 over the :data:`RESULT_SOURCES` (path and bytes of each, sorted)."""
    import ebpo_verl

    root = Path(ebpo_verl.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for pattern in RESULT_SOURCES for p in root.glob(pattern)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return {"version": ebpo_verl.__version__, "source_sha256": digest.hexdigest()}


def recorded_code(config: Any, path: Path) -> dict[str, str]:
    """The ``code`` (:func:`code_fingerprint`) a ``study_config.json`` records, {} when it records none (absent or
    null); StudyDirError naming ``path`` when it is not an object of strings."""
    code = config.get("code") if isinstance(config, dict) else None
    if code is None:
        return {}
    if isinstance(code, dict) and all(isinstance(v, str) for v in code.values()):
        return code
    raise StudyDirError(
        f"{path} records code {shorten(code)}, not an object of strings ({{version, source_sha256}}, as the study "
        "writes it); restore the file, or rerun the study into a new --out"
    )


def claim_out_dir(out: Path, preset: Preset) -> None:
    """Record the preset's configuration and :func:`code_fingerprint` in ``out/study_config.json``, or check they
    match (a rerun never mixes configurations or code versions)."""
    path, want = out / "study_config.json", {**preset.fingerprint(), "code": code_fingerprint()}
    if not path.exists():
        write_json(path, want)
        return
    try:
        have = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise StudyDirError(f"{path} is unreadable ({err}); delete it (and {out / 'runs'}) to start over") from err
    if not isinstance(have, dict):
        have = {}
    keys = sorted(k for k in {*have, *want} if k != "code" and have.get(k) != want.get(k))
    if keys:
        raise StudyDirError(
            f"{out} holds a study of preset {have.get('name', '?')!r} with a different configuration (differs "
            f"in: {', '.join(keys)}); rerun that preset to resume it, or pass a new --out for preset {preset.name!r}"
        )
    if have.get("code") != want["code"]:
        old = recorded_code(have, path)
        raise StudyDirError(
            f"{out} holds runs made by other code (ebpo-verl {old.get('version', '?')}, sources "
            f"{str(old.get('source_sha256', 'not recorded'))[:12]}; now {want['code']['version']}, "
            f"{want['code']['source_sha256'][:12]}): resuming would mix results of two code versions; pass a new "
            f"--out (or delete {out} to start over)"
        )


def run_path(out: Path, cfg: RLConfig) -> Path:
    tuning = f"-lr{cfg.lr:g}-{cfg.split}" if cfg.split != "test" else ""
    return out / "runs" / f"{cfg.estimator}-g{cfg.group_size}-{cfg.order}-s{cfg.seed}{tuning}.json"


RUN_METRICS = (*STEP_KEYS, "eval_step", "accuracy", "probe_accuracy", "shrinkage", "train_seen_gain",
               "train_unseen_gain", "train_seen_fraction")  # fmt: skip
"""The metrics every saved run holds (:func:`~ebpo_verl.study.rl.run_rl`'s; the report reads them)."""


def metrics_problem(metrics: Any) -> str | None:
    """What makes a saved run's ``metrics`` unreadable (None: nothing): not an object of flat lists of numbers within
    float range (NaN allowed, as a run writes it), a metric of :data:`RUN_METRICS` missing, or no accuracy."""
    if not isinstance(metrics, dict):
        return f"metrics is {shorten(metrics)}, not an object"
    if missing := [k for k in RUN_METRICS if k not in metrics]:
        return f"metrics lacks {', '.join(missing[:3])}"
    for key, values in metrics.items():
        if not (isinstance(values, list) and all(_is_float(v) for v in values)):
            return f"metrics.{shorten(key)} is {shorten(values)}, not a list of numbers"
    return None if metrics["accuracy"] and len(metrics["accuracy"]) == len(metrics["eval_step"]) else "no accuracy"


def _is_float(value: Any) -> bool:
    """A float, or an int (not a bool) that a float holds without overflow."""
    integer = isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, float) or (integer and abs(value) <= sys.float_info.max)


def load_done(out: Path, jobs: list[RLConfig]) -> dict[RLConfig, dict]:
    """The runs of ``jobs`` saved under ``out/runs``, in job order (a file with another config is not one of them;
    one whose metrics are unreadable, :func:`metrics_problem`, is run again)."""
    done = {}
    for cfg in jobs:
        path = run_path(out, cfg)
        try:
            run = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError, RecursionError) as err:  # JSON's errors, a non-UTF-8 byte: ValueErrors
            print(f"study: {path} is unreadable ({type(err).__name__}): running it again")
            continue
        if not isinstance(run, dict) or run.get("config") != asdict(cfg):
            continue
        if problem := metrics_problem(run.get("metrics")):
            print(f"study: {path} is unreadable ({problem}): running it again")
            continue
        done[cfg] = run
    return done


_BASE: Base | None = None  # set in the parent before forking; read by the workers


def _run_one(cfg: RLConfig) -> tuple[RLConfig, dict[str, list[float]], float, float]:
    assert _BASE is not None
    t0, c0 = time.perf_counter(), time.process_time()
    evaluated = _BASE.val if cfg.split == "validation" else _BASE.heldout
    out = run_rl(_BASE.model, _BASE.train, evaluated, _BASE.train_pass, cfg, probe=_BASE.probe)
    return cfg, {k: v.tolist() for k, v in out.items()}, time.perf_counter() - t0, time.process_time() - c0


def run_grid(
    preset: Preset, base: Base, out: Path, jobs: list[RLConfig], workers: int | None = None, train: bool = True
) -> tuple[list[dict], int]:
    """The runs ``jobs`` in order (config, metrics, seconds, cpu_seconds) and how many were already saved; each run
    is saved atomically when done and never rerun, so a study resumes. ``train=False`` (a report): only the saved
    ones, nothing run."""
    global _BASE
    _BASE = base
    done = load_done(out, jobs)
    if not train:
        return [done[cfg] for cfg in jobs if cfg in done], len(done)
    todo = [cfg for cfg in jobs if cfg not in done]
    if done:
        print(f"resuming: {len(done)} of {len(jobs)} runs already saved in {out / 'runs'}", flush=True)
    (out / "runs").mkdir(exist_ok=True)
    workers = max(1, min(workers or preset.workers, len(todo) or 1))
    what = "lr tuning runs" if jobs and jobs[0].split == "validation" else "RL runs"
    bar = tqdm(total=len(jobs), initial=len(done), desc=f"{what} ({preset.name}, {workers} proc)", unit="run")
    pool = (
        mp.get_context("fork").Pool(workers, initializer=torch.set_num_threads, initargs=(1,)) if workers > 1 else None
    )
    if pool is None:  # the runs in this process, one torch thread each as in the workers
        torch.set_num_threads(1)
    try:
        for cfg, metrics, seconds, cpu in pool.imap_unordered(_run_one, todo) if pool else map(_run_one, todo):
            run = done[cfg] = {"config": asdict(cfg), "metrics": metrics, "seconds": seconds, "cpu_seconds": cpu}
            write_json(run_path(out, cfg), run)
            bar.update()
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    return [done[cfg] for cfg in jobs], len(jobs) - len(todo)


def describe_base(base: Base) -> dict:
    """Facts about the warm start for the report (pass-rate spread, parameters, held-out success probabilities)."""
    p, probe, held = base.train_pass, base.probe, base.heldout
    return {
        "params": sum(p.numel() for p in base.model.parameters()),
        "sft_seconds": base.sft_seconds,
        "sft_cpu_seconds": base.sft_cpu_seconds,
        "heldout_accuracy": float(base.heldout_pass.mean()),
        "heldout_pass": base.heldout_pass.tolist(),  # per prompt: the warm start's pass@k (report.pass_at_k)
        "probe_accuracy": float(exact_pass_at_1(base.model, probe).mean()),
        "train_accuracy": float(p.mean()),
        "frac_train_below_0.05": float((p < 0.05).mean()),
        "frac_train_above_0.95": float((p > 0.95).mean()),
        "pass_rate_histogram": np.histogram(p, bins=np.linspace(0, 1, 11))[0].tolist(),
        "heldout_by_cell": {
            f"{t}/{lv}": float(base.heldout_pass[(held.topic == t) & (held.level == lv)].mean())
            for t in np.unique(held.topic)
            for lv in np.unique(held.level)
        },  # fmt: skip
        **{f"n_{split}": len(getattr(base, split)) for split in ("train", "heldout", "val")},
        "frac_level1_train": float((base.train.level == 1).mean()),
        "frac_level1_heldout": float((base.heldout.level == 1).mean()),
    }


def write_json(path: Path, data) -> None:
    """``data`` as indented JSON, written atomically (:func:`ebpo_verl.ops.atomic.atomic_write_text`)."""
    atomic_write_text(path, json.dumps(data, indent=1))
