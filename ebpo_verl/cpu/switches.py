"""The CPU backend's environment switches, declared once (read in each process with
:meth:`~ebpo_verl.options.parsing.OptionSection.from_variables`; imports no torch, so the smoke harness names them
too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ebpo_verl.options.parsing import OptionSection, option, reals, text


@dataclass(frozen=True)
class BackendSwitches(OptionSection):
    """Environment variables that :mod:`ebpo_verl.cpu.backend` reads in its Ray workers."""

    SECTION: ClassVar[str] = ""

    EBPO_HF_ROLLOUT_DEVICE: str = option(
        "cpu", "device of the hf rollout server's model (smoke --device cuda: cuda)", rule=text("a device")
    )
    EBPO_WEIGHT_SYNC_TIMEOUT_S: float = option(
        300.0,
        "seconds verl's weight sender waits for vLLM's acknowledgement of a weight bucket before the step fails",
        rule=reals(0, open_low=True),
    )
