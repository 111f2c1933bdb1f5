"""Thin entry point of the smoke run, kept for ``python scripts/cpu_smoke.py ...``: the harness is the package
``ebpo_verl.smoke`` (``python -m ebpo_verl.smoke``)."""

from ebpo_verl.smoke.__main__ import main

if __name__ == "__main__":
    main()
