"""``ebpo-train`` run in the test's own process, the one way every test file does it."""

from __future__ import annotations

import sys
import tempfile


def ebpo_train(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``ebpo-train ARGS`` in this process: (exit status, stdout, stderr). Unless ARGS say otherwise, the model path
    is a hub id (verl's default ``~/models/...`` is absent), HOME a missing folder (so is verl's ``~/data/...`` train
    file), and a real run's checkpoint folder a fresh temporary one: verl's default is relative to the working
    directory that every xdist worker shares, so its ``ebpo-train.lock`` would refuse one worker's run while another's
    holds it."""
    from ebpo_verl import main as entry

    given = {arg.split("=", 1)[0].lstrip("+") for arg in args}
    if "actor_rollout_ref.model.path" not in given:
        args = (*args, "actor_rollout_ref.model.path=org/model")
    monkeypatch.setenv("HOME", "/nonexistent-home")
    with tempfile.TemporaryDirectory(prefix="ebpo-train-") as tmp:
        if "--cfg" not in given and "trainer.default_local_dir" not in given:
            args = (*args, f"trainer.default_local_dir={tmp}/checkpoints")
        monkeypatch.setattr(sys, "argv", ["ebpo-train", *args])
        try:
            entry.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err
