"""The verl integration: the registry adapter, the trainer and its mixins, the watchdog, the checkpointed state,
the pre-flight, the run's options, the curriculum dataset and the Hydra config of ``ebpo-train``
(:mod:`ebpo_verl.main` is its entry point); :mod:`.contact` lists every private name of verl, Ray, Hydra and vLLM
that the package touches and makes its patches."""
