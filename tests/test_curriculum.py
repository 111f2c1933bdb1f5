"""CurriculumDataset on prepared data (MATH train and OlympiadBench from ``hub_data``: the real files, or on a clone
the fixture rows), through verl's own config, dataset factory, sampler and (torchdata) StatefulDataLoader. Expected
orders are recomputed here from the parquet files read with pandas; batch sizes follow the files' sizes."""

from __future__ import annotations

import copy
from collections import Counter
from itertools import groupby
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import open_dict
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
from verl.utils.dataset.rl_dataset import collate_fn

from ebpo_verl.algos.ordering import CurriculumOptions, epoch_layout
from ebpo_verl.trainer.curriculum import CurriculumDataset, validate_curriculum_config

CLS = ["data.custom_cls.path=pkg://ebpo_verl.trainer.curriculum", "data.custom_cls.name=CurriculumDataset"]


def unlabelled(n: int) -> tuple[int, ...]:
    """The rows of an n-row OlympiadBench file whose topic the ``olympiad_gaps`` file removes."""
    return (3, n // 4, n // 4 + 1, n * 3 // 5, n - 1)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, hub_data) -> dict[str, Path]:
    from ebpo_verl.data import math_train, olympiadbench

    out = tmp_path_factory.mktemp("curriculum_data")
    files = {
        "math": math_train.prepare(out, local_path=hub_data / "math_train.jsonl", skip_invalid=True),
        "olympiad": olympiadbench.prepare(out, local_path=hub_data / "olympiadbench_math_en.jsonl"),
    }
    # pass rates for the pass_rate ordering: a known function of the row index
    df = pd.read_parquet(files["olympiad"])
    df["extra_info"] = [{**e, "pass_rate": (e["index"] * 37 % 17) / 16} for e in df["extra_info"]]
    files["olympiad_pass_rate"] = out / "olympiad_pass_rate.parquet"
    df.to_parquet(files["olympiad_pass_rate"])
    # five rows without a topic
    df = pd.read_parquet(files["olympiad"])
    gaps = unlabelled(len(df))
    df["extra_info"] = [{**e, "topic": None} if e["index"] in gaps else e for e in df["extra_info"]]
    files["olympiad_gaps"] = out / "olympiad_gaps.parquet"
    df.to_parquet(files["olympiad_gaps"])
    return files


@pytest.fixture(scope="module")
def frames(prepared) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(path) for name, path in prepared.items()}


@pytest.fixture(scope="module")
def sizes(frames) -> dict[str, int]:
    """Batch sizes for the files in use: on the real ones (7,498 MATH train rows, 674 OlympiadBench) the paper's
    512 prompts and 64; on the fixture rows (tens) 4 and 4, so that each topic still fills several batches.
    ``block``: a block size that is no multiple of the MATH batch."""
    if len(frames["math"]) > 4096:
        return {"math": 512, "olympiad": 64, "block": 100}
    return {"math": 4, "olympiad": 4, "block": 3}


@pytest.fixture(scope="module")
def base_config(sizes):
    """verl's real ppo_trainer config (Hydra compose of the installed wheel), curriculum class selected."""
    batch = sizes["math"]
    overrides = [*CLS, "data.shuffle=False", "data.dataloader_num_workers=0", f"data.train_batch_size={batch}"]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=[*overrides, "+data.curriculum.order=native"])


@pytest.fixture(scope="module")
def make(base_config, prepared, tiny_tokenizer):
    """make(train, curriculum={...}, **data_overrides) -> dataset built by verl's create_rl_dataset."""

    def _make(train="math", curriculum=None, val="olympiad", files=None, **data):
        cfg = copy.deepcopy(base_config)
        with open_dict(cfg):
            cfg.data.train_files = str(prepared[train])
            cfg.data.val_files = str(prepared[val])
            cfg.data.curriculum = curriculum or {}
            for key, value in data.items():
                cfg.data[key] = value
        return create_rl_dataset(str(prepared[files or train]), cfg.data, tiny_tokenizer, None)

    return _make


def served(ds, epochs: int = 1) -> list[list[int]]:
    """File rows (= extra_info.index for ebpo_verl.data output) at positions 0, 1, ... pass by pass: the map that
    __getitem__ applies before verl's RLHFDataset.__getitem__ (whole rows are read in the dataloader tests)."""
    return [[ds._row(p) for p in range(len(ds))] for _ in range(epochs)]


