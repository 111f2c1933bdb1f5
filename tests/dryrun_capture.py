"""Write the DRY_RUN config and the PRINT_OVERRIDES list of a fixed set of recipe runs to a folder, one file each,
so that two checkouts can be compared byte for byte (a refactor must leave every run's config unchanged):

    python tests/dryrun_capture.py --repo /tmp/before-src --out /tmp/dryrun_before
    python tests/dryrun_capture.py --repo . --out /tmp/dryrun_after
    diff -r /tmp/dryrun_before /tmp/dryrun_after

The runs: each model's default, every ALGO x BASELINES (qwen3_8b), G=8, every ORDER, both REWARDs, and each
table driver's PRINT_OVERRIDES (every run of every table, in order). Each run goes through the command line
``python -m ebpo_verl.recipes run MODEL`` (in this process, ``main(argv)``, with a clean environment and a fixed
WORK_DIR that is never created); ``--repo`` is put first on ``sys.path`` so that checkout's package is the one run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

WORK = "/tmp/ebpo-dryrun-capture-work"
MODELS = ("qwen3_8b", "qwen3_14b", "llama3_8b")
ALGOS = (
    "ebpo", "ebpo_bb", "ebpo_batch", "grpo", "grpo_bn", "drgrpo", "dapo", "entropy_mech", "kl_cov", "otb", "rloo",
    "reinforce_pp", "spo", "bnpo", "shrinkage_js",
)  # fmt: skip
ORDERS = ("topic", "naive", "difficulty", "random")
TABLES = ("main", "group_size", "ordering", "curriculum", "grpo_bn")


def cases() -> list[tuple[str, str, dict[str, str]]]:
    """(file stem, model, switches) of every run compared."""
    out = [(f"{m}-default", m, {}) for m in MODELS]
    for algo in ALGOS:
        out += [(f"qwen3_8b-{algo}-{b}", "qwen3_8b", {"ALGO": algo, "BASELINES": b}) for b in ("paper", "canonical")]
    out += [(f"qwen3_8b-order_{o}", "qwen3_8b", {"ORDER": o}) for o in ORDERS]
    out += [("qwen3_8b-g8", "qwen3_8b", {"GROUP_SIZE": "8"})]
    out += [("qwen3_14b-grpo-g8", "qwen3_14b", {"ALGO": "grpo", "GROUP_SIZE": "8"})]
    out += [("qwen3_8b-reward_math_verify", "qwen3_8b", {"REWARD": "math_verify"})]
    return out


def call(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """``python -m ebpo_verl.recipes *argv`` in this process under ``env`` alone: (exit status, stdout)."""
    from ebpo_verl.recipes.__main__ import main

    os.environ.clear()
    os.environ.update(env)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            status = main(argv)
        except SystemExit as err:
            status = err.code if isinstance(err.code, int) else 1
    return int(status or 0), out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to run")
    parser.add_argument("--out", type=Path, required=True, help="folder for the files (created; must not exist)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.repo.resolve()))
    args.out.mkdir(parents=True)
    base = {"PATH": os.environ["PATH"], "HOME": WORK, "WORK_DIR": WORK, "PYTHON": sys.executable}
    failed = []
    for stem, model, switches in cases():
        for mode, suffix in (("PRINT_OVERRIDES", "overrides"), ("DRY_RUN", "yaml")):
            status, text = call(["run", model], {**base, **switches, mode: "1"})
            (args.out / f"{stem}.{suffix}").write_text(text)
            if status:
                failed.append(f"{stem}.{suffix}")
        print(f"{stem}: written", file=sys.stderr, flush=True)
    for table in TABLES:
        status, text = call(["table", table], {**base, "PRINT_OVERRIDES": "1"})
        (args.out / f"table_{table}.overrides").write_text(text)
        if status:
            failed.append(f"table_{table}.overrides")
    if failed:
        print(f"dryrun_capture: failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    assert not os.path.exists(WORK), f"a dry run wrote {WORK}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
