"""A resume under ``ebpo-train`` unpickles data only: tensors and the types of this package's own checkpoints.

verl 0.9.1 reads ``global_step_N/actor/*.pt`` and ``data.pt`` with ``torch.load(weights_only=False)``: a tampered
checkpoint would run code. Unless ``trainer.trust_checkpoint=true``, :class:`TrustedLoadMixin` loads every file
weights-only with its kind's part of :data:`ebpo_verl.compat.unpickling.ALLOWED` (:func:`weights_only_worker_cls`,
also ``_load_checkpoint`` in the trainer), refuses an async ``transfer_queue`` folder (plain ``pickle.load``) and a
strategy outside :data:`CHECKED_STRATEGIES` (:func:`check_strategies`). Anything else pickled raises
:class:`UntrustedCheckpointError`, one line naming the file, what it carries and the switch.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

from ebpo_verl.compat.contact import patched
from ebpo_verl.compat.unpickling import RESUME_FILES, UntrustedPickle, weights_only_loads
from ebpo_verl.trainer.checkpoint.resume import resume_folder
from ebpo_verl.trainer.watchdog import RunAbortedError

SWITCH = "trainer.trust_checkpoint=true"
ADVICE = f"(docs/training.md#trust); only if you trust this checkpoint as you would trust code, set {SWITCH}"


class UntrustedCheckpointError(RunAbortedError):
    """A checkpoint file that carries more than data: the message is the one line to print."""


def _refuse_transfer_queue(checkpoint_dir) -> None:
    raise UntrustedCheckpointError(
        f"{checkpoint_dir} holds TransferQueue state, which verl restores with plain pickle.load (no weights-only "
        f"form), so resuming from it would run any code it carries {ADVICE}"
    )


CHECKED_STRATEGIES = ("fsdp", "fsdp2")
"""The training strategies whose resume loads data only: verl's ``FSDPCheckpointManager`` reads their files with
``torch.load``, by the names :data:`~ebpo_verl.compat.unpickling.KIND_FILES` lists."""


def check_strategies(config: Any) -> None:
    """:class:`UntrustedCheckpointError` when a run of ``config`` (verl's job config, not trusting its checkpoint)
    resumes (:func:`~ebpo_verl.trainer.checkpoint.resume.resume_folder`) with an actor or critic whose strategy is
    not one of :data:`CHECKED_STRATEGIES`, e.g. ``megatron``."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Disabled critic")  # need_critic's note for every non-GAE run
        critic = need_critic(config)
    keys = ["actor_rollout_ref.actor.strategy"] + (["critic.strategy"] if critic else [])
    unchecked = [
        f"{key}={value}"
        for key in keys
        if (value := str(OmegaConf.select(config, key, default="fsdp"))) not in CHECKED_STRATEGIES
    ]
    found = resume_folder(config.trainer) if unchecked else None
    if found is not None:
        raise UntrustedCheckpointError(
            f"{' and '.join(unchecked)} resumes from {found[0]} with a loader that this package cannot restrict to "
            f"data (Megatron's is torch distributed checkpointing, whose metadata is read with plain pickle.load; "
            f"only {' and '.join(CHECKED_STRATEGIES)} checkpoints load weights-only), so resuming would run any code "
            f"the checkpoint carries {ADVICE}"
        )


@contextmanager
def weights_only_resume() -> Iterator[None]:
    """In the block, this process's ``torch.load`` is weights-only with the resume's allowlist and TransferQueue's
    checkpoint load is refused; a foreign file raises :class:`UntrustedCheckpointError`."""
    try:
        with weights_only_loads(RESUME_FILES), patched("transfer_queue.load_checkpoint", _refuse_transfer_queue):
            yield
    except UntrustedPickle as err:
        raise UntrustedCheckpointError(
            f"{err.path} pickles {', '.join(err.carried)}, which is not a tensor or a type of this package's "
            f"checkpoints, so resuming from it would run code from the file {ADVICE}"
        ) from None


@functools.cache
def weights_only_worker_cls(base: type) -> type:
    """``base`` (a verl worker with ``load_checkpoint``) whose checkpoint load is :func:`weights_only_resume`'s."""
    from verl.single_controller.base.decorator import Dispatch, register

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # as verl's workers' load_checkpoint
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        with weights_only_resume():
            return super(cls, self).load_checkpoint(local_path, hdfs_path, del_local_after_load)

    cls = type(f"WeightsOnly{base.__name__}", (base,), {"load_checkpoint": load_checkpoint, "__module__": __name__})
    return cls


class TrustedLoadMixin:
    """Goes in the trainer's bases before :class:`~ebpo_verl.trainer.ray_trainer.EBPOTrainerMixin` (whose
    ``options`` it reads): the resume loads data only unless ``trainer.trust_checkpoint``."""

    @property
    def trusts_checkpoint(self) -> bool:
        return bool(self.options.trainer.trust_checkpoint)

    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()
        if self.trusts_checkpoint:
            return
        mapping = self.role_worker_mapping
        for role, actor_cls in list(mapping.items()):
            worker_cls = getattr(actor_cls, "__ray_actor_class__", None)
            if isinstance(worker_cls, type) and hasattr(worker_cls, "load_checkpoint"):
                mapping[role] = ray.remote(weights_only_worker_cls(worker_cls))

    def _load_checkpoint(self):
        if self.trusts_checkpoint:
            return super()._load_checkpoint()
        check_strategies(self.config)
        try:
            with weights_only_resume():
                return super()._load_checkpoint()
        except UntrustedCheckpointError as err:  # a worker's, raised here through Ray: its line, without Ray's
            raise UntrustedCheckpointError(str(getattr(err, "cause", err))) from None
