"""The estimator registry (ebpo_verl/algos/registry.py): every list derives from it, the docs tables are generated
from it, and a new estimator is one module plus one registry line.

The acceptance test declares a toy stateful estimator (an exponential moving average of earlier batches' group
means as the baseline) in ONE new module, added through the entry-point group ``ebpo_verl.estimators`` (a
temporary ``*.dist-info`` with ``entry_points.txt`` in a folder on the path): no committed file changes, and
verl's registry, ``ebpo-train --cfg job`` and ``--help``, the generated YAML and docs tables, the recipes' ALGO
presets and dry run, the study and the trainer's checkpoints see it; a real ``ebpo-train`` run ships it to Ray's
workers through ``runtime_env`` and resumes its state exactly (tests/test_resume_trust.py: its runs are the toy's,
one pair of trainer runs for both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from verl.protocol import DataProto

from ebpo_verl.algos import registry
from ebpo_verl.algos.registry import EstimatorSpec, StateSpec
from ebpo_verl.ops.readme_block import replace_marked_block
from ebpo_verl.trainer.adapter import advantage_step

REPO_ROOT = Path(__file__).resolve().parents[1]

ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"


def toy_module() -> str:
    """The toy estimator's module exactly as docs/architecture.md shows it (its one ``python`` block)."""
    text = ARCHITECTURE.read_text()
    blocks = text.split("```python\n")[1:]
    assert len(blocks) == 1, "docs/architecture.md: expected one python block, the toy estimator"
    return blocks[0].split("```")[0]


TOY_MODULE = toy_module()


def write_toy_site(folder: Path) -> Path:
    """A folder holding the toy module and the one registry line: an entry point ``toy = ebpo_toy`` of group
    ``ebpo_verl.estimators`` in a ``*.dist-info`` (what ``pip install`` of a plugin package would leave)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ebpo_toy.py").write_text(TOY_MODULE)
    info = folder / "ebpo_toy-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ebpo-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\ntoy = ebpo_toy\n")
    return folder


def toy_env(site: Path, **extra: str) -> dict[str, str]:
    """This process's environment with the toy's folder and the checkout first on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(site), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def _reference_toy(batches: list[tuple[list[str], list[float]]], decay: float) -> list[np.ndarray]:
    """The toy's advantages by hand: group means, their mean, the moving average."""
    out, average = [], None
    for uids, rewards in batches:
        groups = {u: [r for v, r in zip(uids, rewards, strict=True) if v == u] for u in dict.fromkeys(uids)}
        mean = float(np.mean([np.mean(g) for g in groups.values()]))
        baseline = mean if average is None else average
        out.append(np.asarray(rewards) - baseline)
        average = decay * baseline + (1 - decay) * mean
    return out


# ------------------------------------------------------------------------------------ the registry itself


def test_every_list_derives_from_the_registry():
    from verl.trainer.ppo import core_algos

    import ebpo_verl
    from ebpo_verl.recipes.presets import PRESETS
    from ebpo_verl.study.rl import ESTIMATORS as STUDY
    from ebpo_verl.trainer import adapter
    from ebpo_verl.trainer.config.generate import ALL_SECTIONS, SECTIONS

    ebpo_verl.register()
    ours = registry.ours()
    rivals = ["jspo", "jspo_history", "ha_dw", "krpo", "running_norm"]
    assert list(ours) == ["ebpo", "shrinkage_js", "bnpo", "spo", "dbb", *rivals]
    assert list(registry.stateful()) == ["ebpo", "spo", "dbb", "jspo_history", "ha_dw", "running_norm"]
    for name, spec in registry.estimators().items():
        assert core_algos.get_adv_estimator_fn(spec.registered_name) is not None
        assert name in PRESETS and name in STUDY
        if not spec.builtin:
            fn = core_algos.get_adv_estimator_fn(name)
            assert fn is adapter.ESTIMATORS[name] and fn.__doc__.startswith(spec.summary)
    assert registry.get("reinforce_pp").registered_name == "reinforce_plus_plus_baseline"
    why = {"ebpo_s025", "ebpo_s05", "ebpo_s075", "ebpo_s1", "ebpo_glob", "ebpo_debiased", "ebpo_decay095"}
    assert set(STUDY) == {*registry.estimators(), "grpo_bn", "ebpo_batch", "ebpo_bb", "ebpo_topic", "ha_dw_authors",
                          *why}  # fmt: skip
    sections = [s.options_cls for s in ours.values() if s.options_cls is not None]
    assert list(SECTIONS[:-1]) == sections and list(ALL_SECTIONS[: len(sections)]) == sections
    assert set(adapter.DEFAULT_ESTIMATORS) == set(ours)


