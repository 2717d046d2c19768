"""Helpers shared by the test modules (import as ``from _util import ...``: ``tests/`` is on ``sys.path``
through ``tests/conftest.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from privalign.cli import main


def one_line_error(argv, needles, capsys, *, cmd: str | None = None, no_stdout: bool = False) -> str:
    """Run ``privalign ARGV``: the user error is one line ``privalign CMD: error: ...`` (``cmd`` defaults to
    ``argv[0]``) on stderr, exit status 2, no traceback and no 'internal error', holding every needle;
    with ``no_stdout``, nothing on stdout. Returns the line."""
    rc = main(argv)
    cap = capsys.readouterr()
    err = cap.err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and "internal error" not in err, err
    assert rc == 2, f"exit status {rc}: {err}"
    assert len(lines) == 1, err
    assert lines[0].startswith(f"privalign {cmd or argv[0]}: error: "), lines[0]
    if no_stdout:
        assert cap.out == "", cap.out
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def write_scored_pool(path: Path, prompts: int = 3, candidates: int = 64) -> Path:
    """A small scored pool (JSONL) at ``path``: ``prompts`` prompts of ``candidates`` responses whose proxy
    and true rewards lie in [0, 1]. Returns ``path``."""
    with open(path, "w") as fh:
        for p in range(prompts):
            resp = [
                {"text": f"t{i}", "proxy_reward": (i * 7 % 13) / 13, "true_reward": (i * 5 % 11) / 11}
                for i in range(candidates)
            ]
            fh.write(json.dumps({"prompt": f"p{p}", "responses": resp}) + "\n")
    return path


#: The character vocabulary of :func:`tiny_char_llama`'s tokenizer.
TINY_CHARS = list("abcdefghijklmnopqrstuvwxyz .,!?0123456789")


def tiny_char_tokenizer():
    """A character-level fast tokenizer over :data:`TINY_CHARS` (+ ``<pad>``, ``<eos>``, ``<unk>``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(TINY_CHARS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_char_llama(*, layers: int = 1, seed: int = 0):
    """A randomly initialised Llama (hidden 16, ``layers`` layers) and :func:`tiny_char_tokenizer`: no
    download, no GGUF. The weights come from torch's RNG seeded with ``seed`` inside ``fork_rng`` (the
    global RNG is left as it was). Returns ``(model, tokenizer)``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_char_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok
