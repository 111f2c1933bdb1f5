"""``python -m ebpo_verl.smoke``: says in one line where the smoke harness went (exit 2)."""

import sys

if __name__ == "__main__":
    print(
        "ebpo_verl.smoke: the smoke harness runs from a checkout: `bash scripts/cpu_smoke.sh` or "
        "`python -m tests.harness` (tests/harness/); the GPU self-check is `python -m ebpo_verl.smoke.selfcheck`",
        file=sys.stderr,
    )
    sys.exit(2)