class _BrokenState:
    def __init__(self) -> None:
        self.values = {1.5}  # a set: not JSON

    def reset(self) -> None: ...

    def state_dict(self) -> dict:
        return {"values": self.values}

    def load_state_dict(self, saved: dict) -> None: ...


def test_a_spec_refuses_what_cannot_work_and_get_names_the_closest():
    from ebpo_verl.algos.baselines import SPOOptions, SPOState, compute_bnpo_advantages, compute_spo_advantages

    def refused(match: str, **kw) -> None:
        with pytest.raises(ValueError, match=match) as err:
            EstimatorSpec("x", "s", "src", **kw)
        assert "\n" not in str(err.value) and str(err.value).startswith("estimator 'x': ")

    refused("declare compute=compute_x_advantages")
    # options (or a state) that the function cannot take would never reach the math
    refused(
        r"compute_bnpo_advantages must take \(batch, options\)", compute=compute_bnpo_advantages, options_cls=SPOOptions
    )
    state = StateSpec(SPOState, "x.json", "X", "x")
    refused(
        r"must take \(batch, options, state\)", compute=compute_bnpo_advantages, options_cls=SPOOptions, state=state
    )
    refused(r"compute_spo_advantages must take \(batch\)", compute=compute_spo_advantages)
    refused("row_input 'nope' is neither 'sample_index' nor one of its options",
            compute=compute_spo_advantages, options_cls=SPOOptions, state=state, row_input="nope")  # fmt: skip
    for cls, match in (
        (int, "state class int lacks state_dict, load_state_dict, reset"),
        (_BrokenState, "state class _BrokenState fails the State contract's JSON round trip"),
    ):
        spo = {"compute": compute_spo_advantages, "options_cls": SPOOptions}
        refused(match, **spo, state=StateSpec(cls, "x.json", "X", "x"))  # fmt: skip
    with pytest.raises(ValueError, match=r"unknown estimator 'ebp'; did you mean ebpo\? known: grpo, "):
        registry.get("ebp")
    with pytest.raises(ValueError, match="verl's own"):
        registry.new_estimator("grpo")


def test_every_registered_estimator_declares_every_fact():
    """Walks the registry: each estimator of ours runs through the one factory on a batch with its row input, and
    each fact holds as declared: pass rates (its step refuses a shaped reward, the pre-flight every shaped-reward
    switch, in one line naming estimator and switch), n >= 2 (the pre-flight refuses n = 1), state, row input."""
    from omegaconf import OmegaConf

    from ebpo_verl.algos.estimator import State
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight.config import SHAPED_REWARD_KEYS, check_group_size, check_shaped_rewards
    from ebpo_verl.trainer.run_options import RunOptions

    uids, valid = np.array(["a", "a", "b", "b"], dtype=object), torch.ones(4, dtype=torch.bool)
    keys = np.array([0, 0, 1, 1], dtype=object)  # a prompt key, a label or a domain: constant per uid
    facts = {}
    for name, spec in registry.ours().items():
        est = registry.new_estimator(spec)
        assert est.options == spec.parse(None) and (est.state is None) == (spec.state is None)
        if spec.state is not None:
            assert isinstance(est.state, State) and spec.state.file == f"{name}_state.json"
        source = spec.row_source(est.options)
        values = None if source is None else np.array([0, 1, 0, 1]) if source.sample_index else keys
        result = est(torch.tensor([1.0, 0.0, 1.0, 1.0]), uids, valid, values)
        assert result.values.shape == (4,) and torch.isfinite(result.values).all()
        run = RunOptions(name, est.options)
        why = spec.pass_rates(est.options)
        if why:  # the step refuses a shaped reward
            with pytest.raises(ValueError):
                registry.new_estimator(spec)(torch.tensor([1.0, 0.0, 0.5, 1.3]), uids, valid, values)
        for key in SHAPED_REWARD_KEYS:
            config = OmegaConf.create({})
            OmegaConf.update(config, key, True, force_add=True)
            if why:
                with pytest.raises(EBPOConfigError, match=f"adv_estimator={name} needs .*{key}=True") as err:
                    check_shaped_rewards(config, run, False)
                assert "\n" not in str(err.value)
            else:
                check_shaped_rewards(config, run, False)
        one = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 1}}})
        group = spec.min_group(est.options)
        if group:
            with pytest.raises(EBPOConfigError, match=f"rollout.n=1 but algorithm.adv_estimator={name} needs at"):
                check_group_size(one, run, False)
        else:
            check_group_size(one, run, False)
        facts[name] = (bool(why), bool(group), spec.stateful, spec.row_input, spec.warning is not None)
    assert facts == {
        "ebpo": (False, True, True, "cluster_key", True),
        "shrinkage_js": (False, False, False, None, False),
        "bnpo": (True, False, False, None, False),
        "spo": (False, False, True, "prompt_key", False),
        "dbb": (True, False, True, "prompt_key", False),
        "jspo": (False, False, False, None, False),
        "jspo_history": (False, True, True, None, False),
        "ha_dw": (True, False, True, None, False),
        "krpo": (False, False, False, registry.SAMPLE_INDEX, False),
        "running_norm": (False, False, True, "row_key", False),
    }
    ebpo, jspo = registry.get("ebpo"), registry.get("jspo")
    assert ebpo.pass_rates(ebpo.parse({"prior": "beta_binomial"})) and not ebpo.min_group(ebpo.parse({"shrinkage": 1}))
    assert jspo.min_group(jspo.parse({"form": "authors_code"}))


