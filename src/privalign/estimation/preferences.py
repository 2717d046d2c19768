"""Pairwise preference data: comparison features, labels, prompt ids; splits by prompt or by row position.

A comparison ``i`` is ``(k_i, a_i⁰, a_i¹, y_i)``: a prompt, two responses and a label, ``y_i = 1`` when
``a_i¹ ≻ a_i⁰`` (spec-reward-estimation.md §1). Estimators see ``x_i = φ(k_i, a_i¹) − φ(k_i, a_i⁰)``.

From (chosen, rejected) text pairs the orientation is randomised with a data-independent coin per pair
(``a¹ = chosen`` with probability ½), so that both labels occur; the coin uses ``random_state`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from privalign._validation import check_real
from privalign.errors import PrivacyParameterError
from privalign.estimation.base import check_features, check_labels
from privalign.rng import as_generator

__all__ = ["PreferenceData", "train_test_split", "train_test_split_by_prompt", "train_test_split_by_row"]


@dataclass
class PreferenceData:
    """A set of pairwise comparisons.

    Attributes:
      X: ``(n, d)`` comparison features ``x_i = φ(a¹) − φ(a⁰)``, dense or ``scipy.sparse`` CSR.
      y: ``(n,)`` float64 labels in {0, 1}; ``1`` means the second response (``a¹``) is preferred.
      prompt_ids: ``(n,)`` group ids (comparisons sharing a prompt stay on one side of a split).
      texts: optional list of ``(prompt, a0, a1)`` triples, aligned with the rows.
      feature_config: the public feature map's config (``HashedNgramFeatures.get_config()``), if any.
      user_ids: optional ``(n,)`` ids of the user who gave each label (user-level privacy,
        :mod:`privalign.estimation.users`).
    """

    X: Any
    y: np.ndarray
    prompt_ids: np.ndarray | None = None
    texts: list[tuple[str, str, str]] | None = None
    feature_config: dict | None = field(default=None)
    user_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.X.shape[0] if getattr(self.X, "shape", None) else len(self.X)
        self.y = check_labels(self.y, None)
        if self.y.shape[0] != n:
            raise PrivacyParameterError(
                f"The 'y' parameter must have one label per row of X ({n}). Got {self.y.shape[0]} labels "
                "instead."
            )
        self.X = check_features(self.X, "X")
        if self.prompt_ids is None:
            self.prompt_ids = np.arange(n)
        else:
            self.prompt_ids = np.asarray(self.prompt_ids)
            if self.prompt_ids.shape != (n,):
                raise PrivacyParameterError(
                    f"The 'prompt_ids' parameter must have shape ({n},). Got {self.prompt_ids.shape} instead."
                )
        if self.user_ids is not None:
            self.user_ids = np.asarray(self.user_ids, dtype=object)
            if self.user_ids.shape != (n,):
                raise PrivacyParameterError(
                    f"The 'user_ids' parameter must have shape ({n},). Got {self.user_ids.shape} instead."
                )
        if self.texts is not None and len(self.texts) != n:
            raise PrivacyParameterError(
                f"The 'texts' parameter must have {n} entries. Got {len(self.texts)} instead."
            )

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    def subset(self, idx: Any) -> PreferenceData:
        """The comparisons at positions ``idx`` (a new object; features are copied by indexing)."""
        idx = np.asarray(idx)
        assert self.prompt_ids is not None  # set by __post_init__
        return PreferenceData(
            X=self.X[idx],
            y=self.y[idx],
            prompt_ids=self.prompt_ids[idx],
            texts=None if self.texts is None else [self.texts[int(i)] for i in idx],
            feature_config=self.feature_config,
            user_ids=None if self.user_ids is None else self.user_ids[idx],
        )

    @classmethod
    def from_text_pairs(
        cls,
        prompts: Sequence[str],
        chosen: Sequence[str],
        rejected: Sequence[str],
        feature_map: Any,
        *,
        prompt_ids: Sequence[Any] | None = None,
        random_state: np.random.Generator | int | None = None,
        keep_texts: bool = False,
        user_ids: Sequence[Any] | None = None,
    ) -> PreferenceData:
        """Build comparisons from (prompt, chosen, rejected) texts through a public feature map.

        Each pair is oriented by a fair, data-independent coin: with probability ½, ``a¹ = chosen`` and
        ``y = 1``, else ``a¹ = rejected`` and ``y = 0``.

        Args:
          prompts, chosen, rejected: aligned text sequences.
          feature_map: an object with ``transform_pairs(prompts, responses) -> matrix`` (φ(k, a) per row)
            and ``get_config() -> dict``, e.g. :class:`HashedNgramFeatures`.
          prompt_ids: group ids for splitting (default: the prompt text itself).
          random_state: seed of the orientation coins.
          keep_texts: keep ``(prompt, a0, a1)`` triples on the object.
          user_ids: the user of each pair (kept on the object as ``user_ids``).

        Raises:
          PrivacyParameterError: mismatched lengths or no pairs.
        """
        n = len(prompts)
        if len(chosen) != n or len(rejected) != n:
            raise PrivacyParameterError(
                f"The 'prompts', 'chosen' and 'rejected' parameters must have equal lengths. "
                f"Got {n}, {len(chosen)} and {len(rejected)} instead."
            )
        if n == 0:
            raise PrivacyParameterError(
                "The 'prompts' parameter must contain at least one pair. Got 0 instead."
            )
        rng = as_generator(random_state)
        y = (rng.random(n) < 0.5).astype(np.float64)
        a1 = [c if yi else r for c, r, yi in zip(chosen, rejected, y)]
        a0 = [r if yi else c for c, r, yi in zip(chosen, rejected, y)]
        phi1 = feature_map.transform_pairs(list(prompts), a1)
        phi0 = feature_map.transform_pairs(list(prompts), a0)
        X = (phi1 - phi0).tocsr() if sp.issparse(phi1) else np.asarray(phi1) - np.asarray(phi0)
        if sp.issparse(X):
            X.eliminate_zeros()
        ids = np.asarray(list(prompts) if prompt_ids is None else list(prompt_ids), dtype=object)
        texts = [(p, x0, x1) for p, x0, x1 in zip(prompts, a0, a1)] if keep_texts else None
        return cls(
            X=X,
            y=y,
            prompt_ids=ids,
            texts=texts,
            feature_config=feature_map.get_config(),
            user_ids=None if user_ids is None else np.asarray(list(user_ids), dtype=object),
        )


def train_test_split_by_prompt(
    data: PreferenceData,
    *,
    test_size: float = 0.2,
    random_state: np.random.Generator | int | None = None,
    groups: np.ndarray | None = None,
) -> tuple[PreferenceData, PreferenceData]:
    """Split comparisons so that no prompt (or other group) appears on both sides.

    Args:
      data: the comparisons.
      test_size: fraction of *prompts* assigned to the test side, in (0, 1).
      random_state: seed of the prompt permutation.
      groups: the groups kept together instead of the prompts (e.g. ``data.user_ids``).

    Returns:
      ``(train, test)``.

    Raises:
      PrivacyParameterError: ``test_size`` outside (0, 1), or fewer than two distinct prompts.
    """
    test_size = check_real(test_size, "test_size", low=0.0, high=1.0, closed="neither")
    rng = as_generator(random_state)
    ids = data.prompt_ids if groups is None else np.asarray(groups)
    assert ids is not None  # set by PreferenceData.__post_init__
    uniq, inverse = np.unique(ids.astype(str) if ids.dtype == object else ids, return_inverse=True)
    if uniq.shape[0] < 2:
        raise PrivacyParameterError(
            "The 'data' parameter must contain at least two distinct prompts to split by prompt. Got "
            f"{uniq.shape[0]}."
        )
    perm = rng.permutation(uniq.shape[0])
    n_test = min(max(1, int(round(test_size * uniq.shape[0]))), uniq.shape[0] - 1)
    is_test_group = np.zeros(uniq.shape[0], dtype=bool)
    is_test_group[perm[:n_test]] = True
    test_mask = is_test_group[inverse]
    return data.subset(np.flatnonzero(~test_mask)), data.subset(np.flatnonzero(test_mask))


def train_test_split_by_row(
    data: PreferenceData, *, test_size: float = 0.2, random_state: np.random.Generator | int | None = None
) -> tuple[PreferenceData, PreferenceData]:
    """Split comparisons by row *position*: a permutation of ``0..n-1`` drawn from ``random_state`` alone,
    so which side a position lands on, and both sides' sizes, depend on n and the seed only, never on the
    records. Replacing one record moves no other record, and the sizes are public once n is.

    A prompt may appear on both sides (the price of data independence when prompts are private).

    Raises:
      PrivacyParameterError: ``test_size`` outside (0, 1), or fewer than two comparisons.
    """
    test_size = check_real(test_size, "test_size", low=0.0, high=1.0, closed="neither")
    n = int(data.y.shape[0])
    if n < 2:
        raise PrivacyParameterError(
            f"The 'data' parameter must contain at least two comparisons to split. Got {n}."
        )
    n_test = min(max(1, int(round(test_size * n))), n - 1)
    perm = as_generator(random_state).permutation(n)
    return data.subset(np.sort(perm[n_test:])), data.subset(np.sort(perm[:n_test]))


def train_test_split(
    data: PreferenceData,
    *,
    unit: str,
    test_size: float = 0.2,
    random_state: np.random.Generator | int | None = None,
) -> tuple[PreferenceData, PreferenceData]:
    """The split a privacy unit allows: data-independent with respect to what the unit protects.

    * ``unit="sample"`` (one comparison, prompt included, is private): :func:`train_test_split_by_row`.
      Grouping by prompt would make the split depend on the private prompts (replacing one record's
      prompt re-permutes the unique prompts and moves other records across), breaking the parallel
      composition of fit and evaluation and the public n of the default iteration count.
    * ``unit="label"`` (features and prompts public, labels private) and ``unit="none"`` (no guarantee):
      :func:`train_test_split_by_prompt`, which depends on the public prompts only.
    * ``unit="user"`` (user-level label-DP: the pairs and who gave them are public, every label of a user is
      private): by user, so that all of a user's pairs land on one side (the groups are ``data.user_ids``).

    Raises:
      PrivacyParameterError: ``unit`` not one of ``"sample"``, ``"label"``, ``"none"``, ``"user"``; ``"user"``
        without ``user_ids``; or as the splits.
    """
    if unit == "sample":
        return train_test_split_by_row(data, test_size=test_size, random_state=random_state)
    if unit in ("label", "none"):
        return train_test_split_by_prompt(data, test_size=test_size, random_state=random_state)
    if unit == "user":
        if data.user_ids is None:
            raise PrivacyParameterError(
                "The 'data' parameter must carry user_ids to split by user. Got None."
            )
        return train_test_split_by_prompt(
            data, test_size=test_size, random_state=random_state, groups=data.user_ids
        )
    raise PrivacyParameterError(
        f"The 'unit' parameter must be one of ['sample', 'label', 'none', 'user']. Got {unit!r} instead."
    )
