"""EBPO at G = 2 in TRL's GRPOTrainer on a CPU: ``python -m ebpo_verl.integrations.trl_example --out DIR``.

Builds the package's tiny model and tokenizer (:mod:`ebpo_verl.cpu.tiny`, no download), trains it for ``--steps``
steps on addition prompts (reward 1 when the completion contains the sum) with a checkpoint every 2 steps, prints
the ``ebpo/*`` metrics TRL logged, then resumes a fresh trainer from the first checkpoint and checks that it ends
with the same EBPO state as the uninterrupted run. A minute or two on one core. docs/trl.md explains each piece.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SHOWN = ("ebpo/shrinkage_mean", "ebpo/mu_glob", "ebpo/sigma2", "ebpo/tau2", "ebpo/frac_zero_var_groups")


def sum_reward(completions: list[str], answer: list[int], **kwargs: Any) -> list[float]:
    """1 when the completion contains the prompt's sum, else 0 (a tiny random model mostly fails: all-fail groups)."""
    return [float(str(a) in c) for c, a in zip(completions, answer, strict=True)]


def build_trainer(out: Path, steps: int, model_dir: Path) -> Any:
    """TRL's GRPOTrainer with EBPO's advantages: 2 prompts x G = 2 completions per step, a checkpoint every 2."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from ebpo_verl.algos.ebpo import EBPOOptions
    from ebpo_verl.integrations.trl import EstimatorGRPOTrainer

    rows = [{"prompt": f"What is {a} + {b}?", "answer": a + b} for a in range(4) for b in range(4)]
    args = GRPOConfig(
        output_dir=str(out / "run"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=steps,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
    )
    return EstimatorGRPOTrainer(
        model=str(model_dir),
        reward_funcs=sum_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        estimator="ebpo",
        estimator_options=EBPOOptions(),  # the defaults; any field of EBPOOptions, validated as under verl
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebpo_verl.integrations.trl_example", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="a new or empty folder for the model and the run")
    parser.add_argument("--steps", type=int, default=4, help="training steps, an even number >= 4 (default 4)")
    opts = parser.parse_args(argv)
    if opts.steps < 4 or opts.steps % 2:
        parser.error(f"--steps must be an even number >= 4, not {opts.steps}")
    if opts.out.exists() and any(opts.out.iterdir()):
        parser.error(f"--out {opts.out} is not empty: name a new folder")
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

    model_dir = opts.out / "model"
    build_model(model_dir, build_tokenizer(model_dir))
    trainer = build_trainer(opts.out, opts.steps, model_dir)
    trainer.train()
    for logs in trainer.state.log_history:
        if SHOWN[0] in logs:
            print(f"step {logs['step']}: " + "  ".join(f"{k}={logs[k]:.4g}" for k in SHOWN if k in logs))
    final = trainer.estimator.state.state_dict()
    resumed = build_trainer(opts.out / "resumed", opts.steps, model_dir)
    resumed.train(resume_from_checkpoint=str(opts.out / "run" / "checkpoint-2"))
    same = resumed.estimator.state.state_dict() == final
    print(f"saved: {opts.out / 'run' / 'checkpoint-2' / 'ebpo_state.json'}")
    verdict = "equals" if same else "DIFFERS FROM"
    print(f"resumed from step 2 to {opts.steps}: EBPO state {verdict} the uninterrupted run's")
    print(json.dumps({k: v for k, v in final.items() if not isinstance(v, dict)}, sort_keys=True))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
