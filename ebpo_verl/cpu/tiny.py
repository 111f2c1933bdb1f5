"""A tiny tokenizer and causal LM built locally (no hub), for tests and CPU smoke runs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_DEFAULT_CORPUS = [
    "What is 1 + 1? Answer: 2",
    "Let x be a real number. Find the value of \\frac{a}{b} and put it in \\boxed{}.",
    "Solve the following math problem step by step. The last line of your response should be of the form"
    " Answer: $Answer (without quotes) where $Answer is the answer to the problem.",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ^ ( ) [ ] { } \\sqrt \\pi \\cdot , . ; : ! ? $",
]


def build_tokenizer(out_dir: str | Path, corpus: Iterable[str] = (), vocab_size: int = 512):
    """Train a byte-level BPE tokenizer with a ChatML template and save it as a HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([*_DEFAULT_CORPUS, *corpus], trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    hf.chat_template = CHATML_TEMPLATE
    hf.save_pretrained(out_dir)  # creates the folder
    return hf


def build_model(
    out_dir: str | Path, tokenizer, hidden_size: int = 32, layers: int = 2, seed: int = 0, head_dim: int = 32
):
    """Save a randomly initialised tiny Qwen3 causal LM (about 50k parameters) next to its tokenizer.

    ``head_dim`` is independent of ``hidden_size`` in Qwen3; 32 is the smallest head size vLLM's CPU attention
    accepts (it takes 32, 64, 80, 96, 112, 128, ...), so the same model also runs under ``--engine vllm``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model