def test_row_source_answers_what_each_estimator_reads_per_row():
    """The answer callers read their rows from: the sample index, the field the options name, or None."""
    source = {
        (name, str(opts)): registry.get(name).row_source(registry.get(name).parse(opts))
        for name, opts in [("ebpo", None), ("ebpo", {"cluster_key": "topic"}), ("spo", None), ("running_norm", None),
                           ("krpo", None), ("running_norm", {"row_key": "domain"}), ("jspo", None)]
    }  # fmt: skip
    assert source == {
        ("ebpo", "None"): None,
        ("ebpo", "{'cluster_key': 'topic'}"): registry.RowSource("topic"),
        ("spo", "None"): registry.RowSource("index"),
        ("running_norm", "None"): None,
        ("krpo", "None"): registry.RowSource(),
        ("running_norm", "{'row_key': 'domain'}"): registry.RowSource("domain"),
        ("jspo", "None"): None,
    }
    assert registry.RowSource().sample_index and not registry.RowSource("index").sample_index


def test_the_data_check_names_each_estimators_own_row_option():
    """The training rows' check of the field an estimator reads per row names that estimator's option (its spec's
    ``row_option``; it once named algorithm.ebpo.cluster_key for every label) and offers null only where the option
    takes it."""
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight.data import check_row_keys
    from ebpo_verl.trainer.run_options import RunOptions

    norm = registry.get("running_norm")
    with pytest.raises(EBPOConfigError) as err:
        check_row_keys(
            [{"topic": "a"}, {"topic": "b"}], RunOptions("running_norm", norm.parse({"row_key": "domain"})), "x.parquet"
        )
    assert str(err.value) == (
        "algorithm.running_norm.row_key='domain' is not a key of extra_info in the training data (x.parquet); "
        "extra_info keys present: ['topic']. Pick one of them, or add the labels to the data (ebpo_verl.data), or "
        "set algorithm.running_norm.row_key=null."
    )
    missing = r"^extra_info\['topic'\] \(algorithm\.running_norm\.row_key\) is missing or null in 1 of 2 training rows"
    with pytest.raises(EBPOConfigError, match=missing):
        check_row_keys([{"topic": "a"}, {}], RunOptions("running_norm", norm.parse({"row_key": "topic"})), "x.parquet")
    named = {}
    for name, spec in registry.ours().items():
        if spec.row_key is not None:
            with pytest.raises(EBPOConfigError) as err:
                check_row_keys([{"topic": "a"}], RunOptions(name, spec.parse({spec.row_key: "domain"})), "x.parquet")
            named[name] = (str(err.value).split("=")[0], str(err.value).endswith("=null."))
    assert named == {
        "ebpo": ("algorithm.ebpo.cluster_key", True),
        "spo": ("algorithm.spo.prompt_key", False),
        "dbb": ("algorithm.dbb.prompt_key", False),
        "running_norm": ("algorithm.running_norm.row_key", True),
    }


