"""DPPrefSyn's private preference model (Gao & Yang, "Differentially Private Preference Data Synthesis for
Large Language Model Alignment", ICML 2026, arXiv:2605.30808v1): DP-PCA of the chosen − rejected feature
differences → DP k-means of the projected differences → per-cluster linear Bradley–Terry by DP-SGD; then the
released models label public candidates (:meth:`DPPrefSynModel.synthesize`).

Budget split [the public code's]: ε₁ = ε/8 (DP-PCA), ε₂ = ε/8 (DP k-means), ε₃ = 3ε/4 (DP-SGD); δ split in
three equal parts [our choice: the paper's PCA and k-means are pure ε-DP (OpenDP, diffprivlib), ours are
Gaussian]. Basic composition: (ε₁ + ε₂ + ε₃, δ₁ + δ₂ + δ₃) = (ε, δ).

Deviations from the public code, each the conservative option (LIMITATIONS.md):
  * DP-PCA is the uncentred second moment (no mean released); the paper's OpenDP PCA centres with a DP mean.
  * The per-cluster DP-SGD is ONE DP-SGD run over block features (each comparison's projected difference in
    its cluster's block, zeros elsewhere): the clusters' heads are disjoint blocks of one linear model, the
    sampling rate and the number of steps use the public n, so no private cluster size enters the schedule
    (the public code sets each cluster's rate from a nominal size n/(K + 4)), and the guarantee is exactly
    :class:`~privalign.estimation.baselines.DPSGDLinear`'s under replace-one.
  * Cluster weights and the small-cluster filter use the DP k-means' noisy sizes (the public code uses the
    exact cluster sizes, which are not private).

Privacy:
  Unit: one preference pair (``"sample"``). Relation: replace-one. Guarantee: (ε, δ)-DP by basic composition
  of DP-PCA ((ε₁, δ₁), Gaussian), DP k-means ((ε₂, δ₂), zCDP over its releases) and DP-SGD ((ε₃, δ₃), PLD
  under replace-one; the cluster assignment is a function of one record and the released centres only).
  Labelling public candidates with the released model is post-processing. Event: ``ComposedEvent`` of the
  three stages' ``ApproxDPEvent`` guarantees (``privacy_event_``), composed by
  :class:`~privalign.accounting.accountant.ApproxDPAccountant`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privalign._validation import check_int, check_probability, check_real
from privalign.accounting.events import ApproxDPEvent, ComposedEvent, PrivacyEvent
from privalign.mechanisms._common import check_epsilon
from privalign.mechanisms.clustering import DPPCA, DPKMeans, assign, clip_rows

__all__ = ["DPPrefSynModel", "SPLIT"]

#: the ε shares of DP-PCA, DP k-means and DP-SGD [the public code: eps_pca = eps_cluster = ε/8]
SPLIT = (0.125, 0.125, 0.75)


def _unit_rows(X: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(X, axis=1, keepdims=True)
    return np.where(n > 0, X / np.where(n > 0, n, 1.0), 0.0)


class DPPrefSynModel:
    """The private stages of DPPrefSyn (module docstring: guarantee, unit, relation, deviations).

    Args:
      epsilon, delta: the total (ε, δ).
      n_components: DP-PCA dimension k [the public code: 20].
      n_clusters: K [the public code: 5].
      kmeans_iterations: noisy Lloyd rounds.
      dpsgd_epochs, dpsgd_batch: DP-SGD schedule (``None`` batch: DPSGDLinear's default).
      min_cluster_share: a cluster is used if its noisy size ≥ this share of n [the public code: 1/(K + 4)].
      random_state: a seed or ``numpy.random.Generator``.

    Attributes (after :meth:`fit`, all DP outputs): ``components_`` (k × d), ``centers_`` (K × k),
    ``sizes_`` (noisy), ``theta_`` (K × k), ``weights_`` (the clusters' sampling probabilities),
    ``privacy_event_``, ``guarantee_`` ((ε, δ)).
    """

    def __init__(
        self,
        *,
        epsilon: float,
        delta: float,
        n_components: int = 20,
        n_clusters: int = 5,
        kmeans_iterations: int = 5,
        dpsgd_epochs: float = 4.0,
        dpsgd_batch: int | None = None,
        min_cluster_share: float | None = None,
        random_state: Any = None,
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        if math.isinf(self.epsilon):
            raise ValueError("DPPrefSynModel: epsilon must be finite.")
        self.delta = check_probability(delta, "delta")
        self.n_components = check_int(n_components, "n_components", low=1)
        self.n_clusters = check_int(n_clusters, "n_clusters", low=1)
        self.kmeans_iterations = check_int(kmeans_iterations, "kmeans_iterations", low=1)
        self.dpsgd_epochs = check_real(dpsgd_epochs, "dpsgd_epochs", low=0.0, closed="neither")
        self.dpsgd_batch = dpsgd_batch
        self.min_cluster_share = (
            1.0 / (self.n_clusters + 4) if min_cluster_share is None else float(min_cluster_share)
        )
        self.random_state = random_state

    def budgets(self) -> list[tuple[float, float]]:
        """(ε_i, δ_i) of DP-PCA, DP k-means and DP-SGD."""
        d = math.nextafter(math.nextafter(self.delta / 3.0, 0.0), 0.0)  # rounded down: Σδ_i ≤ δ
        return [(self.epsilon * s, d) for s in SPLIT]

    def fit(self, diffs: Any) -> DPPrefSynModel:
        """Fit on the chosen − rejected feature differences ``(n, d)`` (a row per private pair; n public)."""
        from privalign.estimation.baselines import DPSGDLinear

        rng = self.random_state if isinstance(self.random_state, np.random.Generator) else None
        rng = rng or np.random.default_rng(self.random_state)
        X = _unit_rows(np.asarray(diffs, dtype=np.float64))  # per-record map: ‖x‖ ≤ 1
        n = X.shape[0]
        (e1, d1), (e2, d2), (e3, d3) = self.budgets()
        pca = DPPCA(self.n_components, e1, d1, row_bound=1.0)
        self.components_ = pca.fit(X, rng=rng)
        Z = _unit_rows(X @ self.components_.T)
        km = DPKMeans(self.n_clusters, e2, d2, iterations=self.kmeans_iterations, row_bound=1.0)
        out = km.fit(Z, rng=rng)
        self.centers_, self.sizes_ = out["centers"], out["sizes"]
        lab = assign(clip_rows(Z, 1.0), self.centers_)
        K, k = self.centers_.shape
        Phi = np.zeros((n, K * k))
        for c in range(K):
            Phi[lab == c, c * k : (c + 1) * k] = Z[lab == c]
        sign = np.where(rng.random(n) < 0.5, 1.0, -1.0)  # a data-independent orientation per pair
        sgd = DPSGDLinear(
            epsilon=e3,
            delta=d3,
            epochs=self.dpsgd_epochs,
            batch_size=self.dpsgd_batch,
            feature_norm_bound=1.0,
            random_state=int(rng.integers(0, 2**31 - 1)),
        )
        sgd.fit(Phi * sign[:, None], (sign > 0).astype(np.float64))
        self.theta_ = np.asarray(sgd.coef_, float).reshape(K, k)
        w = np.maximum(self.sizes_, 0.0)
        keep = self.sizes_ >= self.min_cluster_share * n
        if not keep.any():
            keep = self.sizes_ == self.sizes_.max()
        w = np.where(keep, np.maximum(w, 1e-12), 0.0)
        self.weights_ = w / w.sum()
        stage_events = tuple(ApproxDPEvent(epsilon=e, delta=dl, unit="sample") for e, dl in self.budgets())
        self.stage_events_: tuple[PrivacyEvent, ...] = (pca.event, km.event, sgd.privacy_event_)
        self.privacy_event_ = ComposedEvent(events=stage_events, unit="sample")
        from privalign.accounting.accountant import ApproxDPAccountant

        acct = ApproxDPAccountant()
        acct.compose(self.privacy_event_)
        self.guarantee_ = acct.get_total()
        return self

    def project(self, feats: Any) -> np.ndarray:
        """Unit-norm projections of candidate features onto the released components."""
        return _unit_rows(np.asarray(feats, dtype=np.float64) @ self.components_.T)

    def synthesize(
        self, candidate_feats: list[Any], *, rng: np.random.Generator, min_gap: float = 0.0
    ) -> list[tuple[int, int] | None]:
        """For each public prompt's candidates (an ``(m_i, d)`` feature matrix), a cluster drawn by the
        released weights scores the candidates; returns ``(best, worst)`` indices, or ``None`` where fewer
        than two candidates or the score gap is below ``min_gap`` [the public code: 0.5]. Post-processing."""
        out: list[tuple[int, int] | None] = []
        clusters = rng.choice(len(self.weights_), size=len(candidate_feats), p=self.weights_)
        for F, c in zip(candidate_feats, clusters):
            F = np.asarray(F, dtype=np.float64)
            if F.shape[0] < 2:
                out.append(None)
                continue
            s = self.project(F) @ self.theta_[c]
            b, w = int(np.argmax(s)), int(np.argmin(s))
            out.append(None if b == w or s[b] - s[w] < min_gap else (b, w))
        return out
