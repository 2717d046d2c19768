"""IMDb reward models for over-optimisation experiments: *gold* rewards and a weak *proxy*.

Data split (deterministic; :func:`privalign.data.datasets.imdb_split` and :func:`imdb_reward_split`):

* the 1,000 **prompt-part** reviews: prompts come only from them, and they measure every reward model's
  held-out accuracy;
* the 24,000 **fit-part** reviews, split once more into a small **proxy part** (the first
  ``n_proxy_reviews`` of a seeded permutation) and the **gold part** (the rest), so a proxy fit on the proxy
  part and a gold model fit on the gold part never share a review.

Models (all ``LinearRewardScorer`` JSON files with a sigmoid link, i.e. ``P(positive | text)``):

* :func:`fit_imdb_gold` (``gold-ngram``): logistic regression on binary hashed word 1–2-grams of whole
  fit-part reviews (the original gold model; it predates the proxy split and so also saw the proxy part).
* :func:`fit_imdb_gold_minilm` (``gold-minilm``): logistic regression on MiniLM sentence embeddings of
  random word windows of gold-part reviews. Windows, not whole reviews, because the texts it must judge are
  short continuations; embedding whole reviews would also be ~10× slower on a CPU.
* :func:`fit_imdb_proxy` (``proxy-ngram``): the same n-gram model fit on only the few proxy-part reviews:
  cheap, high-variance and exploitable, as a proxy in Gao et al.'s sense should be.

VADER (a fixed lexicon that rewards surface cues: exclamation marks, capitals, intensifiers) is the other
proxy. Held-out accuracies of every model are recorded in the saved file's metadata.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from privalign._validation import check_int, check_real
from privalign.models._resources import require

__all__ = [
    "fit_imdb_gold",
    "fit_imdb_gold_minilm",
    "fit_imdb_proxy",
    "imdb_reward_split",
    "word_windows",
    "KINDS",
    "fit_imdb_reward",
]

KINDS = ("gold-ngram", "gold-minilm", "proxy-ngram")


def imdb_reward_split(n_proxy_reviews: int = 200, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """``(proxy_idx, gold_idx)``: a disjoint split of the fit part of :func:`imdb_split` (sorted indices)."""
    from privalign.data.datasets import imdb_split

    n_proxy_reviews = check_int(n_proxy_reviews, "n_proxy_reviews", low=2, high=23_000)
    _, fit_idx = imdb_split()
    perm = np.random.default_rng(seed).permutation(fit_idx)
    return np.sort(perm[:n_proxy_reviews]), np.sort(perm[n_proxy_reviews:])


def word_windows(texts: list[str], words: int, rng: np.random.Generator) -> list[str]:
    """One random window of ``words`` consecutive words from each text (the whole text if shorter)."""
    out = []
    for t in texts:
        w = t.split()
        if len(w) <= words:
            out.append(" ".join(w))
        else:
            a = int(rng.integers(0, len(w) - words + 1))
            out.append(" ".join(w[a : a + words]))
    return out


def _vader_accuracy(texts: list[str], labels: np.ndarray) -> float:
    from privalign.models.scorers import VaderScorer

    v = VaderScorer("compound").score(texts)
    return float(((v > 0).astype(int) == labels).mean())


def _fit_ngram(
    texts: list[str],
    labels: np.ndarray,
    fit_idx: np.ndarray,
    *,
    C: float,
    n_features: int,
    random_state: int,
    purpose: str,
) -> tuple[Any, Any, float]:
    """Logistic regression on binary hashed word 1–2-grams of ``texts[fit_idx]``: ``(feature map, model,
    held-out accuracy on the prompt part)``."""
    sk = require("sklearn.linear_model", purpose=purpose)
    from privalign.data.datasets import imdb_split
    from privalign.estimation.features import HashedNgramFeatures

    check_real(C, "C", low=0.0, closed="neither")
    prompt_idx, _ = imdb_split()
    fm = HashedNgramFeatures(n_features=n_features, ngram_range=(1, 2))
    clf = sk.LogisticRegression(C=C, max_iter=2000, random_state=random_state)
    clf.fit(fm.transform([texts[i] for i in fit_idx]), labels[fit_idx])
    acc = float((clf.predict(fm.transform([texts[i] for i in prompt_idx])) == labels[prompt_idx]).mean())
    return fm, clf, acc


def fit_imdb_gold(
    out: str | os.PathLike, *, C: float = 4.0, n_features: int = 2**18, random_state: int = 0
) -> dict[str, Any]:
    """Fit and save the n-gram gold model (``LinearRewardScorer`` JSON, sigmoid link); returns its
    metadata."""
    from privalign.data.datasets import imdb_split, load_imdb
    from privalign.models.scorers import LinearRewardScorer

    texts, labels = load_imdb()
    prompt_idx, fit_idx = imdb_split()
    fm, clf, acc_ho = _fit_ngram(
        texts,
        labels,
        fit_idx,
        C=C,
        n_features=n_features,
        random_state=random_state,
        purpose="fitting the IMDb gold reward",
    )
    meta = {
        "what": (
            "IMDb gold reward: P(positive review | text), logistic regression on binary hashed word 1-2-grams"
        ),
        "fit_reviews": int(len(fit_idx)),
        "heldout_reviews": int(len(prompt_idx)),
        "heldout_accuracy": acc_ho,
        "vader_heldout_accuracy": _vader_accuracy([texts[i] for i in prompt_idx], labels[prompt_idx]),
        "C": C,
        "split": "privalign.data.datasets.imdb_split(n_prompt_reviews=1000, seed=20240)",
        "sklearn": require("sklearn").__version__,
    }
    sc = LinearRewardScorer(
        fm,
        clf.coef_.ravel(),
        intercept=float(clf.intercept_[0]),
        link="sigmoid",
        name="imdb-gold-ngram-logreg",
    )
    sc.save(Path(out), metadata=meta)
    return meta


def fit_imdb_gold_minilm(
    out: str | os.PathLike,
    *,
    n_reviews: int = 12_000,
    window_words: int = 24,
    C: float = 1.0,
    backend: str = "onnx",
    n_proxy_reviews: int = 200,
    random_state: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Fit and save the MiniLM gold model on ``n_reviews`` gold-part reviews (one random window each).

    Held-out accuracy is measured on windows of the 1,000 prompt-part reviews drawn the same way (and,
    for comparison, VADER's sign accuracy on the same windows).
    """
    sk = require("sklearn.linear_model", purpose="fitting the IMDb MiniLM gold reward")
    from privalign.data.datasets import imdb_split, load_imdb
    from privalign.models.features import EmbeddingFeatures
    from privalign.models.scorers import LinearRewardScorer

    check_int(window_words, "window_words", low=1)
    check_real(C, "C", low=0.0, closed="neither")
    rng = np.random.default_rng(random_state)
    texts, labels = load_imdb()
    prompt_idx, _ = imdb_split()
    _, gold_idx = imdb_reward_split(n_proxy_reviews)
    n_reviews = check_int(n_reviews, "n_reviews", low=2, high=len(gold_idx))
    fit_idx = np.sort(rng.choice(gold_idx, size=n_reviews, replace=False))
    fit_texts = word_windows([texts[i] for i in fit_idx], window_words, rng)
    ho_texts = word_windows([texts[i] for i in prompt_idx], window_words, rng)
    fm = EmbeddingFeatures(backend=backend)
    emb = fm.load_embedder()
    emb.progress = progress
    X_fit = fm.transform(fit_texts)
    X_ho = fm.transform(ho_texts)
    emb.progress = False
    clf = sk.LogisticRegression(C=C, max_iter=5000, random_state=random_state)
    clf.fit(X_fit, labels[fit_idx])
    meta = {
        "what": (
            "IMDb gold reward: P(positive review | text), logistic regression on MiniLM "
            f"({backend}) embeddings of one random {window_words}-word window per review"
        ),
        "fit_reviews": int(n_reviews),
        "fit_part": (
            f"gold part of imdb_reward_split(n_proxy_reviews={n_proxy_reviews}): "
            "disjoint from the proxy's reviews"
        ),
        "heldout_reviews": int(len(prompt_idx)),
        "heldout_window_accuracy": float((clf.predict(X_ho) == labels[prompt_idx]).mean()),
        "vader_heldout_window_accuracy": _vader_accuracy(ho_texts, labels[prompt_idx]),
        "train_window_accuracy": float((clf.predict(X_fit) == labels[fit_idx]).mean()),
        "window_words": int(window_words),
        "C": C,
        "random_state": random_state,
        "sklearn": require("sklearn").__version__,
    }
    sc = LinearRewardScorer(
        fm,
        clf.coef_.ravel(),
        intercept=float(clf.intercept_[0]),
        link="sigmoid",
        name="imdb-gold-minilm-logreg",
    )
    sc.save(Path(out), metadata=meta)
    return meta


