"""verl's FSDP model merger with every shard read by ``torch.load(weights_only=True)`` (the evaluation's default).

    python -m ebpo_verl.evaluate.safe_merge --local_dir STEP/actor --target_dir OUT

verl 0.9.1's merger (``verl/model_merger/fsdp_model_merger.py``) reads ``model_world_size_W_rank_R.pt`` with
``torch.load(..., weights_only=False)``, which unpickles the file and so runs any code it carries. This entry
point, run in a process of its own by :func:`ebpo_verl.evaluate.merge.merge_checkpoint`, leaves verl's merge logic
as it is and replaces ``torch.load`` for the duration of the merge (:func:`safe_load`): weights only, with the
allowlist reduced to exactly :data:`FSDP_TYPES`, the DTensor, placement and device-mesh types an FSDP sharded
state dict holds (plain tensors, storages, dtypes, ``OrderedDict``, ``torch.Size`` and ``torch.device`` are
always allowed by torch). A shard that pickles anything else is refused before it is unpickled: exit status
:data:`~ebpo_verl.evaluate.merge.REFUSED` and one line naming the file, what it carries and ``--trust-checkpoint``.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from typing import Any

import torch

from ebpo_verl.compat.contact import patched
from ebpo_verl.evaluate.merge import REFUSAL_MARK, REFUSED

FSDP_TYPES = (
    "torch.distributed.tensor.DTensor",
    "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta",
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types.Replicate",
    "torch.distributed.tensor.placement_types.Partial",
    "torch.distributed.tensor.placement_types._StridedShard",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed._mesh_layout._FlatLayout",
)
"""What verl's FSDP checkpoint manager pickles besides plain tensors (``model.state_dict()`` of an FSDP2 model: a
DTensor per parameter, its spec, placements and device mesh; checked on a world-size-2 checkpoint it wrote,
``tests/test_merge_trust.py``). Names that this torch version lacks are skipped."""
_LOAD = torch.load


class UntrustedShard(Exception):
    """A shard holds a global outside the allowlist: the one-line refusal."""


def allow_fsdp_types() -> list[str]:
    """Reset torch's weights-only allowlist to :data:`FSDP_TYPES` (dropping whatever imports added); returns the
    names found in this torch."""
    import torch.distributed.tensor  # noqa: F401 (registers DTensor's types; replaced below by ours)

    found = []
    for name in FSDP_TYPES:
        module, _, attr = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(found)
    return [f"{t.__module__}.{t.__qualname__}" for t in found]


def safe_load(f: Any, *args: Any, weights_only: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` whatever the caller asked; UntrustedShard when the file pickles a
    global outside the allowlist (found without unpickling it), other errors as torch raises them."""
    try:
        return _LOAD(f, *args, weights_only=True, **kwargs)
    except pickle.UnpicklingError:
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(f)
        except (ValueError, OSError, RuntimeError):  # not a torch.save zip file: a broken shard, not a foreign one
            unsafe = []
        if not unsafe:
            raise
        raise UntrustedShard(
            f"{f}{REFUSAL_MARK}{', '.join(unsafe[:3])}, which is not a tensor or an FSDP/DTensor "
            "type, so merging it would run code from the file (docs/evaluation.md#trust); only if you trust this "
            "checkpoint as you would trust code, pass --trust-checkpoint"
        ) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from verl.model_merger import __main__ as verl_merger

    allow_fsdp_types()
    try:
        with (
            patched("torch.load", safe_load),
            patched("sys.argv", ["verl.model_merger", "merge", "--backend", "fsdp", *argv]),
        ):
            verl_merger.main()
    except UntrustedShard as e:
        sys.stdout.flush()
        print(str(e), file=sys.stderr, flush=True)
        return REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
