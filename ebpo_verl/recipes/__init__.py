"""The reproduction recipes as a Python package: presets as data (:mod:`.presets`), one run built from the
environment (:mod:`.spec`), the paper's tables (:mod:`.tables`, numbers in :mod:`.paper`) and what the scripts
in ``recipe/ebpo/`` do (:mod:`.driver`, command line: ``python -m ebpo_verl.recipes``)."""
