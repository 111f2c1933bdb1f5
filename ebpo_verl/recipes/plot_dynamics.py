"""Training-dynamics plots (the paper's figures): one line per run over training steps.

    python -m ebpo_verl.recipes.plot_dynamics RUN... --out results/ [--smooth N]

RUN is a metrics log or run directory, optionally labelled ``LABEL=RUN`` (read as in :mod:`.make_tables`: attempts
of a resumed run resolved, torn last line skipped). Writes one PNG per metric that at least one run logged:
gradient norm (``actor/grad_norm``), per-step KL (``actor/ppo_kl``), policy entropy (``actor/entropy``),
training reward (``critic/score/mean``), response length (``response_length/mean``) and every ``ebpo/*``
estimator diagnostic (per-cluster ones excepted), named after the metric (``actor_grad_norm.png``, ...), plus
``dynamics.png``, a grid of the first five. Under every figure: each run's ebpo-verl commit and hardware (from
its metrics log's provenance sidecar; "not recorded" for a log without one). Han et al. (arXiv 2602.05165)
report that EBPO keeps a higher gradient norm, a bounded per-step KL and a higher entropy than GRPO.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import ClassVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ebpo_verl.ops.atomic import atomic_write  # noqa: E402
from ebpo_verl.ops.metrics_log import MetricsLogError, read_provenance  # noqa: E402
from ebpo_verl.ops.provenance import describe_hardware, short_commit  # noqa: E402
from ebpo_verl.options.cli import parse  # noqa: E402
from ebpo_verl.options.parsing import PATH, OptionSection, ints, option  # noqa: E402
from ebpo_verl.recipes.make_tables import finite_number, log_files, parse_spec, read_run  # noqa: E402

CORE: dict[str, str] = {
    "actor/grad_norm": "gradient norm",
    "actor/ppo_kl": "per-step KL (actor/ppo_kl)",
    "actor/entropy": "policy entropy",
    "critic/score/mean": "training reward",
    "response_length/mean": "response length (tokens)",
}


def series(run: dict[int, dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` over the run's training steps; non-numeric and non-finite values dropped."""
    points = [(step, finite_number(data.get(key))) for step, data in run.items()]
    return [step for step, v in points if v is not None], [v for _, v in points if v is not None]


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (the first points average what exists so far)."""
    return pd.Series(values, dtype=float).rolling(window, min_periods=1).mean().tolist()


def metric_keys(runs: dict[str, dict[int, dict]]) -> list[str]:
    """CORE metrics first, then the ``ebpo/*`` diagnostics (sorted) that any run logged."""
    present = {key for run in runs.values() for data in run.values() for key in data}
    ebpo = sorted(k for k in present if k.startswith("ebpo/") and not k.startswith("ebpo/cluster/"))
    return [k for k in CORE if k in present] + ebpo


def save_png(fig, path: Path, caption: str = "") -> None:
    """Write ``fig`` (with ``caption`` under it) to ``path`` as a PNG, atomically, and close it."""
    if caption:
        fig.text(0.5, -0.02, caption, ha="center", va="top", fontsize=8.5)
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    finally:
        plt.close(fig)


LINESTYLES = ("-", "--", "-.", ":")
LEGEND_PT = 9


def _draw(ax, runs: dict[str, dict[int, dict]], key: str, window: int) -> None:
    """One line per run that logged ``key``; a run with a single logged step is drawn as a marker (a line needs
    two points), so every run in the legend is visible. Steps are integers, and so are the ticks. A run keeps
    its colour and line style (by its index) in every panel; the y axis names the metric."""
    for i, (label, run) in enumerate(runs.items()):
        steps, values = series(run, key)
        if steps:
            marker = "o" if len(steps) == 1 else None
            style = {"color": f"C{i % 10}", "ls": LINESTYLES[i % len(LINESTYLES)], "linewidth": 1.6}
            ax.plot(steps, smooth(values, window), label=label, marker=marker, **style)
    ax.set_title(key, fontsize=10)
    ax.set_ylabel(CORE.get(key, key.removeprefix("ebpo/")))
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_PT)


def provenance_note(paths: dict[str, str]) -> str:
    """One line per run: its label, ebpo-verl commit(s) and hardware from its metrics log's provenance sidecar."""
    lines = []
    for label, path in paths.items():
        records = [a["provenance"] for file in log_files(Path(path)) for a in read_provenance(file)]
        if not records:
            lines.append(f"{label}: provenance not recorded")
            continue
        commits = ", ".join(dict.fromkeys(short_commit(r) for r in records))
        lines.append(f"{label}: ebpo-verl commit {commits}; {describe_hardware(records[-1])}")
    return "\n".join(lines)


def plot_dynamics(specs: list[str], out: Path, window: int = 1) -> list[Path]:
    """Write the PNGs for the runs in ``specs``; returns their paths. Missing runs are skipped with a note."""
    if window < 1:
        raise ValueError(f"--smooth must be >= 1, got {window}")
    runs: dict[str, dict[int, dict]] = {}
    paths: dict[str, str] = {}
    for spec in specs:
        section, method, path = parse_spec(spec)
        label = method if section == "runs" else f"{section}/{method}"
        if label in runs:
            raise ValueError(f"two runs labelled {label!r}: label them differently (LABEL=RUN)")
        if not log_files(Path(path)):
            print(f"plot_dynamics: no metrics log for {label} at {path}: skipped", file=sys.stderr)
            continue
        runs[label] = read_run(path)
        paths[label] = path
    keys = metric_keys(runs)
    if not keys:
        raise ValueError(f"none of the runs logged any of {list(CORE)} or ebpo/* metrics: nothing to plot")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    note = provenance_note(paths)
    for key in keys:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        _draw(ax, runs, key, window)
        written.append(out / (key.replace("/", "_") + ".png"))
        save_png(fig, written[-1], note)
    grid = keys[: len(CORE)]
    fig, axes = plt.subplots(1, len(grid), figsize=(4.2 * len(grid), 3.5), squeeze=False)
    for ax, key in zip(axes[0], grid, strict=True):
        _draw(ax, runs, key, window)
    save_png(fig, out / "dynamics.png", note)
    return [*written, out / "dynamics.png"]


@dataclass(frozen=True)
class PlotOptions(OptionSection):
    """``plot_dynamics``' command line."""

    SECTION: ClassVar[str] = ""

    runs: tuple[str, ...] = option(MISSING, "[LABEL=]metrics log or run directory", rule=PATH, flag="RUN", many=True)
    out: str = option(MISSING, "output directory", rule=PATH)
    smooth: int = option(1, "moving-average window in steps (1: raw)", rule=ints(1))


def main(argv: list[str] | None = None) -> int:
    o = parse(PlotOptions, "python -m ebpo_verl.recipes.plot_dynamics", argv, __doc__.split("\n\n")[0])
    try:
        paths = plot_dynamics(list(o.runs), Path(o.out), o.smooth)
    except (MetricsLogError, ValueError, OSError) as err:
        print(f"plot_dynamics: error: {err}", file=sys.stderr)
        return 1
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
