"""DAPO-Math-17k, the paper's training set, de-duplicated by problem.

The hub file holds about 1.79M rows: each of about 17.9k problems repeated about 100 times. Rows already
carry DAPO's instruction around the problem; the bare problem is recovered (wrapper stripped) and the chosen
template applied once, so nothing is wrapped twice. Only the first row of each problem is kept. Also accepts
variants whose prompt is the bare problem and whose ``extra_info.index`` is an integer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ebpo_verl.data.schema import Dataset, Example, InvalidRowError, as_text, source_id, strip_dapo_wrapper


def convert(row: dict[str, Any], i: int) -> Example:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        content = prompt
    elif isinstance(prompt, list | tuple | np.ndarray) and len(prompt) > 0:
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise InvalidRowError("prompt", "no user message")
        content = users[-1].get("content")
    else:
        raise InvalidRowError("prompt", "missing or empty (expected a list of chat messages)", columns=("prompt",))
    problem = strip_dapo_wrapper(as_text(content, "prompt content"))
    if not problem:
        raise InvalidRowError("prompt", "empty problem")
    reward_model = row.get("reward_model")
    answer = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if answer is None:
        raise InvalidRowError("reward_model.ground_truth", "missing", columns=("reward_model",))
    extra = row.get("extra_info")
    answer = as_text(answer, "reward_model.ground_truth", numbers=True)
    row_id = source_id(extra, ("index",), i) if isinstance(extra, dict) else str(i)
    return Example(problem=problem, answer=answer, source_id=row_id)


DATASET = Dataset("dapo_math", "BytedTsinghua-SIA/DAPO-Math-17k", "train", convert, split="train", dedupe=True)
prepare = DATASET.prepare
main = DATASET.main


if __name__ == "__main__":
    main()
