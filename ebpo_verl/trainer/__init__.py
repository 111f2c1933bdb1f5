"""The verl integration: the registry adapter, the trainer and its mixins, the watchdog, the checkpointed state,
the pre-flight, the run's options, the curriculum dataset and the Hydra config of ``ebpo-train``
(:mod:`ebpo_verl.main` is its entry point). The private names of verl, Ray, Hydra and vLLM that these modules touch,
and the patches they make, are listed in :mod:`ebpo_verl.compat.contact`."""
