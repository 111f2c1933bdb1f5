"""The pre-flight's trust check: a resume that no weights-only load can guard stops before Ray starts."""

from __future__ import annotations

from typing import Any

from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.trainer.run_options import RunOptions


def check_resume_trust(config: Any, options: RunOptions, dry_run: bool) -> None:
    """Unless ``trainer.trust_checkpoint``, a resume whose actor or critic strategy loads its checkpoint with plain
    pickle (Megatron's) is refused here, with the line the trainer would print
    (:func:`ebpo_verl.trainer.checkpoint.trusted_load.check_strategies`)."""
    if options.trainer.trust_checkpoint:
        return
    from ebpo_verl.trainer.checkpoint.trusted_load import UntrustedCheckpointError, check_strategies

    try:
        check_strategies(config)
    except UntrustedCheckpointError as err:
        raise EBPOConfigError(str(err)) from None
