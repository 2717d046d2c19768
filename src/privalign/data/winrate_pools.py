"""Win-rate candidate pools (``p2-winrate``, ``p2-rlhf-bon``): reading a pool into arrays and drawing the
private preference pairs that share no prompt with it.

A win-rate pool is a pre-generated JSONL pool (:func:`privalign.data.pools.read_pool`) whose first
``best_of`` responses per prompt are the candidates; every candidate carries the judge's score as its
``true_reward``. The private pairs are disjoint from the pool's prompts: for IMDb the reviews of
``imdb_split``'s prompt part minus the pool's reviews (``meta.review_index``), for HH-RLHF the harmless-base
test pairs minus those whose first Human turn is a pool prompt. Nothing here is private: the functions read
files and choose which records the private fits may see.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from privalign.data.dialogue import first_human_turn
from privalign.errors import DataFormatError

__all__ = ["pool_build_command", "pool_path", "read_winrate_pool", "winrate_private_pairs"]


def pool_build_command(ds: str, out: str) -> str:
    """The command that builds a win-rate pool at ``out``; the prompt count is the number in the file name
    (``winrate-imdb-400.jsonl.gz`` → 400), else 24 (the shipped pools)."""
    m = re.search(r"-(\d+)\.jsonl(\.gz)?$", str(out))
    k = int(m.group(1)) if m else 24
    if k == 24:  # the shipped pools: transformers backend, one thread
        if ds == "imdb":
            return (
                f"privalign build-pool --dataset imdb --prompt-words 10 --n 16 --num-prompts {k} "
                "--max-new-tokens 16 --batch-size 16 --num-threads 1 --proxy-reward vader --true-reward "
                f"linear:pools/imdb-gold-ngram-logreg.json --seed 0 --out {out}"
            )
        return (
            'python -c "from privalign.experiments.winrate import build_hh_pool; '
            f"build_hh_pool('{out}', num_prompts={k}, n=16, max_new_tokens=20, num_threads=1)\""
        )
    # larger pools: the CTranslate2 backend (pip install 'privalign[fast-cpu]'), reseeded per block of 32
    # prompts
    if ds == "imdb":
        return (
            "privalign build-pool --dataset imdb --prompt-words 10 --generator ctranslate2 --n 16 "
            f"--num-prompts {k} --max-new-tokens 16 --batch-size 16 --num-threads 2 --proxy-reward vader "
            f"--true-reward linear:pools/imdb-gold-ngram-logreg.json --seed 0 --out {out}"
        )
    return (
        'python -c "from privalign.experiments.winrate import build_hh_pool; '
        f"build_hh_pool('{out}', num_prompts={k}, n=16, max_new_tokens=20, num_threads=2, "
        "generator='ctranslate2')\""
    )


def pool_path(spec: str) -> Path:
    """A pool path relative to the repository root, or absolute."""
    from privalign.paths import repo_root

    p = Path(spec).expanduser()
    return p if p.is_absolute() else repo_root() / p


def read_winrate_pool(ds: str, path: Path, *, best_of: int, max_prompts: int) -> dict:
    """Pool → texts, proxy, judge arrays ``(P, N)`` and the prompt identities used to keep training
    disjoint (the first ``max_prompts`` prompts, the first ``best_of`` candidates of each).

    Raises :class:`~privalign.errors.DataFormatError` naming the prompt when one has fewer than ``best_of``
    candidates or a candidate without ``true_reward``, or (IMDb) the pool lacks ``meta.review_index``."""
    from privalign.data.pools import read_pool

    recs = read_pool(path)[:max_prompts]
    n = best_of
    texts, proxy, judge, ids = [], [], [], []
    for i, r in enumerate(recs):
        if len(r.responses) < n:
            raise DataFormatError(
                f"p2-winrate: pool {path}, prompt {i}: {len(r.responses)} candidates < best_of = {n}."
            )
        resp = r.responses[:n]
        if any(x.true_reward is None for x in resp):
            raise DataFormatError(
                f"p2-winrate: pool {path}, prompt {i}: a response has no true_reward; the judge "
                "score is the pool's true_reward and every candidate needs one."
            )
        texts.append([x.text for x in resp])
        proxy.append([x.proxy_reward for x in resp])
        judge.append([x.true_reward for x in resp])
        meta = r.meta or {}
        ids.append(meta.get("review_index") if ds == "imdb" else r.prompt.strip())
    if ds == "imdb" and any(v is None for v in ids):
        raise DataFormatError(
            f"p2-winrate: IMDb pool {path} lacks meta.review_index; it cannot be kept disjoint "
            "from the private training reviews."
        )
    return {
        "path": path,
        "texts": texts,
        "proxy": np.asarray(proxy, float),
        "judge": np.asarray(judge, float),
        "ids": ids,
    }


def winrate_private_pairs(
    ds: str, pool: dict, rng: np.random.Generator, *, hh_n_pairs: int, imdb_max_chars: int
):
    """The private preference pairs, disjoint from the win-rate prompts (and, for IMDb, from the gold model's
    training reviews), and how many candidates were excluded: ``(TextPairs, n_excluded)``."""
    from privalign.data.preferences_io import TextPairs

    if ds == "hh-rlhf":
        from privalign.data.preferences_io import load_hh_rlhf_pairs

        pairs = load_hh_rlhf_pairs(limit=hh_n_pairs)
        banned = set(pool["ids"])
        keep = [i for i, p in enumerate(pairs.prompts) if first_human_turn(p) not in banned]
        return TextPairs(
            [pairs.prompts[i] for i in keep],
            [pairs.chosen[i] for i in keep],
            [pairs.rejected[i] for i in keep],
            [pairs.prompt_ids[i] for i in keep],
            pairs.source,
        ), len(pairs) - len(keep)
    from privalign.data.datasets import imdb_split, load_imdb

    texts, labels = load_imdb()
    prompt_idx, _fit_idx = imdb_split()
    banned_idx = {int(v) for v in pool["ids"]}
    idx = [int(i) for i in prompt_idx if int(i) not in banned_idx]
    pos = [i for i in idx if labels[i] == 1]
    neg = [i for i in idx if labels[i] == 0]
    m = min(len(pos), len(neg))
    pp, nn = rng.permutation(pos)[:m], rng.permutation(neg)[:m]
    cut = imdb_max_chars
    return TextPairs(
        [""] * m,
        [texts[int(i)][:cut] for i in pp],
        [texts[int(i)][:cut] for i in nn],
        list(range(m)),
        "imdb(prompt part of imdb_split, minus win-rate prompts)",
    ), len(prompt_idx) - len(idx)
