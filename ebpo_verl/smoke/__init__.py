"""The GPU self-check (:mod:`.selfcheck`) and the one-node smoke flow its ``train`` check runs (:mod:`.flows`, with
the modules that flow needs). The rest of the proof harness (the smoke command, the random-kill campaign) is
``tests/harness/`` of the checkout and runs from there."""