def test_verls_own_facts_are_spec_fields():
    """OTB's need of the actor's sum of squared probabilities is its spec's, under both of verl's names; our
    estimators cannot declare it."""
    from omegaconf import OmegaConf

    from ebpo_verl.algos.baselines import compute_bnpo_advantages
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight.config import check_stock_verl_methods
    from ebpo_verl.trainer.run_options import RunOptions

    reading = {n for n, spec in registry.estimators().items() if spec.sum_pi_squared}
    assert reading == {"otb"} and registry.get("otb").verl_variants == ("tir_optimal_token_baseline",)
    assert registry.by_verl_name("tir_optimal_token_baseline") is registry.get("otb")
    assert registry.by_verl_name("ebpo") is registry.get("ebpo") and registry.by_verl_name("nope") is None
    actor = OmegaConf.create({"actor_rollout_ref": {"actor": {"calculate_sum_pi_squared": False}}})
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        with pytest.raises(EBPOConfigError, match=f"adv_estimator={name} needs .*calculate_sum_pi_squared=True"):
            check_stock_verl_methods(actor, RunOptions(name), False)
    check_stock_verl_methods(actor, RunOptions("grpo"), False)
    with pytest.raises(ValueError, match="describe verl's own estimators"):
        EstimatorSpec("x", "s", "src", compute=compute_bnpo_advantages, sum_pi_squared=True)


def test_an_estimator_is_its_pure_function_bound_to_its_options_and_state():
    from ebpo_verl.algos.dbb import DBBOptions, DBBState, compute_dbb_advantages
    from ebpo_verl.algos.estimator import Batch
    from ebpo_verl.algos.krpo import KRPOOptions, compute_krpo_advantages

    uids = np.array(["a", "a", "b", "b", "pad1"], dtype=object)
    keys = np.array(["k1", "k1", "k2", "k2", None], dtype=object)
    valid = torch.ones(5, dtype=torch.bool)
    dbb, state = registry.new_estimator("dbb", DBBOptions()), DBBState()
    krpo = registry.new_estimator("krpo", {"order": "rows"})
    for scores in (torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0]), torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0])):
        got = dbb(scores, uids, valid, keys, "pad")
        want = compute_dbb_advantages(Batch(scores, uids, valid, keys, "pad"), DBBOptions(), state)
        assert torch.equal(got.values, want.values) and got.diagnostics == want.diagnostics
        assert dbb.state.state_dict() == state.state_dict() and state.steps > 0
        want = compute_krpo_advantages(Batch(scores, uids, valid, None, "pad"), KRPOOptions(order="rows")).values
        assert torch.equal(krpo(scores, uids, valid, None, "pad").values, want) and want[-1] == 0 and want.any()
    with pytest.raises(ValueError, match="estimator bnpo has no options"):
        registry.new_estimator("bnpo", {"x": 1})


@pytest.mark.parametrize(("page", "block"), [(p, b) for p, blocks in [("estimator.md", ["ebpo-options"]),
                         ("baselines.md", ["estimators", "estimator-options"])] for b in blocks])  # fmt: skip
def test_the_docs_tables_are_the_generated_ones(page, block):
    """docs/estimator.md and docs/baselines.md hold what the docs command writes; a stale table is seen."""
    from ebpo_verl.docs_tables import DocsOptions, pages, updated

    blocks = pages(DocsOptions(), REPO_ROOT)[f"docs/{page}"]
    text = (REPO_ROOT / "docs" / page).read_text()
    assert updated(page, text, blocks) == text, f"docs/{page}: run python -m ebpo_verl.docs_tables"
    stale = replace_marked_block(text, block, blocks[block]().replace("|---", "|--x", 1))
    assert updated(page, stale, blocks) != stale
    generated = blocks[block]()
    if block == "estimators":
        assert all(f"| `{name}` |" in generated for name in registry.estimators())
    elif block == "ebpo-options":
        assert "| `shrinkage` | `auto` | auto or a float in [0, 1] |" in generated
    else:
        assert "`algorithm.dbb` (dbb)" in generated and "| `discount` | `0.75` | a float in (0, 1] |" in generated


@pytest.mark.parametrize("name", ["ebpo_topic", "grpo_bn", "spo", "dbb", "bnpo", "shrinkage_js"])
def test_the_studys_own_objects_equal_verls_registry_path(name):
    """The study's estimate (its own object, as ebpo-train's) gives the advantages verl's registered function (the
    default instance, options from the node) gives, bit for bit, over three steps with recurring prompts."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from ebpo_verl.study.rl import ESTIMATORS, _advantages
    from ebpo_verl.trainer.adapter import DEFAULT_ESTIMATORS

    est = ESTIMATORS[name]
    fn = get_adv_estimator_fn(est.verl_name)
    for default in DEFAULT_ESTIMATORS.values():
        default.reset()
    estimate = registry.new_estimator(est.spec, est.overrides)
    config = OmegaConf.create({"adv_estimator": est.verl_name, est.spec.name: dict(est.overrides)})
    rng = np.random.default_rng(3)
    for step in range(3):
        problems = np.repeat(rng.choice(5, size=4, replace=False), 3)
        topics = np.array([["add", "sub"][p % 2] for p in problems], dtype=object)
        rewards = torch.tensor(rng.integers(0, 2, size=12), dtype=torch.float32)
        mask = torch.ones(12, 3, dtype=torch.bool)
        index = np.array([f"{step}-{p}" for p in problems], dtype=object)
        ours = _advantages(est, rewards, mask, index, topics, problems, None, estimate)
        tlr = torch.zeros(12, 3)
        tlr[:, -1] = rewards
        kwarg = {est.spec.row_kwarg: topics if est.spec.row_kwarg == "labels" else problems}
        theirs, _ = fn(token_level_rewards=tlr, response_mask=mask.float(), index=index, config=config, **kwarg)
        assert torch.equal(ours, theirs), (name, step)


# ------------------------------------------------------------------------ the toy: one module + one line

TOY_CHECKS = """
import contextlib, io, json, os, shutil, sys
from pathlib import Path

