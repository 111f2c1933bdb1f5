"""Grading throughput of both evaluation protocols on ~20,000-character responses (responses per second).

A full evaluation is 12,296 samples under the paper protocol (500 x 16 + 30 x 16 + 30 x 16 + 40 x 16 + 674 x 4)
and 20,384 under the verl protocol (1,274 problems x 16); untrained Qwen3-8B writes 18-20k tokens per sample
(docs/paper_notes.md#evaluation, #logged-numbers). This prints how long grading them would take here.
Responses are long filler text ending in a final answer (right, wrong, ``\\boxed{}`` only, or a second
``Answer:`` line), against MATH-500-like ground truths; ``verl`` grades with math-verify in child processes.

    python benchmarks/bench_grading.py [--responses 2000] [--chars 20000]
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import ClassVar

from ebpo_verl.evaluate.grading import grade_records
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import OptionSection, ints, option

TRUTHS = ["42", "\\frac{3}{4}", "2\\sqrt{5}", "(1, 2)", "27", "\\pi/3", "x^2+1", "1000"]
SAMPLES = {"paper": 500 * 16 + 30 * 16 + 30 * 16 + 40 * 16 + 674 * 4, "verl": 1274 * 16}


def make_items(n: int, chars: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(benchmark, response, ground truth) triples with varied endings and distinct filler."""
    rng = random.Random(seed)
    words = ["Let", "x", "=", "\\frac{a}{b}", "so", "we", "get", "$y^2$", "then", "check", "3", "+", "7", "\n"]
    items = []
    for i in range(n):
        truth = TRUTHS[i % len(TRUTHS)]
        body = " ".join(rng.choice(words) for _ in range(chars // 4))[:chars]
        ending = [
            f"\nAnswer: {truth}",
            f"\nAnswer: {rng.randint(0, 999)}",
            f"\nSo the result is $\\boxed{{{truth}}}$.",
            f"\nAnswer: {truth}\nWait, let me re-check.\nAnswer: {rng.randint(0, 999)}",
        ][i % 4]
        items.append(("math500", body + ending, truth))
    return items


@dataclass(frozen=True)
class BenchOptions(OptionSection):
    """The benchmark's options, declared once."""

    SECTION: ClassVar[str] = "bench_grading"

    responses: int = option(2000, "responses graded per protocol", rule=ints(1))
    chars: int = option(20000, "characters per response", rule=ints(1))


def main() -> None:
    a = parse(BenchOptions, "bench_grading", description=__doc__.split("\n\n")[0])
    items = make_items(a.responses, a.chars)
    print(f"{a.responses} responses of ~{a.chars} characters")
    for protocol in ("paper", "verl"):
        grade_records(protocol, items[:8])  # warm-up: imports, math-verify's worker processes
        t0 = time.perf_counter()
        verdicts = grade_records(protocol, items)
        rate = len(items) / (time.perf_counter() - t0)
        print(
            f"{protocol:6s} {rate:10.0f} responses/s  ({sum(verdicts)} correct; its full {SAMPLES[protocol]}-sample "
            f"evaluation grades in {SAMPLES[protocol] / rate:.1f} s)"
        )


if __name__ == "__main__":
    main()
