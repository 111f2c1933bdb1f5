"""Per-sample seeds and the length check of the generation engines (ebpo_verl.evaluate.engines), HF engine on CPU.

A sample's tokens must depend on its key only: not on the batch it shares, the worker it runs on or how often
the run resumed. The expected values are computed independently: the seed from sha256 by hand, the drawn token
by ``torch.multinomial`` over a softmax computed here, the batch-free sample by a batch of one.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from ebpo_verl.cpu.tiny import build_model
from ebpo_verl.evaluate import engines


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_tokenizer):
    out = tmp_path_factory.mktemp("tiny_seeds")
    build_model(out, tiny_tokenizer)
    return out


def test_sample_seed_is_sha256_of_the_key():
    digest = hashlib.sha256(json.dumps([3, "aime2024", 7, 2]).encode()).digest()
    assert engines.sample_seed(3, ("aime2024", 7, 2)) == int.from_bytes(digest[:8], "little") % 2**63
    seeds = {engines.sample_seed(0, ("b", i, s)) for i in range(50) for s in range(16)}
    assert len(seeds) == 800 and all(0 <= x < 2**63 for x in seeds)
    assert engines.sample_seed(0, ("b", 0, 0)) != engines.sample_seed(1, ("b", 0, 0))


def test_seeded_sampler_draws_each_row_from_its_own_generator():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.0]])
    sampler = engines.SeededSampler([11, 12], temperature=0.5, top_p=1.0)
    out = sampler(torch.zeros(2, 1, dtype=torch.long), logits.clone())
    for row, seed in enumerate((11, 12)):
        probs = torch.softmax(logits[row] / 0.5, dim=-1)
        want = int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)))
        assert int(out[row].argmax()) == want
        assert torch.isinf(out[row]).sum() == 3 and out[row, want] == 0
    # top-p 0.5 keeps only the most likely token of each row here
    top = engines.SeededSampler([1, 2], temperature=1.0, top_p=0.5)(torch.zeros(2, 1, dtype=torch.long), logits)
    assert top.argmax(dim=-1).tolist() == [0, 2]


def _spec(model, **kw) -> engines.EngineSpec:
    return engines.EngineSpec("hf", str(model), temperature=1.0, top_p=1.0, max_new_tokens=8, **kw)


def test_hf_sample_depends_on_its_key_only(tiny):
    prompts = ["What is 1 + 1? Answer:", "Find the value of x."]
    reqs = [engines.Request(("b", i, s), prompts[i]) for i in range(2) for s in range(3)]
    batched = engines.HFEngine(_spec(tiny, batch_size=6)).generate(reqs)
    engine = engines.HFEngine(_spec(tiny, batch_size=1))
    alone = [engine.generate([r])[0] for r in reversed(reqs)][::-1]
    assert batched == alone  # batch mates, padding and order change nothing
    texts = [c.text for c in batched]
    assert len(set(texts[:3])) == 3, f"the 3 samples of one prompt must differ: {texts[:3]}"
    reseeded = engines.HFEngine(_spec(tiny, seed=1, batch_size=6)).generate(reqs)
    assert [c.text for c in reseeded] != texts


def test_prompt_longer_than_the_model_allows_is_an_error(tiny):
    spec = _spec(tiny, max_model_len=20)
    engine = engines.HFEngine(spec)
    prompt = "What is 1 + 1? Answer:"
    n = engine.prompt_tokens(prompt)
    assert 0 < n < 12
    ok = engines.EngineSpec("hf", str(tiny), 1.0, 1.0, max_new_tokens=20 - n, max_model_len=20)
    got = []
    engines.run_worker(ok, [engines.Request(("b", 0, 0), prompt)], got.extend)
    assert len(got) == 1
    too_long = engines.EngineSpec("hf", str(tiny), 1.0, 1.0, max_new_tokens=21 - n, max_model_len=20)
    with pytest.raises(engines.PromptTooLong, match=rf"b problem 0: its prompt has {n} tokens.*21.*model length is 20"):
        engines.run_worker(too_long, [engines.Request(("b", 0, 0), prompt)], got.extend)
    assert len(got) == 1  # nothing generated before the refusal


def test_core_groups():
    assert engines.core_groups(2, [3, 1, 0, 2, 4]) == ["0,1,2", "3,4"]
    assert engines.core_groups(1, [0, 1]) == ["0,1"]
    with pytest.raises(ValueError, match="--workers 3 needs a core per engine"):
        engines.core_groups(3, [0, 1])
