"""HH-RLHF reward-hacking testbed: single-turn prompts, a semantic *gold* reward and lexical *proxies*.

Following the proxy-vs-gold protocol of reward-model over-optimisation studies (Gao et al., 2023), a fixed
"gold" reward model stands in for human judgement, and the proxies are fit on few preference pairs that the
gold model labelled:

* **prompts** (:func:`hh_prompts`): the first human turn of each harmless-base dialogue, in file order. The
  pool's prompt ``i`` is the first turn of dialogue ``i``.
* **gold** (:func:`fit_hh_gold`): a Bradley–Terry model ``r(x) = w·φ(x)`` on MiniLM sentence embeddings ``φ``
  of the final assistant response, fit by logistic regression without intercept on ``φ(chosen) − φ(rejected)``
  over **all** 2,312 human harmless-base pairs (both orientations, so the classes balance). Held-out pairwise
  accuracy is measured by a 5-fold cross-validation and recorded in the file's metadata.
* **proxies** (:func:`fit_hh_proxy`): a Bradley–Terry model on binary hashed word 1–2-grams fit on ``n_pairs``
  (50 … 1,000) pairs of responses *relabelled by the gold model* (``chosen`` = the response with the higher
  gold reward), drawn only from dialogues whose index is ≥ ``eval_prompts`` (default 64), i.e. never from the
  evaluation prompts of a pool. A lexical proxy against a semantic gold has blind spots to exploit.

The profanity judge (``clean`` = 1 − P(profane)) is a second gold reward.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from privalign._validation import check_int, check_real
from privalign.errors import PrivacyParameterError
from privalign.models._resources import require

__all__ = ["first_human_turn", "hh_prompts", "hh_pairs", "fit_hh_gold", "fit_hh_proxy", "EVAL_PROMPTS"]

EVAL_PROMPTS = 64  # dialogues 0..63 are reserved for pool prompts; proxies never see them


def first_human_turn(dialogue: str) -> str:
    """The text of the first ``Human:`` turn of an HH dialogue (stripped)."""
    a = dialogue.find("Human:")
    if a == -1:
        return dialogue.strip()
    a += len("Human:")
    b = dialogue.find("\n\nAssistant:", a)
    return dialogue[a : b if b != -1 else len(dialogue)].strip()


def hh_prompts(num_prompts: int | None = None):
    """HH harmless-base examples whose prompt is the first human turn (``extra`` keeps ``dialogue_index``)."""
    from privalign.data.datasets import Example, load_hh_rlhf

    ex = load_hh_rlhf()
    out = [
        Example(prompt=first_human_turn(e.prompt), subject="hh-rlhf", extra={"dialogue_index": i})
        for i, e in enumerate(ex)
    ]
    return out if num_prompts is None else out[:num_prompts]


def hh_pairs() -> tuple[list[str], list[str]]:
    """``(chosen, rejected)`` final assistant responses of all harmless-base pairs, in file order."""
    from privalign.data.datasets import load_hh_rlhf

    ex = load_hh_rlhf()
    return [e.extra["chosen"] for e in ex], [e.extra["rejected"] for e in ex]


def _bt_fit(D: np.ndarray, C: float, random_state: int):
    """Logistic regression without intercept on both orientations of the pair differences ``D``
    (chosen − rejected)."""
    sk = require("sklearn.linear_model", purpose="fitting a Bradley-Terry reward")
    sp = require("scipy.sparse")
    if sp.issparse(D):
        X = sp.vstack([D, -D]).tocsr()
    else:
        X = np.vstack([D, -D])
    y = np.r_[np.ones(D.shape[0]), np.zeros(D.shape[0])]
    clf = sk.LogisticRegression(C=C, fit_intercept=False, max_iter=5000, random_state=random_state)
    clf.fit(X, y)
    return clf.coef_.ravel()


def fit_hh_gold(
    out: str | os.PathLike,
    *,
    C: float = 1.0,
    backend: str = "onnx",
    folds: int = 5,
    random_state: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Fit and save the MiniLM Bradley–Terry gold reward on all harmless-base pairs; returns its metadata."""
    from privalign.models.features import EmbeddingFeatures
    from privalign.models.scorers import LinearRewardScorer

    check_real(C, "C", low=0.0, closed="neither")
    folds = check_int(folds, "folds", low=2)
    chosen, rejected = hh_pairs()
    fm = EmbeddingFeatures(backend=backend)
    emb = fm.load_embedder()
    emb.progress = progress
    Xc, Xr = fm.transform(chosen), fm.transform(rejected)
    emb.progress = False
    D = Xc - Xr
    rng = np.random.default_rng(random_state)
    fold = rng.permutation(len(D)) % folds
    accs = []
    for f in range(folds):
        w = _bt_fit(D[fold != f], C, random_state)
        accs.append(float((D[fold == f] @ w > 0).mean()))
    w = _bt_fit(D, C, random_state)
    meta = {
        "what": "HH-RLHF harmless-base gold reward: Bradley-Terry (logistic regression, no intercept) "
        f"on MiniLM ({backend}) "
        "embeddings of the final assistant response, fit on all human pairs",
        "fit_pairs": int(len(D)),
        "cv_folds": folds,
        "cv_pair_accuracy": float(np.mean(accs)),
        "cv_pair_accuracy_folds": accs,
        "train_pair_accuracy": float((D @ w > 0).mean()),
        "C": C,
        "random_state": random_state,
        "sklearn": require("sklearn").__version__,
    }
    LinearRewardScorer(fm, w, intercept=0.0, link="identity", name="hh-gold-minilm-bt").save(
        Path(out), metadata=meta
    )
    return meta


