"""The one allowlist of what a checkpoint file of this package may pickle besides tensors, and the weights-only
load that allows exactly that (:func:`weights_only_loads`).

verl reads checkpoints with ``torch.load(weights_only=False)``, which runs any code they carry. The evaluation's
merge (:mod:`ebpo_verl.evaluate.safe_merge`) and a resume under ``ebpo-train``
(:mod:`ebpo_verl.trainer.checkpoint.trusted_load`) load ``weights_only=True``, each file with its kind's part of
:data:`ALLOWED` (kind from the file name, :data:`KIND_FILES`; no kind: nothing extra). Any other global is refused
before lookup: :class:`UntrustedPickle` names the file and what it carries.
"""

from __future__ import annotations

import functools
import importlib
import os
import pickle
import pickletools
import re
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import torch

from ebpo_verl.compat.contact import patched

MODEL = "model shard"
OPTIMIZER = "optimizer shard"
EXTRA_STATE = "extra state"
DATALOADER = "dataloader state"
RESUME_FILES = (MODEL, OPTIMIZER, EXTRA_STATE, DATALOADER)
"""What verl's resume unpickles: ``actor/model_world_size_W_rank_R.pt``, ``optim_...``, ``extra_state_...``
(in each worker) and ``data.pt`` (in the trainer); the evaluation's merge reads the model shards only."""
KIND_FILES: dict[str, str] = {
    MODEL: r"model_world_size_\d+_rank_\d+\.pt",
    OPTIMIZER: r"optim_world_size_\d+_rank_\d+\.pt",
    EXTRA_STATE: r"extra_state_world_size_\d+_rank_\d+\.pt",
    DATALOADER: r"data\.pt",
}
"""Each kind's file names, as verl 0.9.1 writes them (``FSDPCheckpointManager.save_checkpoint``, the v1 trainer's
``_save_checkpoint``)."""

_FSDP = (MODEL, OPTIMIZER)
ALLOWED: dict[str, tuple[str, ...]] = {
    "torch.distributed.tensor.DTensor": _FSDP,
    "torch.distributed.tensor._dtensor_spec.DTensorSpec": _FSDP,
    "torch.distributed.tensor._dtensor_spec.TensorMeta": _FSDP,
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry": _FSDP,
    "torch.distributed.tensor.placement_types.Shard": _FSDP,
    "torch.distributed.tensor.placement_types.Replicate": _FSDP,
    "torch.distributed.device_mesh.DeviceMesh": _FSDP,
    "torch.distributed._mesh_layout._MeshLayout": _FSDP,
    "torch.distributed._mesh_layout._FlatLayout": _FSDP,
    "numpy._core.multiarray._reconstruct": (EXTRA_STATE,),
    "numpy.ndarray": (EXTRA_STATE,),
    "numpy.dtype": (EXTRA_STATE,),
    "numpy.dtypes.UInt32DType": (EXTRA_STATE,),
}
"""Each global besides torch's own that the package's checkpoints pickle, with the files that hold it, as listed in
real checkpoints (``tests/test_resume_trust.py`` reads them: the CPU trainer's, and verl's FSDP2, FSDP1 and HSDP
ones at world size 2): a sharded state dict's DTensors with their spec, placement and device mesh; the extra
state's numpy RNG state (``UInt32DType`` is built, not named, and checked by the unpickler); ``data.pt`` and the
scheduler hold only plain values. Names that this torch or numpy lacks are skipped."""


def file_kind(f: Any) -> str | None:
    """The kind of :data:`KIND_FILES` whose name ``f`` (a path) has; None for another name or a stream."""
    if not isinstance(f, str | os.PathLike):
        return None
    name = os.path.basename(os.fspath(f))
    return next((kind for kind, pattern in KIND_FILES.items() if re.fullmatch(pattern, name)), None)


def allowed(files: Iterable[str]) -> tuple[str, ...]:
    """The names of :data:`ALLOWED` that any of ``files`` (kinds of :data:`RESUME_FILES`) may hold."""
    wanted = set(files)
    return tuple(name for name, holders in ALLOWED.items() if wanted & set(holders))


class UntrustedPickle(Exception):
    """A file pickles globals outside the allowlist: ``path`` and ``carried`` (their dotted names)."""

    def __init__(self, path: Any, carried: list[str]) -> None:
        super().__init__(f"{path} pickles {', '.join(carried)}")
        self.path, self.carried = path, carried


def pickled_globals(f: Any) -> set[str]:
    """The globals (``module.name``) that the pickle of ``torch.save`` file ``f`` names, read without unpickling it;
    a stream is read from where it stands and put back there. :class:`pickle.UnpicklingError` when ``f`` is not a
    ``torch.save`` zip archive (torch's legacy format, a broken file), whose globals this cannot list."""
    where = None if isinstance(f, str | os.PathLike) else f.tell()
    try:
        with zipfile.ZipFile(f) as archive:
            record = next(n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            data = archive.read(record)
    except (zipfile.BadZipFile, StopIteration) as err:
        raise pickle.UnpicklingError(
            f"{f} is not a torch.save zip archive, so what it pickles cannot be checked"
        ) from err
    finally:
        if where is not None:
            f.seek(where)
    return {str(arg).replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


_LOAD = torch.load


def weights_only_load(f: Any, *args: Any, kinds: Iterable[str], weights_only: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` whatever the caller asked, for a reader of files of ``kinds``:
    :class:`UntrustedPickle` when the file pickles a name of :data:`ALLOWED` that its kind (:func:`file_kind`,
    among ``kinds``) may not hold, or a global outside torch's safe globals (found without unpickling it); other
    errors as torch raises them."""
    kind = file_kind(f)
    foreign = sorted(
        name for name in pickled_globals(f) if name in ALLOWED and (kind not in kinds or kind not in ALLOWED[name])
    )
    if foreign:
        raise UntrustedPickle(f, foreign[:3])
    try:
        return _LOAD(f, *args, weights_only=True, **kwargs)
    except pickle.UnpicklingError:
        unsafe = []
        with suppress(ValueError, OSError, RuntimeError):  # not a torch.save zip file: a broken file, not a foreign one
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(f)
        if not unsafe:
            raise
        raise UntrustedPickle(f, unsafe[:3]) from None


@contextmanager
def only_globals(names: Iterable[str]) -> Iterator[list[str]]:
    """torch's weights-only safe globals are exactly ``names`` (those this environment has) for the block, not
    what imports registered; then what they were. Yields the names found."""
    import torch.distributed.tensor  # noqa: F401 (DTensor's modules, before their names are looked up)

    found = []
    for module, _, attr in (name.rpartition(".") for name in names):
        with suppress(ImportError, AttributeError):
            found.append(getattr(importlib.import_module(module), attr))
    before = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(found)
    try:
        yield [f"{t.__module__}.{t.__qualname__}" for t in found]
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


@contextmanager
def weights_only_loads(files: Iterable[str]) -> Iterator[None]:
    """Every ``torch.load`` of this process in the block is :func:`weights_only_load` for ``files`` (kinds of
    :data:`RESUME_FILES`): each file loads with its own kind's part of :data:`ALLOWED`, checked by name before the
    load, and torch's safe globals are the union, :func:`allowed` ``(files)``, which torch checks while it unpickles
    (a type built rather than named, as numpy's dtype classes); the load replaced while the caller's block runs
    (verl calls ``torch.load`` by that name), the safe globals set once for it (verl's merger loads in threads)."""
    load = functools.partial(weights_only_load, kinds=tuple(files))
    with only_globals(allowed(files)), patched("torch.load", load):
        yield