out, tmp, repo = {}, Path(sys.argv[1]), Path(sys.argv[2])

def call(main, argv, env=None):
    stdout, stderr = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env or {})
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as err:
            code = err.code
    os.environ.clear(); os.environ.update(saved)
    return {"rc": code or 0, "out": stdout.getvalue(), "err": stderr.getvalue()}

import ebpo_verl
from ebpo_verl.algos import registry
from verl.trainer.ppo import core_algos
from ebpo_verl.trainer import adapter
from ebpo_verl import docs_tables
from ebpo_verl.trainer.config import generate

ebpo_verl.register()
out["ours"] = list(registry.ours())
out["stateful"] = list(registry.stateful())
out["in_verl"] = core_algos.get_adv_estimator_fn("toy") is adapter.ESTIMATORS["toy"]
out["doc"] = adapter.ESTIMATORS["toy"].__doc__.splitlines()[0]
import torch, numpy as np
fn = core_algos.get_adv_estimator_fn("toy")
adv, _ = fn(torch.tensor([[1.0], [0.0], [1.0], [1.0]]), torch.ones(4, 1), np.array(["a", "a", "b", "b"], dtype=object))
out["first_step"] = adv[:, 0].tolist()
for part in ("README.md", "docs", "recipe", docs_tables.YAML):  # a copy of the pages the docs command writes
    (tmp / part).parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if (repo / part).is_dir() else shutil.copy)(repo / part, tmp / part)
out["generate_docs"] = call(docs_tables.main, ["--root", str(tmp)])
out["yaml"] = (tmp / docs_tables.YAML).read_text()
out["baselines_md"] = (tmp / "docs" / "baselines.md").read_text()
out["readme_table"] = generate.options_table()

from ebpo_verl import main as train
def ebpo_train(argv):
    sys.argv = ["ebpo-train", *argv]
    return train.main()
out["help"] = call(ebpo_train, ["--help"])
model = "actor_rollout_ref.model.path=Qwen/Qwen3-8B"  # a hub id: the pre-flight checks its form, loads nothing
out["cfg_ok"] = call(ebpo_train, ["--cfg", "job", "--package", "algorithm", model, "algorithm.adv_estimator=toy",
                                  "++algorithm.toy.decay=0.25"])
out["cfg_bad"] = call(ebpo_train, ["--cfg", "job", model, "algorithm.adv_estimator=toy", "++algorithm.toy.decay=2"])
out["cfg_bad_key"] = call(ebpo_train, ["--cfg", "job", model, "algorithm.adv_estimator=toy", "++algorithm.toy.decy=1"])
out["cfg_warn"] = call(ebpo_train, ["--cfg", "job", model, "algorithm.adv_estimator=toy", "++algorithm.toy.frozen=true",
                                    "++algorithm.toy.decay=0.25"])

