"""Which samples of a problem give the same answer, under each protocol's own equivalence (for maj@k).

``paper``: the answer the paper's rule grades (:func:`ebpo_verl.paper_reward.extract_eval_answer`) after its
normalisation (:func:`~ebpo_verl.paper_reward.normalize_eval_answer`); two samples agree when the normalised
strings are equal (the rule compares exactly that string with the ground truth's). ``verl``: the answer
:func:`ebpo_verl.reward.extract_answer` extracts; two samples agree when the text is the same or math-verify
(:func:`ebpo_verl.reward.is_equivalent`, the training reward's comparison, time-bounded) says they are equal. As
math-verify's equality need not be transitive, the classes are built greedily in sample order: a sample joins
the first class whose first sample's answer it equals, else starts a new class. A sample without an answer (or
an empty one) belongs to no class (None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor


def _paper_key(response: str) -> str | None:
    from ebpo_verl.paper_reward import extract_eval_answer, normalize_eval_answer

    answer = extract_eval_answer(response)
    key = None if answer is None else normalize_eval_answer(answer).strip()
    return key or None


def _verl_key(response: str) -> str | None:
    from ebpo_verl.reward import extract_answer

    return extract_answer(response or "") or None


def group(answers: Sequence[str | None], same: Callable[[str, str], bool]) -> list[int | None]:
    """Class ids (0, 1, ... in order of first appearance; None for no answer), a sample joining the first class
    whose first answer is the same text or ``same(first, answer)``."""
    firsts: list[str] = []
    out: list[int | None] = []
    for answer in answers:
        if answer is None:
            out.append(None)
            continue
        cls = next((i for i, first in enumerate(firsts) if first == answer or same(first, answer)), None)
        if cls is None:
            firsts.append(answer)
            cls = len(firsts) - 1
        out.append(cls)
    return out


def answer_classes(protocol: str, problems: Sequence[Sequence[str]], workers: int = 8) -> list[list[int | None]]:
    """Per problem, the class id of each of its responses (in sample order) under ``protocol``."""
    if protocol == "paper":
        return [group([_paper_key(r) for r in responses], lambda a, b: False) for responses in problems]
    from ebpo_verl.reward import is_equivalent

    def one(responses: Sequence[str]) -> list[int | None]:
        return group([_verl_key(r) for r in responses], is_equivalent)

    with ThreadPoolExecutor(workers) as ex:  # threads overlap math-verify's child processes
        return list(ex.map(one, problems))
