"""Topic labels (MiniLM embeddings, UMAP, k-means) and pass-rate difficulty (merge, grading, buckets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ebpo_verl.data import label_topics as lt
from ebpo_verl.data import math500
from ebpo_verl.evaluate import pass_rate as epr


@pytest.fixture(scope="module")
def small_parquet(hub_data, tmp_path_factory):
    """The first 40 MATH-500 rows, prepared (boxed template, to check that it is stripped before embedding)."""
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("labels")
    full = math500.prepare(d, local_path=hub_data / "math500.jsonl", template="boxed")
    path = d / "small.parquet"
    pq.write_table(pq.read_table(full).slice(0, 40), path)
    return path


def _blobs(seed: int = 0, per: int = 20, dim: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Three well-separated Gaussian blobs on the unit sphere (known truth)."""
    rng = np.random.default_rng(seed)
    centres = np.eye(dim)[:3] * 5
    x = np.vstack([c + rng.normal(scale=0.3, size=(per, dim)) for c in centres])
    return x / np.linalg.norm(x, axis=1, keepdims=True), np.repeat(np.arange(3), per)


@pytest.mark.parametrize("use_umap", [False, True])
@pytest.mark.slow
def test_cluster_recovers_known_groups_deterministically(use_umap):
    from sklearn.metrics import adjusted_rand_score

    x, truth = _blobs()
    a = lt.cluster(x, k=3, seed=42, use_umap=use_umap)
    b = lt.cluster(x, k=3, seed=42, use_umap=use_umap)
    assert np.array_equal(a, b)
    assert adjusted_rand_score(truth, a) == 1.0


def test_cluster_rejects_bad_k():
    x, _ = _blobs()
    with pytest.raises(ValueError, match="--k 0 must be between 1"):
        lt.cluster(x, k=0, seed=0, use_umap=False)
    with pytest.raises(ValueError, match="UMAP needs more than"):
        lt.cluster(x[:4], k=2, seed=0, use_umap=True)


def test_embeddings_offline_and_semantic():
    texts = [
        "What is the area of a triangle with base 6 and height 4?",
        "Find the area of a triangle whose base is 6 and whose height is 4.",
        "How many ways can 5 distinct books be arranged on a shelf?",
    ]
    e = lt.embed(texts)
    assert e.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2  # paraphrase far closer than an unrelated problem


@pytest.mark.slow
def test_label_topics_end_to_end_deterministic(small_parquet, tmp_path, capsys):
    out1 = lt.main(["--in", str(small_parquet), "--out", str(tmp_path / "a.parquet"), "--k", "4", "--no-umap"])
    out2 = lt.main(["--in", str(small_parquet), "--out", str(tmp_path / "b.parquet"), "--k", "4", "--no-umap"])
    a, b, src = pd.read_parquet(out1), pd.read_parquet(out2), pd.read_parquet(small_parquet)
    topics = [e["topic"] for e in a.extra_info]
    assert topics == [e["topic"] for e in b.extra_info]
    assert set(topics) == {f"cluster_{c:02d}" for c in range(4)}
    assert "cluster_00:" in capsys.readouterr().out
    # everything but the topic is unchanged
    for x, y in zip(a.to_dict("records"), src.to_dict("records"), strict=True):
        assert {k: v for k, v in x["extra_info"].items() if k != "topic"} == {
            k: v for k, v in y["extra_info"].items() if k != "topic"
        }
        assert x["reward_model"] == y["reward_model"]
    # a different seed may relabel but the cluster sizes are a partition of the same rows
    assert sum(pd.Series(topics).value_counts()) == len(src)


def test_bare_problem_strips_either_template():
    from ebpo_verl.data.schema import apply_template, bare_problem

    for t in ("dapo", "boxed"):
        assert bare_problem(apply_template("Compute $1+1$.", t)[0]["content"]) == "Compute $1+1$."


# ---------------------------------------------------------------- pass rates


@pytest.mark.parametrize(
    ("p", "k", "b"),
    [(1.0, 4, 1), (0.76, 4, 1), (0.75, 4, 2), (0.5, 4, 3), (0.26, 4, 3), (0.25, 4, 4), (0.0, 4, 4), (0.6, 5, 3)],
)
def test_bucket_hand_computed(p, k, b):
    assert epr.bucket(p, k) == b


def test_bucket_matches_definition_for_all_16_rollout_rates():
    for k in (2, 3, 4, 5, 10):
        for c in range(17):
            p = c / 16
            b = epr.bucket(p, k)
            assert 1 <= b <= k
            if p > 0:  # 1 - b/k < p <= 1 - (b-1)/k
                assert 1 - b / k < p + 1e-12 and p <= 1 - (b - 1) / k + 1e-12
            else:
                assert b == k


def test_grading_uses_the_reward(small_parquet):
    gts = ["\\frac{1}{2}", "12"]
    responses = [
        ["Answer: 0.5", "Answer: 1/3", "so $\\boxed{\\dfrac12}$", "no answer"],
        ["Answer: 12", "Answer: 012", "Answer: 13", "\\boxed{12}"],
    ]
    assert epr.grade(responses, gts, ["math500", "math500"], workers=2) == [0.5, 0.75]


