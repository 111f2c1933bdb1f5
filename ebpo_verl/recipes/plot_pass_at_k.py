"""pass@k curves of one or several evaluated runs on one figure.

    python -m ebpo_verl.recipes.plot_pass_at_k RESULTS.json [LABEL=RESULTS.json ...] --out fig.png [--metric maj@k]

RESULTS.json: the output of ``python -m ebpo_verl.evaluate grade`` (its ``pass@k`` / ``maj@k`` per benchmark,
docs/evaluation.md#coverage). One panel per benchmark that any run has, and an "average" panel over the k that
every benchmark of the run has (``average_pass@k``); k on a log2 axis, the value in percent with its standard
error over problems as an error bar, one line per run (its label: LABEL, else the results folder's name and the
protocol). Runs under different protocols can share a figure; the legend names each one's protocol.
"""

from __future__ import annotations

import math
import sys
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, ClassVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ebpo_verl.ops.metrics_log import MetricsLogError  # noqa: E402
from ebpo_verl.options.cli import parse  # noqa: E402
from ebpo_verl.options.parsing import PATH, OptionSection, option  # noqa: E402
from ebpo_verl.recipes.make_tables import load_results  # noqa: E402
from ebpo_verl.recipes.paper import BENCHMARKS  # noqa: E402
from ebpo_verl.recipes.plot_dynamics import save_png  # noqa: E402

METRICS = ("pass@k", "maj@k")


def read_curves(path: str, metric: str) -> tuple[str, dict[str, tuple[list[int], list[float], list[float | None]]]]:
    """(protocol, panel -> (ks, values, stderrs)) of a RESULTS.json (checked by :func:`.make_tables.load_results`);
    panels: benchmarks, then "average"."""
    try:
        data = load_results(Path(path))
    except OSError as err:
        raise MetricsLogError(f"{path}: not a RESULTS.json of python -m ebpo_verl.evaluate grade ({err})") from None
    protocol, benches, curves = data["protocol"], data["benchmarks"], {}
    for bench, entry in sorted(benches.items(), key=lambda kv: (list(BENCHMARKS) + [kv[0]]).index(kv[0])):
        values = entry.get(metric) or {}
        if values:
            ks = sorted(values, key=int)
            stderr = entry.get(f"{metric}_stderr") or {}
            curves[bench] = ([int(k) for k in ks], [values[k] for k in ks], [stderr.get(k) for k in ks])
    if not curves:
        raise MetricsLogError(
            f"{path}: no {metric} in it (graded before coverage was reported, or with samples missing): "
            "run python -m ebpo_verl.evaluate grade again"
        )
    average = data.get(f"average_{metric}") or {}
    if average:
        ks = sorted(average, key=int)
        curves["average"] = ([int(k) for k in ks], [average[k] for k in ks], [None] * len(ks))
    return protocol, curves


def _label(spec: str) -> tuple[str | None, str]:
    """(explicit label or None, path) of ``LABEL=PATH`` or ``PATH``."""
    if "=" in spec and not Path(spec).exists():
        label, path = spec.split("=", 1)
        if not label or not path:
            raise MetricsLogError(f"bad run {spec!r}: expected LABEL=RESULTS.json or RESULTS.json")
        return label, path
    return None, spec


def load_runs(specs: list[str], metric: str) -> dict[str, dict[str, Any]]:
    """Label -> its curves, for every run given."""
    runs: dict[str, dict[str, Any]] = {}
    for spec in specs:
        label, path = _label(spec)
        protocol, curves = read_curves(path, metric)
        label = f"{label or Path(path).resolve().parent.name} ({protocol})"
        if label in runs:
            raise MetricsLogError(f"two runs labelled {label!r}: label them LABEL=RESULTS.json")
        runs[label] = curves
    return runs


def draw(runs: dict[str, dict[str, Any]], metric: str) -> plt.Figure:
    """One panel per benchmark (and the average), one line per run."""
    panels = list(dict.fromkeys(p for curves in runs.values() for p in curves if p != "average"))
    panels += ["average"] if any("average" in c for c in runs.values()) else []
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for label, curves in runs.items():
            if panel in curves:
                ks, values, errs = curves[panel]
                yerr = [e or 0.0 for e in errs] if any(e is not None for e in errs) else None
                ax.errorbar(ks, values, yerr=yerr, marker="o", capsize=3, label=label)
        ax.set_xscale("log", base=2)
        ticks = sorted({k for curves in runs.values() if panel in curves for k in curves[panel][0]})
        ax.set_xticks(ticks, [str(k) for k in ticks])
        title = "average (k every benchmark has)" if panel == "average" else BENCHMARKS.get(panel, panel)
        ax.set_title(title)
        ax.set_xlabel("k")
        ax.set_ylabel(f"{metric} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"{metric} by k (error bars: standard error over problems)")
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class PassAtKOptions(OptionSection):
    """``plot_pass_at_k``'s command line."""

    SECTION: ClassVar[str] = ""

    runs: tuple[str, ...] = option(MISSING, "[LABEL=]RESULTS.json of evaluate grade", rule=PATH, flag="RESULTS",
                                   many=True)  # fmt: skip
    out: str = option(MISSING, "the PNG to write", rule=PATH)
    metric: str = option("pass@k", "what is plotted", choices=METRICS)


def main(argv: list[str] | None = None) -> int:
    a = parse(PassAtKOptions, "python -m ebpo_verl.recipes.plot_pass_at_k", argv, __doc__.split("\n\n")[0])
    try:
        fig = draw(load_runs(a.runs, a.metric), a.metric)
    except MetricsLogError as err:  # a file that cannot be plotted: one line naming it
        print(f"plot_pass_at_k: error: {err}", file=sys.stderr)
        return 1
    save_png(fig, Path(a.out))
    print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
