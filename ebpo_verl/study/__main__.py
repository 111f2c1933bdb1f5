"""``python -m ebpo_verl.study [--preset tiny|quick|full] [--out DIR]`` and ``python -m ebpo_verl.study mse``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ebpo_verl.study.presets import PRESETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebpo_verl.study", description=__doc__)
    parser.add_argument("what", nargs="?", choices=["rl", "mse"], default="rl", help="the RL study or the MSE check")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--workers", type=int, default=None, help="processes for the RL runs (preset default)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m ebpo_verl.study", *(argv if argv is not None else sys.argv[1:])])
    t0 = time.perf_counter()
    if args.what == "mse":
        from ebpo_verl.study.mse import run_mse_study

        print(run_mse_study(args.out, command))
        return 0

    from ebpo_verl.study.report import write_report
    from ebpo_verl.study.runner import describe_base, prepare_base, run_grid, write_json

    preset = PRESETS[args.preset]
    torch.set_num_threads(1)
    print(f"warm start: {preset.sft_steps} supervised steps ...", flush=True)
    base = prepare_base(preset)
    info = describe_base(base)
    print(f"warm start done in {info['sft_seconds']:.0f} s: held-out pass@1 {info['heldout_accuracy']:.3f}")
    runs = run_grid(preset, base, args.workers)
    seconds = time.perf_counter() - t0
    write_json(args.out / "runs.json", {"preset": args.preset, "base": info, "runs": runs})
    torch.save(base.model.state_dict(), args.out / "base_model.pt")
    headline = write_report(args.out, preset, info, runs, seconds, command)
    print(f"\nFinal held-out accuracy (rows = estimator, columns = G), warm start {info['heldout_accuracy']:.3f}:")
    print(headline)
    print(f"\n{len(runs)} runs in {seconds:.0f} s; report: {args.out / 'study.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