def fit_imdb_proxy(
    out: str | os.PathLike,
    *,
    n_proxy_reviews: int = 200,
    C: float = 1.0,
    n_features: int = 2**18,
    random_state: int = 0,
) -> dict[str, Any]:
    """Fit and save a weak proxy: the n-gram logistic model on only the proxy-part reviews."""
    from privalign.data.datasets import imdb_split, load_imdb
    from privalign.models.scorers import LinearRewardScorer

    texts, labels = load_imdb()
    proxy_idx, _ = imdb_reward_split(n_proxy_reviews)
    fm, clf, acc_ho = _fit_ngram(
        texts,
        labels,
        proxy_idx,
        C=C,
        n_features=n_features,
        random_state=random_state,
        purpose="fitting the IMDb proxy reward",
    )
    meta = {
        "what": (
            "IMDb weak proxy reward: logistic regression on hashed word 1-2-grams of only "
            f"{len(proxy_idx)} reviews"
        ),
        "fit_reviews": int(len(proxy_idx)),
        "fit_part": f"proxy part of imdb_reward_split(n_proxy_reviews={n_proxy_reviews})",
        "heldout_reviews": int(len(imdb_split()[0])),
        "heldout_accuracy": acc_ho,
        "C": C,
        "sklearn": require("sklearn").__version__,
    }
    sc = LinearRewardScorer(
        fm,
        clf.coef_.ravel(),
        intercept=float(clf.intercept_[0]),
        link="sigmoid",
        name="imdb-proxy-ngram-logreg",
    )
    sc.save(Path(out), metadata=meta)
    return meta


def fit_imdb_reward(kind: str, out: str | os.PathLike, **kwargs: Any) -> dict[str, Any]:
    """Dispatch on ``kind`` ∈ :data:`KINDS`."""
    from privalign._validation import check_choice

    kind = check_choice(kind, "kind", KINDS)
    fns: dict[str, Callable[..., dict[str, Any]]] = {
        "gold-ngram": fit_imdb_gold,
        "gold-minilm": fit_imdb_gold_minilm,
        "proxy-ngram": fit_imdb_proxy,
    }
    return fns[kind](out, **kwargs)