def labels(frame: pd.DataFrame, key: str, rows) -> list:
    by_index = {e["index"]: e.get(key) for e in frame["extra_info"]}
    return [by_index[r] for r in rows]


def pure_batches(topics: list, batch: int) -> int:
    full = len(topics) // batch
    return sum(Counter(topics[b * batch : (b + 1) * batch]).most_common(1)[0][1] >= 0.9 * batch for b in range(full))


# -- orders ---------------------------------------------------------------------------------------------


def test_native_is_file_order(make, frames):
    ds = make()
    assert isinstance(ds, CurriculumDataset)
    rows = [[ds[p]["extra_info"]["index"] for p in range(len(ds))] for _ in range(2)]
    assert rows[0] == rows[1] == [e["index"] for e in frames["math"]["extra_info"]] == list(range(len(ds)))


def test_random_is_seeded_per_epoch_permutation(make, frames):
    n = len(frames["math"])
    a0, a1 = served(make(curriculum={"order": "random", "seed": 3}), 2)
    assert sorted(a0) == sorted(a1) == list(range(n))
    assert a0 != a1 and a0 != list(range(n))
    assert [a0, a1] == served(make(curriculum={"order": "random", "seed": 3}), 2)  # a fresh process would agree
    assert served(make(curriculum={"order": "random", "seed": 4}))[0] != a0
    # seed defaults to data.seed
    assert served(make(curriculum={"order": "random"}, seed=3))[0] == a0


