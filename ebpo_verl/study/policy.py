"""A tiny causal transformer policy that writes its answer token by token (nanoGPT-style, pre-LN)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import torch
import torch.nn.functional as F
from torch import nn

from ebpo_verl.study.tasks import ANSWER_LEN, EOS, PAD, PROMPT_LEN, VOCAB_SIZE, ProblemSet

KV: TypeAlias = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class PolicyConfig:
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    max_len: int = PROMPT_LEN + ANSWER_LEN


class _Block(nn.Module):
    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x: torch.Tensor, past: KV | None = None) -> tuple[torch.Tensor, KV]:
        """Causal self-attention + MLP; ``past`` holds the keys/values of earlier positions (generation)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        # a single new token may attend to every earlier position; a fresh sequence needs the causal mask
        att = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x)), (k, v)


class TinyPolicy(nn.Module):
    """Token + learned position embeddings, ``n_layer`` causal blocks, a linear head over the task vocabulary."""

    def __init__(self, cfg: PolicyConfig = PolicyConfig()):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB_SIZE)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (b, t, vocab) for next-token prediction at every position."""
        return self.step(ids, None)[0]

    def step(self, ids: torch.Tensor, cache: list[KV] | None) -> tuple[torch.Tensor, list[KV]]:
        """Logits for ``ids`` placed after the positions held in ``cache`` (None: a fresh sequence)."""
        start = 0 if cache is None else cache[0][0].shape[2]
        x = self.tok(ids) + self.pos(torch.arange(start, start + ids.shape[1]))
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if cache is None else cache[i])
            new_cache.append(kv)
        return self.head(self.ln_f(x)), new_cache

    def response_logits(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Logits (bs, L, vocab) that predict each response token from the prompt and the tokens before it."""
        ids = torch.cat([prompts, responses[:, :-1]], dim=1)
        return self(ids)[:, prompts.shape[1] - 1 :]


@torch.no_grad()
def sample(
    model: TinyPolicy, prompts: torch.Tensor, group_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample ``group_size`` responses per prompt at temperature 1 (KV cache): (responses, response_mask, log_probs),
    each (len(prompts) * group_size, ANSWER_LEN), grouped by prompt; tokens after the first EOS are PAD and masked."""
    logits, cache = model.step(prompts, None)  # the prompt once per group, then copied G times
    logits = logits[:, -1].repeat_interleave(group_size, dim=0)
    cache = [(k.repeat_interleave(group_size, dim=0), v.repeat_interleave(group_size, dim=0)) for k, v in cache]
    tokens, logps = [], []
    for i in range(ANSWER_LEN):
        logp = torch.log_softmax(logits, dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=generator)
        tokens.append(nxt)
        logps.append(logp.gather(-1, nxt))
        if i < ANSWER_LEN - 1:
            logits, cache = model.step(nxt, cache)
            logits = logits[:, -1]
    responses, log_probs = torch.cat(tokens, dim=1), torch.cat(logps, dim=1)
    is_eos = (responses == EOS).int()
    mask = (torch.cumsum(is_eos, dim=1) - is_eos) == 0
    return responses.masked_fill(~mask, PAD), mask, log_probs * mask


@torch.no_grad()
def exact_pass_at_1(model: TinyPolicy, problems: ProblemSet) -> torch.Tensor:
    """(N,) exact pass@1: the product of the teacher-forced probabilities of the answer tokens and EOS."""
    logp = torch.log_softmax(model.response_logits(problems.prompts, problems.targets), dim=-1)
    tok = logp.gather(-1, problems.targets.unsqueeze(-1)).squeeze(-1)
    return torch.exp((tok * problems.target_mask).sum(dim=1))