def test_merge_rates_jsonl_csv_and_errors(small_parquet, tmp_path, capsys):
    src = pd.read_parquet(small_parquet)
    ids = [e["source_id"] for e in src.extra_info]
    rates = {sid: (i % 17) / 16 for i, sid in enumerate(ids)}
    jl = tmp_path / "rates.jsonl"
    jl.write_text("".join(json.dumps({"source_id": s, "pass_rate": r}) + "\n" for s, r in reversed(rates.items())))
    out = epr.main(["--in", str(small_parquet), "--out", str(tmp_path / "o.parquet"), "--pass-rates", str(jl)])
    got = pd.read_parquet(out)
    assert [e["pass_rate"] for e in got.extra_info] == [rates[s] for s in ids]
    assert [e["difficulty"] for e in got.extra_info] == [e["difficulty"] for e in src.extra_info]
    assert f"mean pass rate {np.mean(list(rates.values())):.4f}" in capsys.readouterr().out

    csv = tmp_path / "rates.csv"
    pd.DataFrame({"index": range(40), "n_correct": [i % 5 for i in range(40)], "n": 4}).to_csv(csv, index=False)
    out = epr.main(
        ["--in", str(small_parquet), "--out", str(tmp_path / "c.parquet"), "--pass-rates", str(csv)]
        + ["--difficulty-buckets", "4"]
    )
    info = pd.read_parquet(out).extra_info
    assert [e["pass_rate"] for e in info] == [(i % 5) / 4 for i in range(40)]
    assert [e["difficulty"] for e in info] == [epr.bucket((i % 5) / 4, 4) for i in range(40)]

    extra = tmp_path / "extra.jsonl"
    extra.write_text(jl.read_text() + json.dumps({"source_id": "no/such/id", "pass_rate": 0.5}) + "\n")
    with pytest.raises(SystemExit):  # errors are one line on stderr, exit status 2
        epr.main(["--in", str(small_parquet), "--out", str(tmp_path / "x.parquet"), "--pass-rates", str(extra)])
    assert "1 source_id(s) not in the parquet, e.g. ['no/such/id']" in capsys.readouterr().err
    short = tmp_path / "short.jsonl"
    short.write_text("".join(jl.read_text().splitlines(keepends=True)[1:]))
    with pytest.raises(SystemExit):
        epr.main(["--in", str(small_parquet), "--out", str(tmp_path / "x.parquet"), "--pass-rates", str(short)])
    assert f"no pass_rate for 1 row(s), source_id e.g. ['{ids[-1]}']" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"source_id": ids[0], "pass_rate": 1.5}) + "\n")
    with pytest.raises(SystemExit):
        epr.main(["--in", str(small_parquet), "--out", str(tmp_path / "x.parquet"), "--pass-rates", str(bad)])
    assert "bad.jsonl, line 1: pass_rate 1.5 is outside [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()


def test_vllm_engine_without_vllm_gives_clear_error(small_parquet, tmp_path, capsys, monkeypatch):
    """--engine vllm (the default) where vLLM is not installed: one line pointing at the install and --engine hf
    (vLLM made invisible here, so the test holds whether or not this environment has vLLM's CPU build)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    with pytest.raises(SystemExit) as exc:
        epr.main(["--in", str(small_parquet), "--out", str(tmp_path / "g.parquet"), "--model", "m"])
    assert exc.value.code == 2 and "use --engine hf" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_label_topics_script_output_is_0644_under_umask_022(small_parquet, tmp_path):
    """``python data_prep/label_topics.py`` (the command line of :mod:`ebpo_verl.data.label_topics`) labels the
    file, written with the mode of an ordinary file under the umask."""
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "labelled.parquet"
    command = [sys.executable, "data_prep/label_topics.py", "--in", str(small_parquet), "--out", str(out), "--k", "3"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([*command, "--no-umap"], cwd=repo, env=env, umask=0o022, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert len(pd.read_parquet(out)) == 40 and "label_topics: 40 rows, k=3" in run.stdout


def test_label_topics_bad_input_is_one_line_exit_2(small_parquet, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cut = tmp_path / "cut.parquet"
    cut.write_bytes(small_parquet.read_bytes()[:-100])
    with pytest.raises(pa.ArrowInvalid) as arrow:  # pyarrow's own words for the file, independently
        pq.read_table(cut)
    missing = tmp_path / "missing.parquet"
    for path, message in [
        (cut, f"{cut} is not a readable parquet file (truncated or corrupt?): {arrow.value}"),
        (missing, f"{missing} does not exist; prepare it first (python -m ebpo_verl.data.<name>)"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            lt.main(["--in", str(path), "--out", str(tmp_path / "out.parquet")])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines() == [f"python -m ebpo_verl.data.label_topics: error: {message}"]
    assert not (tmp_path / "out.parquet").exists()


def test_labelling_without_the_labels_extra_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """A core install (no ``labels`` extra: umap missing, here hidden from the import system) refuses topic
    labelling before reading anything, in one line that names the extra."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "umap" else real(name, *a))
    with pytest.raises(SystemExit) as exit_:
        lt.main(["--in", str(tmp_path / "absent.parquet"), "--out", str(tmp_path / "o.parquet")])
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and err == [
        "python -m ebpo_verl.data.label_topics: error: topic labelling needs the 'labels' extra (umap not installed): "
        "pip install 'ebpo-verl[labels]'"
    ]
    assert not (tmp_path / "o.parquet").exists()
