"""The GPU self-check (:mod:`.selfcheck`) and its ``train`` check's runner (:mod:`.train_check`). The proof
harness (the smoke runs, the random-kill campaign) is ``tests/harness/`` of the checkout and runs from there."""
