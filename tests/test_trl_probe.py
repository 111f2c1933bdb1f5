"""verl's TRL probe answers whether TRL has the value-head model verl imports (ebpo_verl.compat.trl_probe)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from ebpo_verl.compat import trl_probe


def _value_head_importable() -> bool:
    """The independent answer: import the class the way verl 0.9.1 does."""
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
    except ImportError:
        try:
            from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            return False
    return True


def test_the_probe_answers_whether_verls_import_would_work():
    assert trl_probe.value_head_available() is _value_head_importable()


def test_verl_in_a_fresh_process_reads_our_probe():
    code = (
        "import verl\n"
        "from verl.utils import import_utils, model\n"
        "from verl.models.transformers import monkey_patch\n"
        "from ebpo_verl.compat.trl_probe import value_head_available as ours\n"
        "assert import_utils.is_trl_available is ours and monkey_patch.is_trl_available is ours\n"
        "assert model.is_trl_available is ours\n"
        "print(ours())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(_value_head_importable())


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed (the [trl] extra)")
def test_with_trl_1x_installed_verls_own_probe_would_say_yes_and_the_import_fail():
    """The case the patch exists for is the one this environment has (TRL 1.x): seen, not assumed."""
    from verl.utils.import_utils import is_trl_available as stock  # noqa: F401  (patched in this process)

    assert importlib.util.find_spec("trl") is not None  # verl's stock probe: True
    assert not _value_head_importable() and trl_probe.value_head_available() is False
