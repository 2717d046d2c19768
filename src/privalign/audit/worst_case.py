"""Analytic worst-case neighbouring pairs for the built-in mechanisms, and ready-to-run audits.

Each pair is chosen so that the mechanism's privacy loss is as large as possible on an event of
non-negligible probability, and so that the negative controls of :mod:`privalign.audit.broken` are
caught (a factor-2 scale bug is *undetectable* on a bad pair, e.g. ``(1,0,0,0)`` vs ``(0,1,0,0)`` for
noisy argmax). Events (post-processed outcomes, thresholds) are fixed here, before any sampling.

===================  ========================================================  ===========================
mechanism            pair (D vs D′)                                            events
===================  ========================================================  ===========================
noisy_argmax         ``(Δ,0,…,0)`` vs ``(0,Δ,…,Δ)``, d candidates (default 8)  {index 0}, {other}
noisy_top_k          ``(Δ·1_k, 0·1_m)`` vs ``(0·1_k, Δ·1_m)``,                 {all k in the first k}
                     m = 2k (default k=2)
randomized_response  bit 0 vs bit 1                                            {0}, {1}
user_randomized_     one user's K labels all 0 vs all 1 (default K = 4)        {T ≤ t}, {T > t}, T = ones
response                                                                       among the K, t = 0..K−1
laplace              0 vs Δ (one coordinate)                                   {x ≤ 0}, {x > Δ} (+ compl.)
gaussian             0 vs Δ (one coordinate)                                   {x ≤ Δ/2 − kσ}, k=½,1,1½,2
peeling              ``(λ·1_s, 0·1_{d−s})`` vs ``(0·1_s, λ·1_{d−s})``          {Σ released first s > sλ}
                     (s=1, d=3)
===================  ========================================================  ===========================
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privalign._validation import check_choice, check_int
from privalign.audit.audit import AuditResult, audit_mechanism, audit_threshold
from privalign.audit.broken import BROKEN_VARIANTS, BrokenPeeling, broken_mechanism
from privalign.errors import PrivacyParameterError
from privalign.rng import entropy_int

__all__ = ["MECHANISMS", "DEFAULT_SAMPLES", "AuditSetup", "worst_case_setup", "audit_builtin"]

MECHANISMS = (
    "noisy_argmax",
    "gaussian",
    "laplace",
    "randomized_response",
    "peeling",
    "noisy_top_k",
    "user_randomized_response",
)

#: Draws per side used when none are given: enough to catch the negative controls at the default
#: parameters (see tests/audit), small enough to run in about a second.
DEFAULT_SAMPLES = {
    "noisy_argmax": 10_000,
    "noisy_top_k": 10_000,
    "randomized_response": 10_000,
    "user_randomized_response": 10_000,
    "laplace": 10_000,
    "gaussian": 50_000,
    "peeling": 4_000_000,
}


@dataclass(frozen=True)
class AuditSetup:
    """A mechanism, a worst-case pair and the events of its audit, ready to :meth:`run`."""

    mechanism: str
    pair: str
    claimed_epsilon: float
    delta: float
    sample_d: Callable[[int], np.ndarray]
    sample_d_prime: Callable[[int], np.ndarray]
    outcomes: tuple | None = None
    thresholds: tuple | None = None
    statistic: Callable[[np.ndarray], np.ndarray] | None = None
    parameters: dict = field(default_factory=dict)
    broken: str | None = None
    labels: dict | None = None

    def run(self, n: int, alpha: float) -> AuditResult:
        """Draw ``n`` outputs per side and return the audit (false-positive rate ``alpha``)."""
        if self.thresholds is None:
            return audit_mechanism(
                self.sample_d,
                self.sample_d_prime,
                n,
                alpha,
                claimed_epsilon=self.claimed_epsilon,
                delta=self.delta,
                outcomes=self.outcomes,
                labels=self.labels,
            )
        return audit_threshold(
            self.sample_d,
            self.sample_d_prime,
            n,
            alpha,
            thresholds=self.thresholds,
            claimed_epsilon=self.claimed_epsilon,
            delta=self.delta,
            statistic=self.statistic,
        )


def _chunked(fn: Callable[[int], np.ndarray], chunk: int = 1_000_000) -> Callable[[int], np.ndarray]:
    def sample(n: int) -> np.ndarray:
        if n <= chunk:
            return fn(n)
        return np.concatenate([fn(min(chunk, n - i)) for i in range(0, n, chunk)])

    return sample


def worst_case_setup(
    mechanism: str,
    *,
    epsilon: float,
    rng: np.random.Generator,
    delta: float | None = None,
    sensitivity: float = 1.0,
    broken: str | None = None,
    candidates: int = 8,
    k: int = 2,
    sparsity: int = 1,
    dimension: int | None = None,
    max_contributions: int = 4,
) -> AuditSetup:
    """Build the audit of a built-in mechanism on its analytic worst-case pair.

    Args:
      mechanism: One of :data:`MECHANISMS`.
      epsilon: The mechanism's ε parameter (per selection for ``noisy_top_k``; the claim is then k·ε).
      rng: A ``numpy.random.Generator`` driving the draws (audits are reproducible by design).
      delta: δ, required for ``gaussian`` (calibration) and ``peeling``.
      sensitivity: Δ (λ for Peeling).
      broken: A negative-control variant from :data:`privalign.audit.broken.BROKEN_VARIANTS`.
      candidates: d for ``noisy_argmax``.
      k: k for ``noisy_top_k``.
      sparsity: s for ``peeling``.
      max_contributions: K for ``user_randomized_response`` (labels per user).
      dimension: d for ``peeling`` (default s + 2).

    Returns:
      An :class:`AuditSetup` whose claim is the correct mechanism's guarantee.
    """
    from privalign.mechanisms import (
        GaussianMechanism,
        LaplaceMechanism,
        NoisyArgmax,
        NoisyTopK,
        Peeling,
        RandomizedResponse,
        UserRandomizedResponse,
    )

    check_choice(mechanism, "mechanism", MECHANISMS)
    if broken is not None:
        check_choice(broken, "broken", BROKEN_VARIANTS[mechanism])
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"The 'rng' parameter must be a numpy.random.Generator. Got {type(rng).__name__} instead."
        )
    wrap = (lambda m: broken_mechanism(m, broken)) if broken else (lambda m: m)
    D = float(sensitivity)
    params: dict[str, Any] = {"epsilon": epsilon, "sensitivity": D}

    if mechanism == "noisy_argmax":
        d = check_int(candidates, "candidates", low=3)
        good = NoisyArgmax(epsilon, D)
        m = wrap(good)
        sd = np.zeros(d)
        sd[0] = D
        sdp = np.full(d, D)
        sdp[0] = 0.0
        params["candidates"] = d
        return AuditSetup(
            mechanism,
            f"({D:g},0,…,0) vs (0,{D:g},…,{D:g}), d={d}",
            good.epsilon,
            0.0,
            lambda n: (m(np.broadcast_to(sd, (n, d)), rng=rng) == 0).astype(np.int64),
            lambda n: (m(np.broadcast_to(sdp, (n, d)), rng=rng) == 0).astype(np.int64),
            outcomes=(0, 1),
            parameters=params,
            broken=broken,
            labels={1: "selected index 0", 0: "selected another index"},
        )
    if mechanism == "noisy_top_k":
        k = check_int(k, "k", low=1)
        mm = 2 * k
        topk = NoisyTopK(k, epsilon, D)
        m = wrap(topk)
        sd = np.concatenate([np.full(k, D), np.zeros(mm)])
        sdp = np.concatenate([np.zeros(k), np.full(mm, D)])
        params.update(k=k, candidates=k + mm)

        def first_block(scores: np.ndarray) -> Callable[[int], np.ndarray]:
            return lambda n: np.all(m(np.broadcast_to(scores, (n, k + mm)), rng=rng) < k, axis=1).astype(
                np.int64
            )

        return AuditSetup(
            mechanism,
            f"({D:g}·1_{k}, 0·1_{mm}) vs (0·1_{k}, {D:g}·1_{mm})",
            k * topk.epsilon,
            0.0,
            first_block(sd),
            first_block(sdp),
            outcomes=(0, 1),
            parameters=params,
            broken=broken,
            labels={1: f"all {k} selected among the first {k}", 0: "some selected index outside the first k"},
        )
    if mechanism == "randomized_response":
        rr = RandomizedResponse(epsilon)
        m = wrap(rr)
        params.pop("sensitivity")
        return AuditSetup(
            mechanism,
            "bit 0 vs bit 1",
            rr.epsilon,
            0.0,
            lambda n: m(np.zeros(n, dtype=np.int64), rng=rng),
            lambda n: m(np.ones(n, dtype=np.int64), rng=rng),
            outcomes=(0, 1),
            parameters=params,
            broken=broken,
        )
    if mechanism == "user_randomized_response":
        kk = check_int(max_contributions, "max_contributions", low=1)
        urr = UserRandomizedResponse(epsilon, max_contributions=kk)
        m = wrap(urr)
        params.pop("sensitivity")
        params["max_contributions"] = kk
        return AuditSetup(
            mechanism,
            f"one user's {kk} labels: all 0 vs all 1",
            urr.epsilon,
            0.0,
            lambda n: m(np.zeros((n, kk), dtype=np.int64), rng=rng),
            lambda n: m(np.ones((n, kk), dtype=np.int64), rng=rng),
            thresholds=tuple(float(t) for t in range(kk)),
            statistic=lambda out: np.asarray(out).sum(axis=1),
            parameters=params,
            broken=broken,
        )
    if mechanism == "laplace":
        lap = LaplaceMechanism.from_epsilon(epsilon, D)
        m = wrap(lap)
        params["scale"] = lap.scale
        return AuditSetup(
            mechanism,
            f"0 vs {D:g} (one coordinate)",
            lap.epsilon,
            0.0,
            lambda n: m(np.zeros(n), rng=rng),
            lambda n: m(np.full(n, D), rng=rng),
            thresholds=(0.0, D),
            parameters=params,
            broken=broken,
        )
    if mechanism == "gaussian":
        if delta is None:
            raise PrivacyParameterError(
                "The 'delta' parameter is required for the gaussian audit. Got None instead."
            )
        gauss = GaussianMechanism.from_epsilon_delta(epsilon, delta, D)
        m = wrap(gauss)
        sig = gauss.sigma
        params.update(delta=delta, sigma=sig)
        ts = tuple(D / 2.0 - c * sig for c in (0.5, 1.0, 1.5, 2.0))
        return AuditSetup(
            mechanism,
            f"0 vs {D:g} (one coordinate)",
            float(epsilon),
            float(delta),
            lambda n: m(np.zeros(n), rng=rng),
            lambda n: m(np.full(n, D), rng=rng),
            thresholds=ts,
            parameters=params,
            broken=broken,
        )
    # peeling
    if delta is None:
        raise PrivacyParameterError(
            "The 'delta' parameter is required for the peeling audit. Got None instead."
        )
    s = check_int(sparsity, "sparsity", low=1)
    if broken == "sqrt_scale":
        m = BrokenPeeling(s, float(epsilon), float(delta), D)
    else:
        m = Peeling(s, epsilon, delta, D)
    eps_claim, delta_claim = m.accounted
    dim = s + 2 if dimension is None else check_int(dimension, "dimension", low=s + 1)
    vd = np.concatenate([np.full(s, D), np.zeros(dim - s)])
    vdp = np.concatenate([np.zeros(s), np.full(dim - s, D)])
    params.update(
        delta=delta, sparsity=s, dimension=dim, noise_scale=m.noise_scale, accounted=[eps_claim, delta_claim]
    )

    def stat(out: np.ndarray) -> np.ndarray:
        return out[:, :s].sum(axis=1)

    return AuditSetup(
        mechanism,
        f"({D:g}·1_{s}, 0·1_{dim - s}) vs (0·1_{s}, {D:g}·1_{dim - s})",
        float(eps_claim),
        float(min(delta_claim, 1.0)),
        _chunked(lambda n: m(np.broadcast_to(vd, (n, dim)), rng=rng)[0]),
        _chunked(lambda n: m(np.broadcast_to(vdp, (n, dim)), rng=rng)[0]),
        thresholds=(s * D,),
        statistic=stat,
        parameters=params,
        broken=broken,
    )


def audit_builtin(
    mechanism: str,
    *,
    epsilon: float,
    delta: float | None = None,
    samples: int | None = None,
    alpha: float = 1e-3,
    seed: int | None = None,
    broken: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Audit a built-in mechanism on its worst-case pair; returns a JSON-able report.

    The report holds the mechanism, the pair, the parameters, the claimed ε (and δ), the lower bound
    ε̂, α, the samples per side and the verdict (``"consistent"`` or ``"violation"``).
    """
    n = (
        DEFAULT_SAMPLES[check_choice(mechanism, "mechanism", MECHANISMS)]
        if samples is None
        else check_int(samples, "samples", low=1)
    )
    entropy = entropy_int(np.random.SeedSequence(seed))
    setup = worst_case_setup(
        mechanism, epsilon=epsilon, delta=delta, rng=np.random.default_rng(entropy), broken=broken, **kwargs
    )
    res = setup.run(n, alpha)
    out: dict[str, Any] = {
        "mechanism": mechanism,
        "pair": setup.pair,
        "broken": broken,
        "parameters": setup.parameters,
        "seed": entropy,
    }
    out.update(res.to_dict())
    if not math.isfinite(out["epsilon_lower_bound"]):  # pragma: no cover - bound is always finite
        out["epsilon_lower_bound"] = None
    return out
