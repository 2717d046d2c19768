"""The IMDb *gold* reward: P(positive | text) from a logistic regression on hashed word 1–2-grams, fit on the
24,000 IMDb reviews of the fit part of :func:`privalign.data.datasets.imdb_split` (the 1,000 prompt-part
reviews are held out: prompts come only from them, and they measure the gold model's accuracy).

It is "stronger" than the VADER proxy in the sense that matters for over-optimisation experiments: it is
trained on 24k labelled reviews and is far more accurate at telling positive from negative reviews
(held-out accuracies of both are recorded in the saved model's metadata), while VADER is a fixed lexicon
that rewards surface cues (exclamation marks, capitals, intensifiers).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from privalign.models._resources import require

__all__ = ["fit_imdb_gold"]


def fit_imdb_gold(out: str | os.PathLike, *, C: float = 4.0, n_features: int = 2**18, random_state: int = 0) -> dict[str, Any]:
    """Fit and save the gold model (``LinearRewardScorer`` JSON, sigmoid link); returns its metadata."""
    sk = require("sklearn.linear_model", purpose="fitting the IMDb gold reward")
    from privalign.data.datasets import imdb_split, load_imdb
    from privalign.estimation.features import HashedNgramFeatures
    from privalign.models.scorers import LinearRewardScorer, VaderScorer

    texts, labels = load_imdb()
    prompt_idx, fit_idx = imdb_split()
    fm = HashedNgramFeatures(n_features=n_features, ngram_range=(1, 2))
    X_fit = fm.transform([texts[i] for i in fit_idx])
    X_ho = fm.transform([texts[i] for i in prompt_idx])
    clf = sk.LogisticRegression(C=C, max_iter=2000, random_state=random_state)
    clf.fit(X_fit, labels[fit_idx])
    acc_ho = float((clf.predict(X_ho) == labels[prompt_idx]).mean())
    vader = VaderScorer("compound").score([texts[i] for i in prompt_idx])
    vader_acc = float(((vader > 0).astype(int) == labels[prompt_idx]).mean())
    meta = {
        "what": "IMDb gold reward: P(positive review | text), logistic regression on binary hashed word 1-2-grams",
        "fit_reviews": int(len(fit_idx)),
        "heldout_reviews": int(len(prompt_idx)),
        "heldout_accuracy": acc_ho,
        "vader_heldout_accuracy": vader_acc,
        "C": C,
        "split": "privalign.data.datasets.imdb_split(n_prompt_reviews=1000, seed=20240)",
        "sklearn": require("sklearn").__version__,
    }
    sc = LinearRewardScorer(fm, clf.coef_.ravel(), intercept=float(clf.intercept_[0]), link="sigmoid", name="imdb-gold-ngram-logreg")
    sc.save(Path(out), metadata=meta)
    return meta
