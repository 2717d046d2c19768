"""Feature maps built on the models of this layer, plugged into :mod:`privalign.estimation.features` by kind.

* :class:`EmbeddingFeatures` (kind ``"minilm"``): MiniLM sentence embeddings from
  :class:`privalign.models.embeddings.MiniLMEmbedder` (loaded offline, imported lazily), or from any injected
  embedder. Embeddings are L2-normalised; the map projects each row onto the unit ℓ2 ball anyway
  (data-independently; a no-op on unit-norm rows), so each coordinate lies in [−1, 1], a difference in
  [−2, 2] (``feature_bound = 2``) and its ℓ2 norm is at most 2 (``norm_bound = 2``).

The estimation layer (below this one) never imports this module: callers that rebuild a feature map from a
saved config pass :data:`MODEL_FEATURE_MAPS` to
:func:`privalign.estimation.features.feature_map_from_config` (``kinds=``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from privalign._validation import check_int
from privalign.errors import MissingDependencyError, PrivacyParameterError
from privalign.estimation.features import PairFeatures

__all__ = ["Embedder", "EmbeddingFeatures", "MODEL_FEATURE_MAPS"]


class Embedder(Protocol):
    """What :class:`EmbeddingFeatures` needs of an embedder: texts → ``(len(texts), dim)`` array."""

    def embed(self, texts: list[str]) -> Any: ...


class EmbeddingFeatures(PairFeatures):
    """Sentence embeddings of the response (or prompt + response) from engineer E's MiniLM embedder
    (``privalign.models.embeddings.MiniLMEmbedder``: all-MiniLM-L6-v2, offline, unit-norm 384-d rows).

    Args:
      backend: ``"onnx"`` (int8, default) or ``"torch"`` (fp32), passed to ``MiniLMEmbedder``.
      use_prompt: embed ``prompt + "\\n" + response`` instead of the response alone.
      batch_size: texts per forward pass.
      embedder: an object with ``embed(list[str]) -> array`` used instead of building a ``MiniLMEmbedder``
        (e.g. a fake in tests, or an embedder shared between maps). It is not part of ``get_config()``,
        which describes the MiniLM map of ``backend``: a map rebuilt from the config uses MiniLM.

    Each row is projected onto the unit ℓ2 ball, ``e ↦ e / max(1, ‖e‖₂)`` (a fixed map; unit-norm rows
    already satisfy it), so comparison differences lie in [−2, 2] (``feature_bound = 2``) and have
    ``‖φ(a¹) − φ(a⁰)‖₂ ≤ 2`` (``norm_bound = 2``, by the triangle inequality).
    """

    kind = "minilm"

    def __init__(
        self,
        backend: str = "onnx",
        use_prompt: bool = False,
        batch_size: int = 64,
        *,
        embedder: Embedder | None = None,
    ) -> None:
        self.backend = backend
        self.use_prompt = use_prompt
        self.batch_size = batch_size
        if embedder is not None and not callable(getattr(embedder, "embed", None)):
            raise PrivacyParameterError(
                f"The 'embedder' parameter must have an embed(texts) method. Got {type(embedder).__name__}."
            )
        self._embedder_cache: Any = embedder

    @property
    def feature_bound(self) -> float:
        return 2.0

    @property
    def norm_bound(self) -> float:
        """2: rows lie in the unit ℓ2 ball (enforced by :meth:`transform`), so a difference has norm ≤ 2."""
        return 2.0

    def load_embedder(self) -> Any:
        """The embedder: the injected one, else a ``MiniLMEmbedder(backend, batch_size=...)`` built on first
        use and kept.

        Raises:
          MissingDependencyError: the models extra (onnxruntime/torch, the MiniLM packages) is missing.
        """
        if self._embedder_cache is None:
            try:
                from privalign.models.embeddings import MiniLMEmbedder
            except ImportError as exc:
                raise MissingDependencyError(
                    "EmbeddingFeatures needs privalign.models.embeddings (pip install 'privalign[models]')."
                ) from exc
            self._embedder_cache = MiniLMEmbedder(
                self.backend, batch_size=check_int(self.batch_size, "batch_size", low=1)
            )
        return self._embedder_cache

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        """φ of each text: a dense ``(len(texts), 384)`` float64 matrix whose rows lie in the unit ℓ2 ball."""
        if isinstance(texts, str):
            raise PrivacyParameterError(
                "The 'texts' parameter must be a sequence of strings, not a single string."
            )
        X = np.asarray(self.load_embedder().embed(list(texts)), dtype=np.float64)
        if X.ndim == 2 and X.shape[0]:
            # Projection onto the unit ball (not normalisation): a fixed map that makes norm_bound hold for
            # any embedder, and leaves the unit-norm MiniLM rows as they are (up to rounding).
            norms = np.sqrt(np.einsum("ij,ij->i", X, X))
            X = X / np.maximum(1.0, norms)[:, None]
        return np.clip(X, -1.0, 1.0)

    def get_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "backend": self.backend,
            "use_prompt": bool(self.use_prompt),
            "batch_size": int(self.batch_size),
        }

    def __repr__(self) -> str:
        return f"EmbeddingFeatures(backend={self.backend!r}, use_prompt={self.use_prompt})"


#: The feature maps of this layer by kind, for
#: :func:`privalign.estimation.features.feature_map_from_config` (``kinds=MODEL_FEATURE_MAPS``).
MODEL_FEATURE_MAPS: dict[str, type[PairFeatures]] = {EmbeddingFeatures.kind: EmbeddingFeatures}
