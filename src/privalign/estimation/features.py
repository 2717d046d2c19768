"""Public, data-independent feature maps φ(k, a) for linear BTL rewards (spec-reward-estimation.md §11).

* :class:`HashedNgramFeatures`: hashed word n-grams, values capped to [0, 1] (binary presence), a
  ``scipy.sparse`` CSR matrix that is never densified. The map is fixed before any data is seen (no
  vocabulary, no IDF, no scaling from data), so it leaks nothing and needs no privacy budget. A
  comparison difference ``x = φ(a¹) − φ(a⁰)`` then lies in [−1, 1]^d, i.e. ``feature_bound = 1``.
* :class:`LexiconFeatures`: whole-word presence indicators of a fixed word list (d = its length), e.g.
  :func:`harm_lexicon`: refusal/harm words written down in advance plus the most profane words of the
  public ``alt-profanity-check`` model (trained on public toxic-comment data, not on ours). A candidate
  feature map whose preference signal may be sparse (see :mod:`privalign.estimation.sparsity`). Values in
  {0, 1}.

A feature map is rebuilt from its ``get_config()`` by *kind* (:func:`feature_map_from_config`). The kinds of
this module are built in; a map that lives in a higher layer (``privalign.models.features.EmbeddingFeatures``,
kind ``"minilm"``) is passed in by the caller (``kinds=``), so this module never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, cast

import numpy as np
import scipy.sparse as sp

from privalign._validation import check_int
from privalign.errors import MissingDependencyError, PrivacyParameterError

__all__ = [
    "PairFeatures",
    "HashedNgramFeatures",
    "LexiconFeatures",
    "HARM_WORDS",
    "harm_lexicon",
    "BUILTIN_FEATURE_MAPS",
    "feature_map_from_config",
]


class PairFeatures:
    """Base class of the feature maps: ``transform_pairs`` shared by all of them, and the interface a
    pluggable feature map implements (see the module docstring).

    φ(k, a) is the map of ``"k\na"`` when ``use_prompt`` is set, else of the response alone. A subclass sets
    ``kind`` (the key of its ``get_config()``) and implements ``transform``, ``feature_bound`` (coordinate
    bound of a comparison difference φ(a¹) − φ(a⁰)) and ``get_config``; :meth:`from_config` rebuilds it.
    It may override :attr:`norm_bound` (a public ℓ2 bound of a comparison difference; ``None`` here).
    """

    kind: ClassVar[str]
    use_prompt: bool

    @property
    def feature_bound(self) -> float:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @property
    def norm_bound(self) -> float | None:
        """A public bound on ``‖φ(a¹) − φ(a⁰)‖₂`` that the map guarantees by construction (fixed before any
        data is seen), or ``None`` where the only one is the useless ``feature_bound·√d``. DP-SGD takes it
        as ``feature_norm_bound`` to cap its default clip norm; it is public configuration, not a statistic
        of the data. Hashed n-grams and lexicon indicators have none (a long text can set every
        coordinate), so the base class returns ``None``."""
        return None

    def transform(self, texts: Sequence[str]) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> PairFeatures:
        """The map whose ``get_config()`` is ``config``: by default ``cls(**config)`` without ``kind``."""
        return cls(**{k: v for k, v in config.items() if k != "kind"})

    def transform_pairs(self, prompts: Sequence[str], responses: Sequence[str]) -> Any:
        """φ(k, a) for aligned prompts and responses."""
        if len(prompts) != len(responses):
            raise PrivacyParameterError(
                f"The 'prompts' and 'responses' parameters must have equal lengths. Got {len(prompts)} and "
                f"{len(responses)}."
            )
        if self.use_prompt:
            return self.transform([f"{k}\n{a}" for k, a in zip(prompts, responses)])
        return self.transform(responses)


class HashedNgramFeatures(PairFeatures):
    """Binary hashed bag of word n-grams (MurmurHash3 via scikit-learn's ``HashingVectorizer``).

    Args:
      n_features: the dimension ``d`` (a power of two is customary, e.g. ``2**18``).
      ngram_range: ``(min_n, max_n)`` word n-gram lengths.
      lowercase: lowercase before tokenising.
      use_prompt: include the prompt's n-grams in φ(k, a). Off by default: for a bag of words the
        shared prompt cancels in the comparison difference anyway.

    The output is a CSR matrix with values in {0, 1} (presence), hence within [0, 1].
    """

    kind = "hashed_ngram"

    def __init__(
        self,
        n_features: int = 2**18,
        ngram_range: Sequence[int] = (1, 2),
        lowercase: bool = True,
        use_prompt: bool = False,
    ) -> None:
        self.n_features = n_features
        self.ngram_range = ngram_range
        self.lowercase = lowercase
        self.use_prompt = use_prompt

    def _vectorizer(self) -> Any:
        check_int(self.n_features, "n_features", low=1)
        lo, hi = (check_int(v, "ngram_range", low=1) for v in tuple(self.ngram_range))
        if lo > hi:
            raise PrivacyParameterError(
                f"The 'ngram_range' parameter must satisfy min_n <= max_n. Got {self.ngram_range!r}."
            )
        try:
            from sklearn.feature_extraction.text import HashingVectorizer
        except ImportError as exc:  # pragma: no cover
            raise MissingDependencyError(
                "HashedNgramFeatures needs scikit-learn: pip install scikit-learn"
            ) from exc
        return HashingVectorizer(
            n_features=int(self.n_features),
            ngram_range=(lo, hi),
            lowercase=bool(self.lowercase),
            alternate_sign=False,
            binary=True,
            norm=None,
            dtype=np.float64,
        )

    @property
    def feature_bound(self) -> float:
        """Coordinate bound of a comparison difference φ(a¹) − φ(a⁰)."""
        return 1.0

    def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        """φ of each text: an ``(len(texts), n_features)`` CSR matrix with entries in {0, 1}."""
        if isinstance(texts, str):
            raise PrivacyParameterError(
                "The 'texts' parameter must be a sequence of strings, not a single string."
            )
        X = self._vectorizer().transform(list(texts)).tocsr()
        np.minimum(X.data, 1.0, out=X.data)  # cap to [0, 1] (binary=True already does)
        return X

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> HashedNgramFeatures:
        kw = {k: v for k, v in config.items() if k != "kind"}
        if "ngram_range" in kw:
            kw["ngram_range"] = tuple(kw["ngram_range"])
        return cls(**kw)

    def get_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "n_features": int(self.n_features),
            "ngram_range": [int(v) for v in self.ngram_range],
            "lowercase": bool(self.lowercase),
            "use_prompt": bool(self.use_prompt),
        }

    def __repr__(self) -> str:
        return (
            f"HashedNgramFeatures(n_features={self.n_features}, ngram_range={tuple(self.ngram_range)}, "
            f"lowercase={self.lowercase}, use_prompt={self.use_prompt})"
        )


#: Refusal and harm words, fixed before looking at any preference data (general knowledge of what harmless
#: assistant replies say and harmful ones mention); the data-independent part of :func:`harm_lexicon`.
HARM_WORDS: tuple[str, ...] = tuple(
    """sorry apologize cannot can't won't unable appropriate inappropriate illegal unethical harmful dangerous
    against law laws police crime criminal hurt harm kill murder steal stealing theft drug drugs weapon
    weapons gun guns bomb violence violent abuse racist racism offensive hate respect safe safety consent
    private privacy recommend instead professional help therapist doctor lawyer advice wrong bad careful
    risk legal""".split()
)


def harm_lexicon(n_profane: int = 256) -> list[str]:
    """:data:`HARM_WORDS` followed by the ``n_profane`` words with the largest coefficients (averaged over the
    calibration folds) of the linear SVM shipped in ``alt-profanity-check`` (a public model, fixed before our
    data is seen, so the lexicon is data-independent). Duplicates are dropped, order kept.

    Raises:
      MissingDependencyError: ``alt-profanity-check`` is not installed (``pip install alt-profanity-check``).
    """
    n_profane = check_int(n_profane, "n_profane", low=0)
    words = list(HARM_WORDS)
    if n_profane:
        try:
            from profanity_check import profanity_check as pc
        except ImportError as exc:  # pragma: no cover - installed with the core dependencies
            raise MissingDependencyError(
                "harm_lexicon needs alt-profanity-check: pip install alt-profanity-check"
            ) from exc
        coef = np.mean([c.estimator.coef_.ravel() for c in pc.model.calibrated_classifiers_], axis=0)
        vocab = np.empty(len(pc.vectorizer.vocabulary_), dtype=object)
        for w, i in pc.vectorizer.vocabulary_.items():
            vocab[i] = w
        words += [str(w) for w in vocab[np.argsort(-coef, kind="stable")[:n_profane]]]
    return list(dict.fromkeys(words))


class LexiconFeatures(PairFeatures):
    """Presence indicators of a fixed word list: ``φ(a)_j = 1`` if word j occurs in ``a`` (lower-cased
    tokens ``\\b\\w[\\w']*\\b``), else 0. The list is public and fixed, so the map is data-independent;
    comparison differences lie in [−1, 1] (``feature_bound = 1``). Output: CSR, ``d = len(words)``.

    Args:
      words: the lexicon (non-empty; lower-case, duplicates are an error).
      name: a label recorded in the config (e.g. ``"harm"``).
      use_prompt: include the prompt's words.
    """

    kind = "lexicon"

    def __init__(self, words: Sequence[str], name: str = "lexicon", use_prompt: bool = False) -> None:
        self.words = list(words)
        self.name = name
        self.use_prompt = use_prompt
        if not self.words or not all(isinstance(w, str) and w for w in self.words):
            raise PrivacyParameterError(
                f"The 'words' parameter must be a non-empty list of words. Got {words!r}."
            )
        if len(set(self.words)) != len(self.words):
            raise PrivacyParameterError("The 'words' parameter must not contain duplicates.")
        self._index = {w.lower(): j for j, w in enumerate(self.words)}

    @property
    def n_features(self) -> int:
        return len(self.words)

    @property
    def feature_bound(self) -> float:
        return 1.0

    def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        import re

        if isinstance(texts, str):
            raise PrivacyParameterError(
                "The 'texts' parameter must be a sequence of strings, not a single string."
            )
        tok = re.compile(r"\b\w[\w']*\b")
        rows: list[int] = []
        cols: list[int] = []
        for r, t in enumerate(texts):
            hits = {self._index[w] for w in tok.findall(t.lower()) if w in self._index}
            rows.extend([r] * len(hits))
            cols.extend(sorted(hits))
        return sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(texts), len(self.words)))

    def get_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "words": list(self.words),
            "name": self.name,
            "use_prompt": bool(self.use_prompt),
        }

    def __repr__(self) -> str:
        return f"LexiconFeatures({len(self.words)} words, name={self.name!r}, use_prompt={self.use_prompt})"


#: The feature maps of this layer, by kind.
BUILTIN_FEATURE_MAPS: dict[str, type[PairFeatures]] = {
    HashedNgramFeatures.kind: HashedNgramFeatures,
    LexiconFeatures.kind: LexiconFeatures,
}


def feature_map_from_config(
    config: dict[str, Any], *, kinds: Mapping[str, type[PairFeatures]] | None = None
) -> PairFeatures:
    """Rebuild a feature map from its ``get_config()`` dict (used by model loading).

    Args:
      config: the map's ``get_config()``; ``config["kind"]`` picks the class, whose ``from_config`` builds it.
      kinds: further kinds the caller knows (``privalign.models.features.MODEL_FEATURE_MAPS`` for maps built
        on models), added to :data:`BUILTIN_FEATURE_MAPS`.

    Raises:
      PrivacyParameterError: ``config`` is not a dict, or its kind is unknown (the message lists the known
        ones).
    """
    if not isinstance(config, dict):
        raise PrivacyParameterError(f"The 'config' parameter must be a dict. Got {type(config).__name__}.")
    known = {**BUILTIN_FEATURE_MAPS, **(kinds or {})}
    kind = config.get("kind")
    if kind == "transformer" and kind not in known:
        # built in, but its module (torch) is imported only when a model file needs it; a PairFeatures by
        # interface (that module does not import this one)
        from privalign.estimation.transformer import TransformerFeatures

        known["transformer"] = cast(type[PairFeatures], TransformerFeatures)
    cls = known.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise PrivacyParameterError(
            f"The 'config[\"kind\"]' parameter must be one of the known feature-map kinds {sorted(known)} "
            "(maps built on models, such as 'minilm', are known to privalign.models.features."
            f"MODEL_FEATURE_MAPS, which the caller passes as kinds=). Got {kind!r} instead."
        )
    return cls.from_config(config)
