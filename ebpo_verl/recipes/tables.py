"""The paper's tables as the recipes reproduce them: rows (section, label, model, preset, G, order), each table's
schedule and cost, declared once. The paper's numbers for the same labels are in :mod:`ebpo_verl.recipes.paper`.

Every table runs on the authors' schedule unless the environment says otherwise: validation on AIME24 x 8
before training and every 5 steps, a checkpoint every 10; the main tables stop at global step 200 (the
authors' evaluated checkpoint), the curriculum after one epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ebpo_verl.algos import registry
from ebpo_verl.recipes.presets import PRESETS, row_order
from ebpo_verl.recipes.spec import Model

PAPER_SCHEDULE = {"TEST_FREQ": "5", "SAVE_FREQ": "10", "VAL_SETS": "aime2024", "VAL_N": "8"}
"""The authors' validation and checkpoint cadence (docs/paper_notes.md, "The authors' own runs")."""

MAIN_ALGOS = ("grpo", "drgrpo", "dapo", "entropy_mech", "ebpo")
V2_ALGOS = ("reinforce_pp", "rloo", "spo", "bnpo", "shrinkage_js", "ebpo_bb")
"""The v2 draft's extra Qwen3-8B rows of the main table (V2_ROWS=1): the rows that paper reports, a fact of it."""
COMPETITOR_ALGOS = ("otb", "kl_cov", *(name for name in registry.ours() if name not in (*MAIN_ALGOS, *V2_ALGOS)))
"""Competitors the paper does not run (V2_ROWS=1): verl's Optimal Token Baseline and KL-Cov, and every estimator of
ours the paper does not run (from the registry: Discounted Beta-Bernoulli, ``dbb``, and any added one), on Qwen3-8B
in the main (G=4) and group-size (G=8/16/32) tables."""
GROUP_SIZES = (8, 16, 32)
RIVAL_ALGOS = ("grpo", "rloo", "otb", "bnpo", "spo", "dbb", "jspo", "jspo_history", "ha_dw", "krpo", "running_norm",
               "ebpo")  # fmt: skip
"""The rivals table's methods (docs/rivals.md): verl's and the package's baselines, the 2025-2026 rivals, EBPO."""
EQUAL_SAMPLES = 2048
"""Responses per step of the rivals table's equal-samples rows (the paper's 512 prompts x G = 4)."""
RIVAL_GROUP_SIZES = (2, 4, 8)


@dataclass(frozen=True)
class Row:
    """One training run of a table: its cell (section, method label), model config and switches."""

    section: str
    method: str
    model: str
    name: str
    """Experiment name before ``-rw_<REWARD>-bl_<BASELINES>`` and the variant suffix."""
    env: Mapping[str, str] = field(default_factory=dict)


def _row(section: str, method: str, model: str, algo: str, group: int, order: str, **env: str) -> Row:
    return Row(section, method, model, f"{model}-{algo}-g{group}-{order}",
               {"ALGO": algo, "GROUP_SIZE": str(group), "ORDER": order, **env})  # fmt: skip


def _label(model: str) -> str:
    return Model.load(model).label


def _preset_row(section: str, model: str, algo: str, group: int, baselines: str) -> Row:
    return _row(section, PRESETS[algo].label, model, algo, group, row_order(algo, baselines))


def main_rows(env: Mapping[str, str], baselines: str) -> list[Row]:
    v2 = {"qwen3_8b": (*V2_ALGOS, *COMPETITOR_ALGOS), "qwen3_14b": ("ebpo_bb",)} if env.get("V2_ROWS") == "1" else {}
    return [
        _preset_row(_label(model), model, algo, 4, baselines)
        for model in ("qwen3_8b", "qwen3_14b", "llama3_8b")
        for algo in (*MAIN_ALGOS, *v2.get(model, ()))
    ]


def group_size_rows(env: Mapping[str, str], baselines: str) -> list[Row]:
    algos = ["ebpo", "grpo", "dapo"] + (list(COMPETITOR_ALGOS) if env.get("V2_ROWS") == "1" else [])
    return [_preset_row(f"G={g}", "qwen3_8b", algo, g, baselines) for g in GROUP_SIZES for algo in algos]


def grpo_bn_rows(env: Mapping[str, str], baselines: str) -> list[Row]:
    return [
        _preset_row(_label(model), model, algo, 4, baselines)
        for model in ("qwen3_8b", "qwen3_14b")
        for algo in ("grpo", "grpo_bn", "ebpo")
    ]


