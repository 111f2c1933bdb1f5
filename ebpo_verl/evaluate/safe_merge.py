"""verl's FSDP model merger with every shard read by ``torch.load(weights_only=True)`` (the evaluation's default).

    python -m ebpo_verl.evaluate.safe_merge --local_dir STEP/actor --target_dir OUT

Run in its own process by :func:`ebpo_verl.evaluate.merge.merge_checkpoint`: verl's merge logic with the allowlist
reduced to :data:`FSDP_TYPES`; a shard that pickles anything else is refused before it is unpickled (exit status
:data:`~ebpo_verl.evaluate.merge.REFUSED`, one line naming the file and ``--trust-checkpoint``;
docs/evaluation.md#trust).
"""

from __future__ import annotations

import sys

from ebpo_verl.compat.contact import patched
from ebpo_verl.compat.unpickling import MODEL, UntrustedPickle, allowed, weights_only_loads
from ebpo_verl.evaluate.merge import REFUSAL_MARK, REFUSED

FSDP_TYPES = allowed((MODEL,))
"""What verl's FSDP checkpoint manager pickles in a model shard besides plain tensors (``model.state_dict()`` of an
FSDP2 model: a DTensor per parameter, its spec, placements and device mesh; checked on a world-size-2 checkpoint it
wrote, ``tests/test_merge_trust.py``)."""


def refusal(err: UntrustedPickle) -> str:
    """The one line of a refused shard."""
    return (
        f"{err.path}{REFUSAL_MARK}{', '.join(err.carried)}, which is not a tensor or an FSDP/DTensor type, so "
        "merging it would run code from the file (docs/evaluation.md#trust); only if you trust this checkpoint as "
        "you would trust code, pass --trust-checkpoint"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from verl.model_merger import __main__ as verl_merger

    try:
        with (
            weights_only_loads((MODEL,)),
            patched("sys.argv", ["verl.model_merger", "merge", "--backend", "fsdp", *argv]),
        ):
            verl_merger.main()
    except UntrustedPickle as err:
        sys.stdout.flush()
        print(refusal(err), file=sys.stderr, flush=True)
        return REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