def fit_hh_proxy(
    out: str | os.PathLike,
    gold: str | os.PathLike,
    *,
    n_pairs: int | list[int] = 200,
    eval_prompts: int = EVAL_PROMPTS,
    C: float = 1.0,
    n_features: int = 2**18,
    seed: int = 0,
) -> dict[str, Any] | list[dict[str, Any]]:
    """Fit and save a hashed-n-gram Bradley–Terry proxy on ``n_pairs`` gold-relabelled pairs.

    The pairs are a seeded sample of the harmless-base dialogues with index ≥ ``eval_prompts`` (disjoint from
    the pool prompts); each pair's preferred side is the one the gold model scores higher. The proxy's
    agreement with the gold labels on all other (unused, non-evaluation) pairs is recorded in the metadata.
    With a list of sizes, ``out`` must contain ``{n}``; the gold scores are computed once and the samples are
    nested (the first 50 pairs of the 200-pair proxy are the 50-pair proxy's).
    """
    single = isinstance(n_pairs, int)
    sizes = [n_pairs] if isinstance(n_pairs, int) else list(n_pairs)
    if len(sizes) > 1 and "{n}" not in str(out):
        raise PrivacyParameterError(
            f"The 'out' parameter must contain '{{n}}' when several n_pairs are given. Got {str(out)!r}."
        )
    from privalign.estimation.features import HashedNgramFeatures
    from privalign.models.scorers import LinearRewardScorer

    chosen, rejected = hh_pairs()
    eval_prompts = check_int(eval_prompts, "eval_prompts", low=0, high=len(chosen) - 2)
    pool_idx = np.arange(eval_prompts, len(chosen))
    for n in sizes:
        check_int(n, "n_pairs", low=2, high=len(pool_idx) - 1)
    check_real(C, "C", low=0.0, closed="neither")
    g = LinearRewardScorer.load(gold)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(pool_idx)
    a, b = [chosen[i] for i in pool_idx], [rejected[i] for i in pool_idx]
    ga, gb = np.asarray(g.score(a), dtype=float), np.asarray(g.score(b), dtype=float)
    pos = {int(i): k for k, i in enumerate(pool_idx)}
    fm = HashedNgramFeatures(n_features=n_features, ngram_range=(1, 2))

    def diffs(idx: np.ndarray):
        A = fm.transform([a[pos[int(i)]] for i in idx])
        B = fm.transform([b[pos[int(i)]] for i in idx])
        sign = np.where(np.array([ga[pos[int(i)]] >= gb[pos[int(i)]] for i in idx]), 1.0, -1.0)
        import scipy.sparse as sp

        return sp.diags(sign) @ (A - B)

    metas = []
    for n_pairs in sizes:
        fit_idx, ho_idx = np.sort(perm[:n_pairs]), np.sort(perm[n_pairs:])
        w = _bt_fit(diffs(fit_idx), C, seed)
        meta = _proxy_meta(n_pairs, gold, eval_prompts, ho_idx, diffs(ho_idx) @ w, ga, gb, C, seed)
        name = f"hh-proxy-ngram-bt-{n_pairs}"
        LinearRewardScorer(fm, w, intercept=0.0, link="identity", name=name).save(
            Path(str(out).replace("{n}", str(n_pairs))), metadata=meta
        )
        metas.append(meta)
    return metas[0] if single else metas


def _proxy_meta(n_pairs, gold, eval_prompts, ho_idx, ho_margin, ga, gb, C, seed) -> dict[str, Any]:
    return {
        "what": "HH-RLHF proxy reward: Bradley-Terry on binary hashed word 1-2-grams, "
        f"fit on {n_pairs} gold-relabelled "
        "harmless-base pairs",
        "gold": str(gold),
        "fit_pairs": int(n_pairs),
        "eval_prompts_excluded": int(eval_prompts),
        "heldout_pairs": int(len(ho_idx)),
        "heldout_gold_agreement": float((np.asarray(ho_margin) > 0).mean()),
        "gold_human_agreement_on_proxy_part": float((ga > gb).mean()),
        "C": C,
        "seed": seed,
        "sklearn": require("sklearn").__version__,
    }
