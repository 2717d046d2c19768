"""Private sparse reward estimation (paper 2, ``spec-reward-estimation.md``).

scikit-learn-style estimators of a linear Bradley–Terry–Luce reward ``r(x) = ⟨φ(x), θ⟩`` from pairwise
preferences; each has ``fit(X, y)``, ``coef_``, ``predict_reward(X)``, ``score(X, y)`` (held-out
preference accuracy) and ``privacy_event_`` (with the privacy unit: ``"sample"`` or ``"label"``).

* non-private references: :class:`MLE`, :class:`IHT`;
* sample-DP (ε, δ): :class:`SampleDPIHT` (Peeling), :class:`DPSGDLinear`;
* label-DP ε: :class:`RRIHT`, :class:`DenseRR` (randomized response; features public);
* a transformer reward model: :class:`DPTransformerRM` (MiniLM's upper layers + a scalar head; Opacus DP-SGD
  per comparison, or RR labels with the debiased loss; ``fit`` takes ``(prompt, a0, a1)`` text triples;
  :mod:`privalign.estimation.transformer`);
* the whole ``fit-reward`` workflow (load, split, tune, fit, score, save, audit record):
  :func:`fit_reward_model`, :func:`fit_transformer_reward_model` (:mod:`privalign.estimation.fit`);
* tuning: :class:`PrivateGridSearch` / :func:`tune` (validation split of the training data, selection by
  the exponential mechanism, cost composed into ``privacy_event_``; ``docs/estimation.md``);
* public feature maps: :class:`HashedNgramFeatures`, :class:`LexiconFeatures` (base :class:`PairFeatures`);
  :func:`feature_map_from_config` rebuilds a saved map; maps built on models
  (``privalign.models.features.EmbeddingFeatures``, MiniLM) are passed in by the caller.

All estimators are scikit-learn binary classifiers of the preference (``BaseEstimator`` +
``ClassifierMixin``): rows of ``X`` are comparison differences ``φ(a¹) − φ(a⁰)``, ``y = 1`` when ``a¹`` is
preferred; they work with ``clone``, ``GridSearchCV``, ``cross_val_score``, ``Pipeline`` and
``check_is_fitted`` (which do *not* account privacy; see ``RewardEstimator``).
"""

from privalign.estimation.base import NotFittedError
from privalign.estimation.baselines import MLE, DenseRR, DPSGDLinear
from privalign.estimation.features import (
    HashedNgramFeatures,
    LexiconFeatures,
    PairFeatures,
    feature_map_from_config,
    harm_lexicon,
)
from privalign.estimation.fit import RewardFit, fit_reward_model, fit_transformer_reward_model
from privalign.estimation.iht import IHT, RRIHT, SampleDPIHT
from privalign.estimation.persistence import load_model, save_model
from privalign.estimation.preferences import (
    PreferenceData,
    train_test_split,
    train_test_split_by_prompt,
    train_test_split_by_row,
)
from privalign.estimation.synthetic import SyntheticBTL, make_btl
from privalign.estimation.transformer import DPTransformerRM
from privalign.estimation.tuning import PrivateGridSearch, tune

__all__ = [
    "MLE",
    "IHT",
    "SampleDPIHT",
    "RRIHT",
    "DenseRR",
    "DPSGDLinear",
    "DPTransformerRM",
    "PairFeatures",
    "HashedNgramFeatures",
    "LexiconFeatures",
    "harm_lexicon",
    "PrivateGridSearch",
    "tune",
    "NotFittedError",
    "feature_map_from_config",
    "PreferenceData",
    "train_test_split",
    "train_test_split_by_prompt",
    "train_test_split_by_row",
    "SyntheticBTL",
    "make_btl",
    "save_model",
    "load_model",
    "fit_reward_model",
    "fit_transformer_reward_model",
    "RewardFit",
]
