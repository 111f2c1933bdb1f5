"""A tiny causal transformer policy that writes its answer token by token (nanoGPT-style, pre-LN)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ebpo_verl.study.tasks import ANSWER_LEN, EOS, PAD, PROMPT_LEN, VOCAB_SIZE


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


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
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def response_logits(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Logits (bs, L, vocab) that predict each response token from the prompt and the tokens before it."""
        ids = torch.cat([prompts, responses[:, :-1]], dim=1)
        return self(ids)[:, prompts.shape[1] - 1 :]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def sample(
    model: TinyPolicy, prompts: torch.Tensor, generator: torch.Generator, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one response per prompt row; returns (responses, response_mask), both (bs, ANSWER_LEN).

    Tokens after the first EOS are PAD and masked out; a response without EOS keeps all its tokens (and is
    wrong by construction of the verifier).
    """
    ids = prompts
    for _ in range(ANSWER_LEN):
        logits = model(ids)[:, -1] / temperature
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        ids = torch.cat([ids, nxt], dim=1)
    responses = ids[:, prompts.shape[1] :]
    ended_before = torch.cumsum((responses == EOS).int(), dim=1) - (responses == EOS).int()
    mask = ended_before == 0
    return responses.masked_fill(~mask, PAD), mask


@torch.no_grad()
def exact_pass_at_1(model: TinyPolicy, prompts: torch.Tensor, targets: torch.Tensor, target_mask: torch.Tensor):
    """Probability that one temperature-1 sample is exactly the target: the product of the teacher-forced
    probabilities of the answer tokens and EOS. Exact pass@1, with no sampling noise. Returns (N,) float."""
    logp = torch.log_softmax(model.response_logits(prompts, targets), dim=-1)
    tok = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return torch.exp((tok * target_mask).sum(dim=1))