FORK_ORDERED = ("shrinkage_js", "bnpo")
"""The authors' newest runs (fork commit 75b0147, docs/paper_notes.md#authors-runs): JS and BNPO on Qwen3-8B and
Qwen3-14B, G = 4, KL loss 0.001, shuffled (``_gen_extra_baselines.py``) and topic-ordered (``_gen_topic_extra.py``)."""


def ordering_rows(env: Mapping[str, str], baselines: str) -> list[Row]:
    rows = []
    for model in ("qwen3_8b", "qwen3_14b"):
        section = _label(model)
        if env.get("GPT_TOPIC_FILE"):
            rows.append(Row(section, "EBPO-topic (GPT-4.1 labels)", model, f"{model}-ebpo-g4-topic_gpt",
                            {"ALGO": "ebpo", "GROUP_SIZE": "4", "ORDER": "topic", "TOPICS": "file",
                             "TRAIN_FILE": env["GPT_TOPIC_FILE"]}))  # fmt: skip
        rows.append(_row(section, "EBPO-topic (embedding labels)", model, "ebpo", 4, "topic"))
        rows.append(_row(section, "EBPO-naive", model, "ebpo", 4, "naive"))
        if env.get("FORK_ROWS") == "1":
            rows += [_row(section, f"{PRESETS[algo].label}-{order}", model, algo, 4, order)
                     for algo in FORK_ORDERED for order in ("topic", "random")]  # fmt: skip
    return rows


CURRICULUM_MODELS = (
    ("Qwen3-8B-Base", "qwen3_8b", "BASE_MODEL", "Qwen/Qwen3-8B-Base", ("ebpo", "grpo", "drgrpo", "dapo")),
    ("Qwen3-14B-Base", "qwen3_14b", "BASE_MODEL_14B", "Qwen/Qwen3-14B-Base", ("ebpo", "grpo")),
)
"""(section, model config, switch for the base model's path, its default, presets) of the curriculum table: the
paper's Qwen3-8B-Base runs and the two Qwen3-14B-Base runs whose step-34 eval logs the authors released."""


FORK_SMALL = (("qwen3_1_7b", "grpo", "naive"), ("qwen3_4b", "grpo", "naive"), ("qwen3_4b", "dapo", "difficulty"))
"""(model config, preset, order) of the authors' newest one-epoch runs (fork commit 75b0147,
``recipe/ebpo/{grpo,dapo}_fsdp_math_17k_sorted_qwen3_{1_7b,4b}_base_multi_nodes.sh``): despite "base" in the names
their MODEL_PATH is Qwen3-1.7B / Qwen3-4B, and the GRPO scripts read the unsorted file with shuffle off (file
order) while DAPO reads the sorted one (docs/paper_notes.md#authors-runs)."""


def curriculum_rows(env: Mapping[str, str], baselines: str) -> list[Row]:
    rows = [
        Row(section, f"{PRESETS[algo].label}-diff", model, f"{model}_base-{algo}-g4-difficulty",
            {"ALGO": algo, "GROUP_SIZE": "4", "ORDER": "difficulty", "TOTAL_EPOCHS": "1",
             "MODEL_PATH": env.get(switch) or default})
        for section, model, switch, default, algos in CURRICULUM_MODELS
        for algo in algos
    ]  # fmt: skip
    if env.get("FORK_ROWS") == "1":
        rows += [_row(_label(model), f"{PRESETS[algo].label}-{'diff' if order == 'difficulty' else order}", model,
                      algo, 4, order, TOTAL_EPOCHS="1") for model, algo, order in FORK_SMALL]  # fmt: skip
    return rows


def rivals_rows(env: Mapping[str, str], baselines: str) -> list[Row]:
    """Every rival at G = 2, 4, 8 on Qwen3-8B with 2048 / G prompts per step (G = 4: the main table's 512)."""
    rows = []
    for g in RIVAL_GROUP_SIZES:
        batch = EQUAL_SAMPLES // g
        for algo in RIVAL_ALGOS:
            row = _preset_row(f"G={g} x {batch} prompts", "qwen3_8b", algo, g, baselines)
            if g != 4:  # another batch than the shared setup's 512: its own run name
                row = replace(row, name=f"{row.name}-b{batch}", env={**row.env, "TRAIN_BATCH": str(batch)})
            rows.append(row)
    return rows


@dataclass(frozen=True)
class Table:
    """A paper table: its rows (from the environment: V2_ROWS, FORK_ROWS, GPT_TOPIC_FILE, BASE_MODEL(_14B),
    BASELINES), the step the runs stop at (None: after the epochs), and what it is and costs (``--help``)."""

    name: str
    about: str
    rows: Callable[[Mapping[str, str], str], list[Row]]
    total_steps: int | None = 200

    def schedule_defaults(self) -> dict[str, str]:
        steps = {"TOTAL_STEPS": str(self.total_steps)} if self.total_steps else {}
        return {**steps, **PAPER_SCHEDULE}


TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        Table(
            "main",
            "Main table (paper Table 1): Qwen3-8B, Qwen3-14B, LLaMA-3.1-8B-Instruct x GRPO, Dr.GRPO, DAPO,\n"
            "EntropyMech, EBPO; G=4. EBPO: topic order; baselines: shuffled (BASELINES=paper, as the authors ran\n"
            "them) or topic order (BASELINES=canonical). V2_ROWS=1 adds the v2 draft's rows (Qwen3-8B: REINFORCE++,\n"
            "RLOO, SPO, BNPO, JS, EBPO-BB; Qwen3-14B: EBPO-BB) and the competitors OTB, KL-Cov, DBB and the\n"
            "rivals JSPO, JSPO-hist, HA-DW, KRPO, RunNorm (Qwen3-8B). 15 runs (30 with V2_ROWS) of 4 x 8 H200 each.",
            main_rows,
        ),
        Table(
            "group_size",
            "Group-size table (paper Table 2): Qwen3-8B, G = 8, 16, 32 x EBPO, GRPO, DAPO (V2_ROWS=1: also OTB,\n"
            "KL-Cov, DBB and the five rivals). 9 runs (33 with V2_ROWS) of 4 x 8 H200 each (G=32 generates 16,384\n"
            "responses per step).",
            group_size_rows,
        ),
        Table(
            "ordering",
            "Ordering ablation (paper Table 3): EBPO with topic-clustered batches (embedding labels:\n"
            "all-MiniLM-L6-v2, UMAP, k-means K=10, seed 42) vs the native order (EBPO-naive), Qwen3-8B and\n"
            "Qwen3-14B, G=4. GPT_TOPIC_FILE=<parquet with extra_info.topic> adds the GPT-4.1-label rows;\n"
            "FORK_ROWS=1 the authors' newest runs: JS and BNPO in topic and random order (Qwen3-8B, Qwen3-14B).\n"
            "4 runs (6 with GPT_TOPIC_FILE, +8 with FORK_ROWS); the embedding-topic runs are the main table's\n"
            "EBPO runs, the Qwen3-8B random-order JS and BNPO runs its V2_ROWS runs.",
            ordering_rows,
        ),
        Table(
            "curriculum",
            "Curriculum (paper, EBPO-diff): prompts easy -> hard by the base model's pass rate (16 rollouts at\n"
            "temperature 1.0, computed before the model's first run), one epoch. Qwen3-8B-Base (BASE_MODEL):\n"
            "EBPO-diff, GRPO-diff, Dr.GRPO-diff, DAPO-diff; Qwen3-14B-Base (BASE_MODEL_14B): EBPO-diff, GRPO-diff\n"
            "(the runs of the authors' released logs). The table shows the paper figure's EBPO-diff minus\n"
            "GRPO-diff and the authors' logged numbers. 6 runs of 4 x 8 H200 plus one pass-rate pass per model.\n"
            "FORK_ROWS=1 adds the authors' newest one-epoch runs: GRPO on Qwen3-1.7B and Qwen3-4B (file order),\n"
            "DAPO-diff on Qwen3-4B (3 runs; their model configs: qwen3_1_7b, qwen3_4b).",
            curriculum_rows,
            total_steps=None,
        ),
        Table(
            "rivals",
            "The rivals' table (docs/rivals.md): Qwen3-8B, GRPO, RLOO, OTB, BNPO, SPO, DBB, JSPO, JSPO-hist, HA-DW,\n"
            "KRPO, RunNorm and EBPO at equal samples per step: 2048 responses as G = 2, 4, 8 x 1024, 512, 256\n"
            "prompts (TRAIN_BATCH); the G = 4 rows are the main table's setting and share its runs. 36 runs of\n"
            "4 x 8 H200 each.",
            rivals_rows,
        ),
        Table(
            "grpo_bn",
            "GRPO with batch-std normalisation (isolates the shrinkage): GRPO+BN = EBPO with S = 0, next to GRPO\n"
            "and EBPO, Qwen3-8B and Qwen3-14B, G=4. 6 runs, 4 of them shared with the main table.",
            grpo_bn_rows,
        ),
    )
}
"""Table name -> definition (``python -m ebpo_verl.recipes table <name>``, ``recipe/ebpo/table_<name>.sh``;
``python -m ebpo_verl.recipes.make_tables --table <name>``)."""