from ebpo_verl.recipes.__main__ import main as recipes
from ebpo_verl.recipes.tables import COMPETITOR_ALGOS
work = str(tmp / "work")
recipe_env = {"WORK_DIR": work, "HOME": work, "ALGO": "toy"}
out["recipe_help"] = call(recipes, ["run", "qwen3_8b", "--help"])
out["recipe_overrides"] = call(recipes, ["run", "qwen3_8b"], {**recipe_env, "PRINT_OVERRIDES": "1"})
out["recipe_dry_run"] = call(recipes, ["run", "qwen3_8b"], {**recipe_env, "DRY_RUN": "1"})
out["competitors"] = list(COMPETITOR_ALGOS)
from ebpo_verl.study.rl import ESTIMATORS
out["study"] = list(ESTIMATORS)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """The toy's folder and what one fresh process that has it on PYTHONPATH observes (:data:`TOY_CHECKS`)."""
    tmp = tmp_path_factory.mktemp("toy")
    site = write_toy_site(tmp / "site")
    status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True)
    result = subprocess.run(
        [sys.executable, "-c", TOY_CHECKS, str(tmp), str(REPO_ROOT)],
        env=toy_env(site),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    after = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert after.stdout == status.stdout  # committed files untouched, nothing written into the checkout
    return site, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_new_estimator_is_one_module_and_one_registry_line(toy_run):
    _, seen = toy_run
    assert seen["ours"][-1] == "toy" and seen["stateful"][-1] == "toy"
    # registered in verl's registry, by a function made from its spec (docstring: summary and source)
    assert seen["in_verl"] and seen["doc"].startswith("Toy: a moving average") and "docs/architecture.md" in seen["doc"]
    np.testing.assert_allclose(seen["first_step"], [0.25, -0.75, 0.25, 0.25])  # r - mean(0.5, 1.0): 1st step
    # the generated YAML, docs tables and README table
    assert "  toy:\n" in seen["yaml"] and "    decay: 0.5\n" in seen["yaml"]
    assert seen["generate_docs"]["rc"] == 0
    docs = seen["baselines_md"]
    assert "| `toy` | `toy` | Toy: a moving average" in docs and "`toy_state.json`" in docs
    assert "`algorithm.toy` (toy):" in docs and "| `decay` | `0.5` | a float in [0, 1] |" in docs
    other_row = next(r for r in seen["readme_table"].splitlines() if r.startswith("| `algorithm.<name>` |"))
    assert "`toy`" in other_row  # a non-default estimator's section: one row names each (tables: baselines.md)
    # ebpo-train: --help, --cfg job accepts it and refuses a bad value or key in one line, exit 2
    help_text = seen["help"]["out"]
    assert seen["help"]["rc"] == 0 and "running_norm and toy (algorithm.adv_estimator" in help_text.replace("\n", " ")
    assert "  algorithm.toy: decay=0.5, frozen=false, on_resume_mismatch=error" in help_text
    ok = seen["cfg_ok"]
    assert ok["rc"] == 0 and "pre-flight: ok" in ok["err"] and "decay: 0.25" in ok["out"], ok["err"][-2000:]
    for bad, what in ((seen["cfg_bad"], "algorithm.toy.decay=2"), (seen["cfg_bad_key"], "algorithm.toy.decy")):
        assert bad["rc"] == 2 and bad["out"] == "", bad
        assert bad["err"].count("\n") == 1 and bad["err"].startswith("ebpo-train: error: ") and what in bad["err"]
    # the spec's warning: named by ebpo-train's pre-flight, the run going on
    warned = seen["cfg_warn"]
    assert warned["rc"] == 0 and "pre-flight: ok" in warned["err"], warned["err"][-2000:]
    warning = "ebpo-train: warning: algorithm.toy option(s) decay=0.25 have no effect with frozen=true\n"
    assert warning in warned["err"] and warning not in ok["err"]
    # the recipes: an ALGO preset, in the help, a dry run that passes its pre-flight, a competitor row
    assert "  toy " in seen["recipe_help"]["out"] and "Toy: a moving average" in seen["recipe_help"]["out"]
    assert "algorithm.adv_estimator=toy" in seen["recipe_overrides"]["out"].splitlines()
    dry = seen["recipe_dry_run"]
    assert dry["rc"] == 0 and "pre-flight: ok" in dry["out"] + dry["err"], (dry["err"] + dry["out"])[-2000:]
    assert "adv_estimator: toy" in dry["out"]
    rivals = ["jspo", "jspo_history", "ha_dw", "krpo", "running_norm"]
    assert seen["competitors"] == ["otb", "kl_cov", "dbb", *rivals, "toy"] and "toy" in seen["study"]


@pytest.mark.slow
def test_the_study_runs_the_toy(toy_run, tmp_path):
    """``python -m ebpo_verl.study --preset tiny --estimators toy``: its own object per run, in the report."""
    site, _ = toy_run
    result = subprocess.run(
        [sys.executable, "-m", "ebpo_verl.study", "--preset", "tiny", "--estimators", "toy", "--out", str(tmp_path)],
        env=toy_env(site),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]
    assert {r["config"]["estimator"] for r in runs} == {"toy"} and len(runs) == 2 * 2  # G in {4, 8} x 2 seeds
    assert "toy" in (tmp_path / "study.md").read_text()


# ------------------------------------------------------------ the toy's state through the trainer's checkpoints


@pytest.fixture
def toy_in_process(tmp_path, monkeypatch):
    """The toy's entry point on this process's path, the registry read again; undone afterwards."""
    monkeypatch.syspath_prepend(str(write_toy_site(tmp_path / "site")))
    registry.estimators.cache_clear()
    yield registry.get("toy")
    sys.modules.pop("ebpo_toy", None)
    registry.estimators.cache_clear()


def _toy_step(trainer, step: int) -> tuple[torch.Tensor, list[str], list[float]]:
    """One step of 4 prompts x 3 responses + a padding row through the trainer's estimator call."""
    uids, rewards = [], []
    for pid in next(trainer._data_iter).tolist():
        gen = torch.Generator().manual_seed(1000 * step + pid)
        rewards += (torch.rand(3, generator=gen) < (pid + 1) / 7).float().tolist()
        uids += [f"{step}-{pid}"] * 3
    mask = torch.ones(len(uids) + 1, 2)
    mask[-1] = 0
    tlr = torch.zeros(len(uids) + 1, 2)
    tlr[:-1, 1] = torch.tensor(rewards)
    index = np.array([*uids, "pad0"], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": tlr, "response_mask": mask}, non_tensors={"uid": index})
    data.batch["advantages"], data.batch["returns"], _ = advantage_step(data, trainer.estimator, None)
    return data.batch["advantages"][:, 0].clone(), uids, rewards


def test_the_toys_state_is_checkpointed_and_resumed_exactly(toy_in_process, tmp_path, compose_config, stand_in_trainer):
    """verl's trainer (EBPO's sync trainer class, no workers) saves the toy's state in every checkpoint and a resume
    continues bit-identically to an uninterrupted run, which equals the hand computation."""
    config = compose_config(
        "algorithm.adv_estimator=toy",
        "++algorithm.toy.decay=0.25",
        "actor_rollout_ref.rollout.n=3",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    )
    rows = [i % 6 for i in range(32)]
    uninterrupted = stand_in_trainer.run(stand_in_trainer(config, rows, 4), range(1, 8), _toy_step)
    reference = _reference_toy([(u, r) for _, u, r in uninterrupted], 0.25)
    for (adv, _, _), expected in zip(uninterrupted, reference, strict=True):
        np.testing.assert_allclose(adv[:-1].numpy(), expected, rtol=1e-6)
        assert adv[-1] == 0
    first = stand_in_trainer(config, rows, 4)
    before = stand_in_trainer.run(first, range(1, 4), _toy_step)
    first.global_steps = 3
    first._save_checkpoint()
    saved = json.loads((tmp_path / "ckpt" / "global_step_3" / "toy_state.json").read_text())
    assert saved["global_step"] == 3 and saved["options"]["decay"] == 0.25 and saved["state"]["steps"] == 3
    resumed = stand_in_trainer(config, rows, 4)
    stand_in_trainer.run(resumed, range(90, 92), _toy_step)  # a different average before the load
    resumed._load_checkpoint()
    assert resumed.global_steps == 3 and resumed.estimator.state.state_dict() == saved["state"]
    resumed._data_iter = iter(resumed.train_dataloader)
    after = stand_in_trainer.run(resumed, range(4, 8), _toy_step)
    for (a, _, _), (b, _, _) in zip(before + after, uninterrupted, strict=True):
        assert torch.equal(a, b)
    changed = compose_config(
        "algorithm.adv_estimator=toy", "++algorithm.toy.decay=0.5", f"trainer.default_local_dir={tmp_path / 'ckpt'}"
    )
    other = stand_in_trainer(changed, rows, 4)
    other.global_steps = 3
    with pytest.raises(ValueError, match=r"algorithm.toy differs .*\(decay: 0.25 -> 0.5\)"):
        other._load_checkpoint()


def test_the_toys_warning_reaches_the_preflight_and_frozen_keeps_its_first_baseline(
    toy_in_process, compose_config, capsys
):
    """The toy's spec declares a warning (docs/architecture.md): ebpo-train's pre-flight prints it, as EBPO's, and
    nothing when the options ignore nothing; frozen=true keeps the first step's mean group mean as the baseline."""
    from ebpo_verl.trainer.preflight import WARNINGS, check_config

    def warnings_of(*overrides: str) -> list[str]:  # the pre-flight's warnings (verl's registry: the slow test's)
        config = compose_config("algorithm.adv_estimator=toy", "actor_rollout_ref.rollout.n=3", *overrides)
        for warn in WARNINGS:
            warn(config, check_config(config), True)
        return [line for line in capsys.readouterr().err.splitlines() if "warning" in line]

    assert warnings_of("++algorithm.toy.frozen=true", "++algorithm.toy.decay=0.25") == [
        "ebpo-train: warning: algorithm.toy option(s) decay=0.25 have no effect with frozen=true"
    ]
    assert warnings_of("++algorithm.toy.decay=0.25") == warnings_of("++algorithm.toy.frozen=true") == []
    frozen = registry.new_estimator(toy_in_process, {"frozen": True, "decay": 0.25})
    uids, valid = np.array(["a", "a", "b", "b"], dtype=object), torch.ones(4, dtype=torch.bool)
    for rewards in ([1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]):
        got = frozen(torch.tensor(rewards), uids, valid, None).values
        np.testing.assert_allclose(got.numpy(), np.asarray(rewards) - 0.75)  # (0.5 + 1.0) / 2, the first step's


LABELLED_TOY = """
from dataclasses import dataclass
from typing import ClassVar

from ebpo_toy import ToyState, compute_toy_advantages, ToyOptions
from ebpo_verl.algos.registry import EstimatorSpec, StateSpec
from ebpo_verl.options.parsing import nullable, text


@dataclass(frozen=True)
class LabelledToyOptions(ToyOptions):
    SECTION: ClassVar[str] = "algorithm.toy_labels"

    label_key: str | None = nullable("extra_info field of each prompt's label (null: none)", text("a field name"))


SPECS = (
    EstimatorSpec("toy_labels", "the toy reading a label per row", "tests/test_registry.py",
                  compute=compute_toy_advantages, options_cls=LabelledToyOptions,
                  state=StateSpec(ToyState, "toy_labels_state.json", "TOY", "moving average"), row_input="label_key"),
)
"""
"""The toy with a per-row label option (its math does not read it): an out-of-tree row key, for the messages."""


def test_an_out_of_tree_row_key_is_named_by_its_own_option(toy_in_process, tmp_path, compose_config):
    """An estimator of another package (entry point) that reads a per-row field: the training rows' check (the
    trainer's dataset) names its own option, ``algorithm.toy_labels.label_key``, and offers null, which it takes."""
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight.data import check_row_keys
    from ebpo_verl.trainer.run_options import RunOptions

    site = tmp_path / "site"
    (site / "ebpo_toy_labels.py").write_text(LABELLED_TOY)
    info = site / "ebpo_toy_labels-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ebpo-toy-labels\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\ntoy_labels = ebpo_toy_labels\n")
    registry.estimators.cache_clear()
    try:
        assert registry.get("toy_labels").row_option == "algorithm.toy_labels.label_key"
        config = compose_config("algorithm.adv_estimator=toy_labels", "++algorithm.toy_labels.label_key=domain")
        with pytest.raises(EBPOConfigError) as err:
            check_row_keys([{"topic": "a"}], RunOptions.from_config(config), "x.parquet")
        assert str(err.value) == (
            "algorithm.toy_labels.label_key='domain' is not a key of extra_info in the training data (x.parquet); "
            "extra_info keys present: ['topic']. Pick one of them, or add the labels to the data (ebpo_verl.data), "
            "or set algorithm.toy_labels.label_key=null."
        )
    finally:
        sys.modules.pop("ebpo_toy_labels", None)


def test_import_verl_alone_registers_every_estimator_and_registering_again_changes_nothing():
    """What ``python -m verl.trainer.main_ppo algorithm.adv_estimator=<name>`` relies on: in a fresh process,
    ``import verl`` alone loads the ``verl.plugins`` entry point, and verl's registry then holds every estimator of
    the package registry as the adapter's function; registering twice more and reloading the adapter (which
    registers again) leaves verl's registry on the reloaded adapter's functions (a process of its own: a reload
    here would leave this process's tests holding the old module's default instances)."""
    code = (
        "import importlib, sys, verl\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "print('ebpo_verl' in sys.modules)\n"
        "import ebpo_verl, ebpo_verl.trainer.adapter as adapter\n"
        "from ebpo_verl.algos import registry\n"
        "names = sorted(registry.ours())\n"
        "assert all(get_adv_estimator_fn(n) is adapter.ESTIMATORS[n] for n in names), names\n"
        "ebpo_verl.register(); ebpo_verl.register(); importlib.reload(adapter)\n"
        "assert all(get_adv_estimator_fn(n) is adapter.ESTIMATORS[n] for n in names), 'after reload'\n"
        "print(' '.join(names))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, names = done.stdout.strip().splitlines()[-2:]
    assert loaded == "True"
    in_tree = [s.name for m in registry.MODULES for s in registry._specs_of(m) if not s.builtin]
    assert sorted(in_tree) == names.split() and {"ebpo", "dbb", "jspo", "krpo", "running_norm"} <= set(in_tree)
