"""Every comparison sentence of a committed study page agrees with the study's JSON: each "ahead of / behind /
not separated from" (study.md, written by the study) and each "leads / trails / is not separated from" (the prose
of docs/rivals.md, written by hand) states the JSON's rounded numbers, and its verb is the one the paired 95%
interval gives (ahead: the interval above 0; behind: below 0; not separated: it covers 0)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
SUMMARY = json.loads((DOCS / "study_rivals" / "summary.json").read_text())
PAGE = (DOCS / "study_rivals" / "study.md").read_text()
NAMES = {"GRPO": "grpo", "KRPO": "krpo", "HA-DW": "ha_dw", "EBPO": "ebpo", "SPO": "spo", "DBB": "dbb"}


def verb(diff: list) -> str:
    """What the paired interval (mean, half-width, seeds) says: ahead, behind or not separated."""
    mean, half, _ = diff
    return "ahead" if mean - half > 0 else "behind" if mean + half < 0 else "not separated"


def _sections(page: str) -> list[tuple[str, str, str]]:
    """(``##`` header, ``###`` header, paragraph) for each paragraph of ``page``."""
    out, top, sub = [], "", ""
    for block in page.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("## "):
                top, sub = line, ""
            elif line.startswith("### "):
                sub = line
        out.append((top, sub, block))
    return out


def _k(header: str) -> str:
    found = re.search(r"pass@(\d+)", header)
    return found.group(1) if found else "1"


EBPO_CLAIM = re.compile(
    r"(ahead of|behind|not separated from) (\w+) \(([+-]\d\.\d{3}) ± (\d\.\d{3}), wins (\d+)/(\d+)\)"
)
GRPO_GROUP = re.compile(r"(ahead of|behind) grpo: ([^;]+)")
GRPO_CLAIM = re.compile(r"(\w+) ([+-]\d\.\d{3}) ± (\d\.\d{3}) \((\d+)/(\d+)\)")


def _per_g(paragraph: str) -> list[tuple[int, str]]:
    """(G, its text) of a paragraph of "G=2: ... G=4: ..." statements."""
    parts = re.split(r"G=(\d+): ", paragraph)
    return [(int(g), text) for g, text in zip(parts[1::2], parts[2::2], strict=True)]


def _check(claimed: str, record: dict, mean: str, half: str, wins: str, seeds: str) -> None:
    diff = record["diff"]
    assert (mean, half) == (f"{diff[0]:+.3f}", f"{diff[1]:.3f}"), (record, mean, half)
    assert (int(wins), int(seeds)) == (record["wins"], diff[2]), record
    assert claimed.removesuffix(" of").removesuffix(" from") == verb(diff), (claimed, record)


def test_study_page_ebpo_versus_each_rival_agrees_with_the_json():
    """ "G=N: EBPO is ahead of X (+d ± h, wins w/n); ..." in the EBPO - X sections: every rival at every G stated,
    with the JSON's numbers and the interval's verb."""
    checked = 0
    for top, sub, paragraph in _sections(PAGE):
        if not paragraph.startswith("G=") or "EBPO is" not in paragraph:
            continue
        records = SUMMARY["paired_pass_at_k"][_k(sub if "pass@" in sub else top)]
        for g, text in _per_g(paragraph):
            claims = EBPO_CLAIM.findall(text)
            at_g = {r["baseline"]: r for r in records if r["group_size"] == g}
            assert sorted(c[1] for c in claims) == sorted(at_g), (g, text)  # every rival, each once
            for claimed, baseline, *numbers in claims:
                _check(claimed, at_g[baseline], *numbers)
                checked += 1
    assert checked == 3 * 3 * 11  # pass@1, @8, @64 x three G x eleven rivals


def test_study_page_each_estimator_versus_grpo_agrees_with_the_json():
    """ "G=N: ahead of grpo: X +d ± h (w/n), ...; behind grpo: ...; M not separated from it." (X - GRPO)."""
    checked = 0
    for top, sub, paragraph in _sections(PAGE):
        if "X - GRPO" not in top or not paragraph.startswith("G="):
            continue
        records = SUMMARY["gain_over_grpo_pass_at_k"][_k(sub)]
        for g, text in _per_g(paragraph):
            at_g = {r["estimator"]: r for r in records if r["group_size"] == g}
            named = set()
            for claimed, listed in GRPO_GROUP.findall(text):
                for estimator, *numbers in GRPO_CLAIM.findall(listed):
                    _check(claimed, at_g[estimator], *numbers)
                    named.add(estimator)
                    checked += 1
            rest = [e for e in at_g if e not in named]
            assert all(verb(at_g[e]["diff"]) == "not separated" for e in rest), (g, rest)
            count = re.search(r"(\d+) not separated from it|all (\d+) not separated from it", text)
            assert count and int(count.group(1) or count.group(2)) == len(rest), (g, text)
    assert checked > 0


@pytest.mark.parametrize("k", ["1", "64"])
def test_study_page_leader_sentence_agrees_with_the_json(k):
    """ "Leader in pass@k: X ... Its paired 95% interval is above 0 against A, B; it covers 0 against C, D."."""
    ranking = SUMMARY["equal_samples"][k]["ranking"]
    leader = ranking[0]["estimator"]
    sentence = re.search(rf"Leader in pass@{k}: (\w+), (\d\.\d{{3}}) ± (\d\.\d{{3}}) over (\d+) seeds\. (.*)", PAGE)
    assert sentence and sentence.group(1) == leader
    assert (sentence.group(2), sentence.group(3)) == tuple(f"{v:.3f}" for v in ranking[0]["best"][:2])
    above = re.search(r"above 0 against ([\w, ]+?)(?:;|\.$)", sentence.group(5))
    covers = re.search(r"covers 0 against ([\w, ]+?)\.$", sentence.group(5))
    separated = {row["estimator"] for row in ranking[1:] if verb(row["vs_leader"]["diff"]) != "not separated"}
    assert set(above.group(1).split(", ") if above else ()) == separated
    assert set(covers.group(1).split(", ") if covers else ()) == {row["estimator"] for row in ranking[1:]} - separated


def test_rivals_page_sentences_agree_with_the_json():
    """docs/rivals.md's prose on the rivals study: the leader, who follows, who trails GRPO at G = 2, and pass@64."""
    text = " ".join((DOCS / "rivals.md").read_text().split())
    ranking = {k: SUMMARY["equal_samples"][k]["ranking"] for k in ("1", "64")}
    lead = re.search(r"(\w+) leads pass@1 \((\d\.\d{3}) ± (\d\.\d{3}), (\d+) seeds\), ahead of every other", text)
    first = ranking["1"][0]
    assert lead and lead.group(1) == first["estimator"]
    assert lead.groups()[1:] == (f"{first['best'][0]:.3f}", f"{first['best'][1]:.3f}", str(first["best"][2]))
    assert all(verb(row["vs_leader"]["diff"]) == "ahead" for row in ranking["1"][1:])  # "ahead of every other"
    follow = re.search(r"(\w+), (\w+) and (\w+) follow \((\d\.\d{3}), (\d\.\d{3}), (\d\.\d{3})\)", text)
    assert follow and [NAMES[n] for n in follow.groups()[:3]] == [r["estimator"] for r in ranking["1"][1:4]]
    assert list(follow.groups()[3:]) == [f"{r['best'][0]:.3f}" for r in ranking["1"][1:4]]
    claims = re.findall(
        r"([A-Z][\w-]+) (trails GRPO|is ahead of GRPO|is not separated from it) \(([+-]\d\.\d{3}) ± (\d\.\d{3}), "
        r"(\d+)/(\d+) seeds\)",
        re.search(r"at G = 2 (.*?);  ?in pass@64", text).group(1),
    )
    by_name = {r["estimator"]: r for r in SUMMARY["gain_over_grpo_pass_at_k"]["1"] if r["group_size"] == 2}
    assert sorted(NAMES[name] for name, *_ in claims) == ["ha_dw", "krpo"]
    for name, claimed, *numbers in claims:
        words = {"trails GRPO": "behind", "is ahead of GRPO": "ahead", "is not separated from it": "not separated"}
        _check(words[claimed], by_name[NAMES[name]], *numbers)
    six = re.search(r"in pass@64 the first (\w+) are not separated", text)
    top = [verb(row["vs_leader"]["diff"]) for row in ranking["64"]]
    assert six and six.group(1) == "six" and top[:6] == ["not separated"] * 6 and top[6] != "not separated"
