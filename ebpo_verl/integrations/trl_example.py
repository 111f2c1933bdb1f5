"""EBPO at G = 2 in TRL's GRPOTrainer on a CPU: ``python -m ebpo_verl.integrations.trl_example --out DIR``.

Builds the package's tiny model and tokenizer (:mod:`ebpo_verl.cpu.tiny`, no download), trains it for ``--steps``
steps on addition prompts (reward 1 when the completion contains the sum) with a checkpoint every 2 steps, prints
the ``ebpo/*`` metrics TRL logged, then resumes a fresh trainer from the first checkpoint and checks that it ends
with the same EBPO state as the uninterrupted run. A minute or two on one core. docs/trl.md explains each piece.
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, ClassVar

from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import PATH, OptionSection, Rule, is_int, option

PROG = "python -m ebpo_verl.integrations.trl_example"

SHOWN = ("ebpo/shrinkage_mean", "ebpo/mu_glob", "ebpo/sigma2", "ebpo/tau2", "ebpo/frac_zero_var_groups")


def sum_reward(completions: list[str], answer: list[int], **kwargs: Any) -> list[float]:
    """1 when the completion contains the prompt's sum, else 0 (a tiny random model mostly fails: all-fail groups)."""
    return [float(str(a) in c) for c, a in zip(completions, answer, strict=True)]


def build_trainer(
    out: Path,
    steps: int,
    model_dir: Path,
    estimator: str = "ebpo",
    options: Any = None,
    device: str = "cpu",
    save_steps: int = 2,
) -> Any:
    """TRL's GRPOTrainer with ``estimator``'s advantages (``options``: its options, None the defaults; EBPO's
    spelled out for ``ebpo``) on ``device``: 2 prompts x G = 2 completions per step, a checkpoint every
    ``save_steps``. Each row has a unique ``index`` column, for the estimators that track prompts."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from ebpo_verl.algos.ebpo import EBPOOptions
    from ebpo_verl.integrations.trl import EstimatorGRPOTrainer

    rows = [{"prompt": f"What is {a} + {b}?", "answer": a + b, "index": 4 * a + b} for a in range(4) for b in range(4)]
    args = GRPOConfig(
        output_dir=str(out / "run"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=steps,
        save_strategy="steps",
        save_steps=save_steps,
        logging_steps=1,
        report_to=[],
        use_cpu=device == "cpu",
        seed=0,
    )
    if estimator == "ebpo" and options is None:
        options = EBPOOptions()  # the defaults; any field of EBPOOptions, validated as under verl
    return EstimatorGRPOTrainer(
        model=str(model_dir),
        reward_funcs=sum_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        estimator=estimator,
        estimator_options=options,
    )


@dataclass(frozen=True)
class ExampleOptions(OptionSection):
    """The example's command line."""

    SECTION: ClassVar[str] = ""

    out: str = option(MISSING, "a new or empty folder for the model and the run", rule=PATH)
    steps: int = option(4, "training steps, an even number >= 4", rule=Rule(is_int, "an integer"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 4 or self.steps % 2:
            raise ValueError(f"--steps must be an even number >= 4, not {self.steps}")


def main(argv: list[str] | None = None) -> int:
    opts = parse(ExampleOptions, PROG, argv, __doc__.split("\n\n")[0])
    out = Path(opts.out)
    if out.exists() and any(out.iterdir()):
        print(f"{PROG}: error: --out {out} is not empty: name a new folder", file=sys.stderr)
        sys.exit(2)
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

    model_dir = out / "model"
    build_model(model_dir, build_tokenizer(model_dir))
    trainer = build_trainer(out, opts.steps, model_dir)
    trainer.train()
    for logs in trainer.state.log_history:
        if SHOWN[0] in logs:
            print(f"step {logs['step']}: " + "  ".join(f"{k}={logs[k]:.4g}" for k in SHOWN if k in logs))
    final = trainer.estimator.state.state_dict()
    resumed = build_trainer(out / "resumed", opts.steps, model_dir)
    resumed.train(resume_from_checkpoint=str(out / "run" / "checkpoint-2"))
    same = resumed.estimator.state.state_dict() == final
    print(f"saved: {out / 'run' / 'checkpoint-2' / 'ebpo_state.json'}")
    verdict = "equals" if same else "DIFFERS FROM"
    print(f"resumed from step 2 to {opts.steps}: EBPO state {verdict} the uninterrupted run's")
    print(json.dumps({k: v for k, v in final.items() if not isinstance(v, dict)}, sort_keys=True))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