@pytest.mark.parametrize("align", [True, False])
def test_topic_blocks_and_purity_on_math(make, frames, sizes, align):
    frame, batch = frames["math"], sizes["math"]
    counts = Counter(e["topic"] for e in frame["extra_info"])
    ds = make(curriculum={"order": "topic", "align": align, "seed": 1})
    (e0, e1) = served(ds, 2)
    assert sorted(e0) == sorted(e1) == sorted(frame["extra_info"].map(lambda e: e["index"]))
    t0 = labels(frame, "topic", e0)
    if align:
        head = sum(c // batch * batch for c in counts.values())
        runs = [(k, len(list(g))) for k, g in groupby(t0[:head])]
        assert dict(runs) == {k: c // batch * batch for k, c in counts.items() if c >= batch}
        assert len(runs) == len(dict(runs))  # one contiguous block per topic
        assert Counter(t0[head:]) == {k: c % batch for k, c in counts.items() if c % batch}
        assert pure_batches(t0, batch) >= sum(c // batch for c in counts.values()) >= len(counts)
    else:
        runs = [(k, len(list(g))) for k, g in groupby(t0)]
        assert sorted(runs) == sorted(counts.items())
        assert pure_batches(t0, batch) < sum(c // batch for c in counts.values())  # blocks straddle batches
    t1 = labels(frame, "topic", e1)
    assert e1 != e0 and [k for k, _ in groupby(t1)] != [k for k, _ in groupby(t0)]  # new block order
    assert served(make(curriculum={"order": "topic", "align": align, "seed": 1}), 2) == [e0, e1]


def test_topic_default_align_and_seed_change(make, frames):
    aligned = served(make(curriculum={"order": "topic", "seed": 1}))[0]
    assert aligned == served(make(curriculum={"order": "topic", "align": True, "seed": 1}))[0]
    assert served(make(curriculum={"order": "topic", "seed": 2}))[0] != aligned


def test_topic_block_size_interleaves(make, frames, sizes):
    frame, batch, small = frames["math"], sizes["math"], sizes["block"]
    ds = make(curriculum={"order": "topic", "block_size": batch, "seed": 0})
    t0 = labels(frame, "topic", served(ds)[0])
    counts = Counter(e["topic"] for e in frame["extra_info"])
    head = sum(c // batch * batch for c in counts.values())
    assert all(len(set(t0[i : i + batch])) == 1 for i in range(0, head, batch))
    assert len([k for k, _ in groupby(t0[:head])]) > len(counts)  # topics come back: interleaved
    ds = make(curriculum={"order": "topic", "block_size": small, "align": False, "seed": 0})
    t0 = labels(frame, "topic", served(ds)[0])
    starts = np.cumsum([0] + [b.size for b in ds.layout(0).blocks])
    assert all(b.size <= small for b in ds.layout(0).blocks)
    assert all(len(set(t0[s:e])) == 1 for s, e in zip(starts[:-1], starts[1:], strict=True))


def test_topic_on_olympiadbench(make, frames, sizes):
    frame, batch = frames["olympiad"], sizes["olympiad"]
    counts = Counter(e["topic"] for e in frame["extra_info"])
    ds = make("olympiad", {"order": "topic"}, val="math", train_batch_size=batch)
    t0 = labels(frame, "topic", served(ds)[0])
    assert pure_batches(t0, batch) >= sum(c // batch for c in counts.values()) >= len(counts)


def test_difficulty_is_monotone_with_shuffled_ties(make, frames):
    frame = frames["math"]
    ds = make(curriculum={"order": "difficulty", "missing": "last", "seed": 0})
    e0, e1 = served(ds, 2)
    d0 = labels(frame, "difficulty", e0)
    missing = sum(e["difficulty"] is None for e in frame["extra_info"])
    assert missing > 0 and all(d is None for d in d0[-missing:])  # "Level ?" rows last
    assert d0[:-missing] == sorted(d0[:-missing])
    assert Counter(d0) == Counter(e["difficulty"] for e in frame["extra_info"])
    level1 = [i for i, d in zip(e0, d0, strict=True) if d == 1]
    assert level1 != sorted(level1)  # ties in seeded random order, not file order
    assert e1 != e0 and labels(frame, "difficulty", e1)[:-missing] == d0[:-missing]
    back = labels(
        frame, "difficulty", served(make(curriculum={"order": "difficulty", "missing": "last", "descending": True}))[0]
    )
    assert back[:-missing] == sorted(d0[:-missing], reverse=True)


def test_difficulty_prefers_pass_rate(make, frames, sizes):
    frame = frames["olympiad_pass_rate"]
    ds = make("olympiad_pass_rate", {"order": "difficulty"}, val="math", train_batch_size=sizes["olympiad"])
    rates = labels(frame, "pass_rate", served(ds)[0])
    assert rates == sorted(rates, reverse=True) and len(set(rates)) == 17  # easy (high pass rate) first


# -- refusals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["native", "topic", "difficulty"])
def test_shuffle_true_is_refused(make, order):
    with pytest.raises(ValueError, match=r"needs data.shuffle=False.*RandomSampler"):
        make(curriculum={"order": order}, shuffle=True)


def test_random_with_shuffle_leaves_order_to_verls_sampler(make, frames):
    ds = make(curriculum={"order": "random"}, shuffle=True, seed=5)
    assert served(ds)[0] == list(range(len(frames["math"])))
    sampler = create_rl_sampler(ds.config, ds)
    assert type(sampler).__name__ == "RandomSampler"


def test_config_errors(make, base_config, sizes):
    message = r"unknown option data.curriculum.oder; did you mean data.curriculum.order\? valid keys: order, align"
    with pytest.raises(ValueError, match=message):
        make(curriculum={"oder": "topic"})
    with pytest.raises(ValueError, match=r"order='topics' is invalid; use native, random, topic or difficulty"):
        make(curriculum={"order": "topics"})
    with pytest.raises(ValueError, match="dataloader_num_workers=0"):
        make(curriculum={"order": "topic"}, dataloader_num_workers=8)
    with pytest.raises(ValueError, match=f"multiple of data.train_batch_size={sizes['math']}"):
        make(curriculum={"order": "topic", "block_size": sizes["block"]})
    with pytest.raises(ValueError, match="apply only to order=topic"):
        make(curriculum={"order": "difficulty", "align": True})
    with pytest.raises(ValueError, match="same as data.train_files"):
        make(curriculum={"order": "topic"}, val="math")


def test_missing_labels_are_named(make, frames, sizes):
    no_level = [i for i, e in enumerate(frames["math"]["extra_info"]) if e["difficulty"] is None]
    assert no_level
    with pytest.raises(ValueError) as err:
        make(curriculum={"order": "difficulty"})
    msg = str(err.value)
    assert f"row {no_level[0]} (extra_info.index={no_level[0]})" in msg and "no extra_info['difficulty']" in msg
    assert "['index', 'source_id', 'split', 'topic']" in msg and "missing=last" in msg
    n = len(frames["math"])
    with pytest.raises(ValueError, match=rf"row 0 .*no extra_info\['subfield'\] \({n} such row.*difficulty"):
        make(curriculum={"order": "topic", "topic_key": "subfield"})
    # OlympiadBench has a topic but no difficulty level
    n = len(frames["olympiad"])
    with pytest.raises(ValueError, match=rf"row 0 .*no extra_info\['difficulty'\] \({n} such"):
        make("olympiad", {"order": "difficulty"}, val="math")
    ds = make("olympiad", {"order": "difficulty", "missing": "last"}, val="math", train_batch_size=sizes["olympiad"])
    assert sorted(served(ds)[0]) == list(range(n))


def test_rows_without_topic(make, frames, sizes):
    n, batch = len(frames["olympiad_gaps"]), sizes["olympiad"]
    gaps = unlabelled(n)
    listed = ", ".join(map(str, gaps))
    with pytest.raises(ValueError, match=rf"row 3 \(extra_info.index=3\).*5 such row\(s\): {listed}\)"):
        make("olympiad_gaps", {"order": "topic"}, val="math", train_batch_size=batch)
    ds = make("olympiad_gaps", {"order": "topic", "missing": "last"}, val="math", train_batch_size=batch)
    rows = served(ds)[0]
    assert sorted(rows[-5:]) == list(gaps) and sorted(rows) == list(range(n))


def test_validate_curriculum_config(base_config):
    cfg = copy.deepcopy(base_config)
    validate_curriculum_config(cfg.data)
    with open_dict(cfg):
        cfg.data.curriculum = {"order": "topic"}
        cfg.data.shuffle = True
    with pytest.raises(ValueError, match="needs data.shuffle=False"):
        validate_curriculum_config(cfg.data)
    with open_dict(cfg):
        cfg.data.custom_cls.path = None
    with pytest.raises(ValueError, match="is not CurriculumDataset, so verl would ignore it"):
        validate_curriculum_config(cfg.data)
    with open_dict(cfg):
        cfg.data.curriculum = {}
    validate_curriculum_config(cfg.data)


# -- verl's loading path --------------------------------------------------------------------------------


def test_validation_set_is_untouched(make, frames):
    val = make(curriculum={"order": "topic"}, files="olympiad")
    assert not val.reorders and served(val, 2) == [list(range(len(frames["olympiad"])))] * 2


def test_overlong_filter_then_order(make, frames, sizes, tiny_tokenizer):
    """verl's tokenising length filter runs first; the order covers exactly the rows that survive."""
    frame = frames["olympiad"]
    lengths = [
        len(tiny_tokenizer.apply_chat_template(list(p), add_generation_prompt=True)["input_ids"])
        for p in frame["prompt"]
    ]
    limit = sorted(lengths)[len(lengths) // 2]  # the median prompt length: about half the rows are dropped
    kept = [i for i, n in enumerate(lengths) if n <= limit]
    assert 0 < len(kept) < len(frame)
    ds = make(
        "olympiad",
        {"order": "topic"},
        val="math",
        train_batch_size=sizes["olympiad"],
        filter_overlong_prompts=True,
        max_prompt_length=limit,
    )
    assert sorted(ds[p]["extra_info"]["index"] for p in range(len(ds))) == kept


# -- resumption through data.pt -------------------------------------------------------------------------


def loader(ds) -> StatefulDataLoader:
    """The train dataloader exactly as verl's trainers build it."""
    data = ds.config
    return StatefulDataLoader(
        dataset=ds,
        batch_size=data.get("gen_batch_size", None) or data.train_batch_size,
        num_workers=data["dataloader_num_workers"],
        drop_last=True,
        collate_fn=collate_fn,
        sampler=create_rl_sampler(data, ds),
    )


def v1_stream(dl, steps: int) -> list[list[int]]:
    """The new trainer's fetch loop (_fetch_one_gen_batch): a new pass on StopIteration."""
    out, it = [], None
    for _ in range(steps):
        try:
            it = it or iter(dl)
            batch = next(it)
        except StopIteration:
            it = iter(dl)
            batch = next(it)
        out.append([e["index"] for e in batch["extra_info"]])
    return out


@pytest.mark.parametrize("order", ["topic", "random", "difficulty"])
def test_dataloader_checkpoint_resumes_exact_stream(make, frames, sizes, tmp_path, order):
    curriculum = {"order": order, "seed": 7, **({"difficulty_key": "pass_rate"} if order == "difficulty" else {})}
    batch = sizes["olympiad"]

    def build():
        return loader(make("olympiad_pass_rate", curriculum, val="math", train_batch_size=batch))

    steps_per_epoch = len(frames["olympiad_pass_rate"]) // batch
    assert steps_per_epoch > 4
    full = v1_stream(build(), 3 * steps_per_epoch)
    epochs = [sum(full[e * steps_per_epoch : (e + 1) * steps_per_epoch], []) for e in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    for cut in (4, steps_per_epoch, steps_per_epoch + 3, 2 * steps_per_epoch - 1):
        dl = build()
        head = v1_stream(dl, cut)
        torch.save(dl.state_dict(), tmp_path / "data.pt")  # what the trainers write to global_step_N/data.pt
        resumed = build()
        resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=True))
        assert head + v1_stream(resumed, 3 * steps_per_epoch - cut) == full, f"resume after {cut} batches"


def test_legacy_trainer_loop_and_epoch_boundary(make, sizes, tmp_path):
    """Legacy trainer: `for epoch: for batch in dataloader`, and no data.pt restore at an epoch boundary."""

    def build():
        return loader(make("olympiad", {"order": "topic", "seed": 7}, val="math", train_batch_size=sizes["olympiad"]))

    dl = build()
    full = [[[e["index"] for e in b["extra_info"]] for b in dl] for _ in range(2)]
    dl = build()
    it = iter(dl)
    head = [[e["index"] for e in next(it)["extra_info"]] for _ in range(5)]
    torch.save(dl.state_dict(), tmp_path / "data.pt")
    resumed = build()
    resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=True))
    rest = [[e["index"] for e in b["extra_info"]] for b in resumed]
    assert head + rest == full[0]
    assert [[e["index"] for e in b["extra_info"]] for b in resumed] == full[1]
    at_boundary = build()
    at_boundary.dataset.set_epoch(1)
    assert [[e["index"] for e in b["extra_info"]] for b in at_boundary] == full[1]


def test_checkpoint_from_other_curriculum_is_refused(make, sizes, tmp_path):
    batch = sizes["olympiad"]
    dl = loader(make("olympiad", {"order": "topic", "seed": 7}, val="math", train_batch_size=batch))
    next(iter(dl))
    state = dl.state_dict()
    other = loader(make("olympiad", {"order": "topic", "seed": 8}, val="math", train_batch_size=batch))
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="saved with curriculum .* delete data.pt"):
        next(iter(other))


def test_native_run_resuming_a_curriculum_checkpoint_warns(make, sizes):
    """eval.sh evaluates a topic-ordered checkpoint with the native order: allowed, but said out loud."""
    batch = sizes["olympiad"]
    dl = loader(make("olympiad", {"order": "topic", "seed": 7}, val="math", train_batch_size=batch))
    next(iter(dl))
    native = loader(make("olympiad", {"order": "native"}, val="math", train_batch_size=batch))
    native.load_state_dict(dl.state_dict())
    with pytest.warns(UserWarning, match="saved by a curriculum run"):
        next(iter(native))


# -- the pure ordering functions ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    topics=st.lists(st.sampled_from("abcd") | st.none(), min_size=1, max_size=80),
    batch=st.integers(1, 9),
    epoch=st.integers(0, 3),
    block=st.sampled_from([None, 1, 2]),
)
def test_topic_layout_properties(topics, batch, epoch, block):
    opts = CurriculumOptions(order="topic", missing="last", block_size=None if block is None else block * batch)
    layout = epoch_layout(opts, len(topics), seed=11, epoch=epoch, batch_size=batch, topics=topics)
    order = layout.order.tolist()
    assert sorted(order) == list(range(len(topics))) and sum(b.size for b in layout.blocks) == len(topics)
    shown = [topics[r] for r in order]
    counts = Counter(t for t in topics if t is not None)
    head = sum(c // batch * batch for c in counts.values())
    assert all(len(set(shown[i : i + batch])) == 1 for i in range(0, head, batch))
    assert Counter(shown[head : len(shown) - topics.count(None)]) == {
        k: c % batch for k, c in counts.items() if c % batch
    }
    assert all(t is None for t in shown[len(shown) - topics.count(None) :])
    again = epoch_layout(opts, len(topics), seed=11, epoch=epoch, batch_size=batch, topics=topics)
    assert again.order.tolist() == order
