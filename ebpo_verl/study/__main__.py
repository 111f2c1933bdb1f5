"""``python -m ebpo_verl.study [--preset tiny|quick|full] [--out DIR]`` and ``python -m ebpo_verl.study mse``.

Every finished RL run is saved under DIR/runs/ at once, so rerunning the same command after an interruption
resumes: saved runs (and the saved warm start) are reused, the rest run, and the report is written over all
of them. A different preset or configuration in the same DIR is refused."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ebpo_verl.atomic import DiskFullError
from ebpo_verl.study.presets import PRESETS, describe_presets


def main(argv: list[str] | None = None) -> int:
    """The command line; a full disk is one error line naming the file and the free space (exit status 2)."""
    try:
        return _main(argv)
    except DiskFullError as err:
        print(f"python -m ebpo_verl.study: error: {err} (finished runs are kept; the rerun resumes)", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ebpo_verl.study",
        description=__doc__.replace("``", ""),  # the docstring's RST literals, as plain text
        epilog="presets (wall time on 2 idle cores):\n" + describe_presets(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("what", nargs="?", choices=["rl", "mse"], default="rl", help="the RL study or the MSE check")
    parser.add_argument("--preset", choices=list(PRESETS), default="quick", help="the study grid (default quick)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="output directory (default results/)")
    parser.add_argument("--workers", type=int, default=None, help="processes for the RL runs (preset default)")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"cannot create --out {args.out}: {err.strerror}")
    command = " ".join(["python -m ebpo_verl.study", *(argv if argv is not None else sys.argv[1:])])
    t0 = time.perf_counter()
    if args.what == "mse":
        from ebpo_verl.study.mse import run_mse_study

        print(run_mse_study(args.out, command))
        return 0

    from ebpo_verl.study.report import write_report
    from ebpo_verl.study.runner import StudyDirError, claim_out_dir, describe_base, prepare_base, run_grid, write_json

    preset = PRESETS[args.preset]
    try:
        claim_out_dir(args.out, preset)
    except StudyDirError as err:
        print(f"python -m ebpo_verl.study: error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print(f"warm start: {preset.sft_steps} supervised steps (or the one saved in {args.out}) ...", flush=True)
    base = prepare_base(preset, args.out)
    info = describe_base(base)
    print(f"warm start ready: held-out pass@1 {info['heldout_accuracy']:.3f}")
    runs, resumed = run_grid(preset, base, args.out, args.workers)
    seconds = time.perf_counter() - t0
    write_json(args.out / "runs.json", {"preset": args.preset, "base": info, "runs": runs})
    headline = write_report(args.out, preset, info, runs, seconds, command, resumed)
    print(f"\nFinal held-out accuracy (rows = estimator, columns = G), warm start {info['heldout_accuracy']:.3f}:")
    print(headline)
    print(f"\n{len(runs)} runs ({resumed} resumed) in {seconds:.0f} s; report: {args.out / 'study.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
