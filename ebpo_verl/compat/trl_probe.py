"""verl 0.9.1 and TRL 1.x in one environment.

verl asks ``verl.utils.import_utils.is_trl_available()`` (is ``trl`` importable?) and, when it answers yes, imports
TRL's ``AutoModelForCausalLMWithValueHead`` while it builds every actor model (``apply_monkey_patch``) and the
critic's value head. TRL 1.x removed that class (verl pins TRL 0.27.0, which has it as ``trl.experimental.ppo``), so
with TRL 1.x installed, for the TRL integration (``ebpo_verl.integrations.trl``), every verl worker would fail
building its model. :func:`install` replaces verl's probe by :func:`value_head_available`, which answers what verl
needs to know; ``ebpo_verl.trainer.adapter`` (verl's plugin, loaded by ``import verl`` in every process) installs it
before verl imports the modules that read the probe.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ebpo_verl.compat.contact import patch

PROBE = "verl.utils.import_utils.is_trl_available"
READERS = ("verl.models.transformers.monkey_patch.is_trl_available", "verl.utils.model.is_trl_available")
"""The probe as the verl modules that bind it by ``from ... import`` hold it (patched too when already imported)."""
VALUE_HEAD = "AutoModelForCausalLMWithValueHead"


def value_head_available() -> bool:
    """Whether the installed TRL has the value-head model verl imports (TRL 0.2x: ``trl.experimental.ppo`` or
    ``trl``), read from the package's files and its lazy export list without importing TRL's trainers."""
    spec = importlib.util.find_spec("trl")
    if spec is None:
        return False
    if any((Path(where) / "experimental" / "ppo").exists() for where in spec.submodule_search_locations or ()):
        return True
    return VALUE_HEAD in dir(importlib.import_module("trl"))


def install() -> None:
    """Make verl's TRL probe :func:`value_head_available` in this process (idempotent)."""
    previous = patch(PROBE, value_head_available)
    for reader in READERS:
        module = sys.modules.get(reader.rpartition(".")[0])
        if module is not None and getattr(module, "is_trl_available", None) is previous:
            patch(reader, value_head_available)
