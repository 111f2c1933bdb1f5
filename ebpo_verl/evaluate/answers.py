"""Which samples of a problem give the same answer, under each protocol's own equivalence (for maj@k).

``paper``: two samples agree when the answers the paper's rule grades
(:func:`ebpo_verl.paper_reward.extract_eval_answer`) are equal after its normalisation (``normalize_eval_answer``).
``verl``: when the answers :func:`ebpo_verl.reward.extract_answer` extracts are the same text or
:func:`ebpo_verl.reward.is_equivalent` says so.
As that need not be transitive, classes are built greedily in sample order (:func:`group`). A sample without an
answer (or an empty one) belongs to no class (None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor


def _paper_key(response: str) -> str | None:
    from ebpo_verl.paper_reward import extract_eval_answer, normalize_eval_answer

    answer = extract_eval_answer(response)
    key = None if answer is None else normalize_eval_answer(answer).strip()
    return key or None


def group(answers: Sequence[str | None], same: Callable[[str, str], bool]) -> list[int | None]:
    """Class ids (0, 1, ... in order of first appearance; None for no answer), a sample joining the first class
    whose first answer is the same text or ``same(first, answer)``."""
    firsts: list[str] = []
    out: list[int | None] = []
    for answer in answers:
        cls = None
        if answer is not None:
            cls = next((i for i, first in enumerate(firsts) if first == answer or same(first, answer)), len(firsts))
            if cls == len(firsts):  # a new class
                firsts.append(answer)
        out.append(cls)
    return out


def answer_classes(protocol: str, problems: Sequence[Sequence[str]], workers: int = 8) -> list[list[int | None]]:
    """Per problem, the class id of each of its responses (in sample order) under ``protocol``."""
    if protocol == "paper":
        return [group([_paper_key(r) for r in responses], lambda a, b: False) for responses in problems]
    from ebpo_verl.reward import extract_answer, is_equivalent

    def one(responses: Sequence[str]) -> list[int | None]:
        return group([extract_answer(r or "") or None for r in responses], is_equivalent)

    with ThreadPoolExecutor(workers) as ex:  # threads overlap math-verify's child processes
        return list(ex.map(one, problems))
