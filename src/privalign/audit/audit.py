"""Empirical lower bounds on the privacy loss of a mechanism, from samples on a neighbouring pair.

Principle: if M is (ε, δ)-DP then for every event E and neighbours D, D′,
``P[M(D) ∈ E] ≤ e^ε · P[M(D′) ∈ E] + δ`` (and the same with D, D′ swapped). Estimate both probabilities
for a set of events *fixed before sampling*, with exact Clopper–Pearson intervals; with probability
≥ 1 − α all intervals cover simultaneously (Bonferroni over the 2·|events| intervals), and then

    ε̂ = max over events and both directions of  log( (p_lo − δ) / q_hi )

is ≤ the true ε. So ``ε̂ > claimed ε`` refutes the claim with false-positive probability ≤ α.

Two front ends: :func:`audit_mechanism` (discrete outputs: one event per outcome) and
:func:`audit_threshold` (real-valued outputs or statistics: events ``{T ≤ t}`` and ``{T > t}`` for
thresholds ``t`` chosen a priori). An audit can only *refute* a claim; passing does not prove privacy.

References:
  Ding, Wang, Wang, Zhang & Kifer, "Detecting Violations of Differential Privacy", CCS 2018,
  arXiv:1805.10277v1. Jagielski, Ullman & Oprea, "Auditing Differentially Private Machine Learning: How
  Private is Private SGD?", NeurIPS 2020, arXiv:2006.07709v1 (Clopper–Pearson ε lower bounds, §3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privalign._validation import check_int, check_probability, check_real
from privalign.audit.stats import clopper_pearson
from privalign.errors import PrivacyParameterError

__all__ = ["AuditResult", "epsilon_lower_bound", "audit_mechanism", "audit_threshold"]


@dataclass(frozen=True)
class AuditResult:
    """What an audit found.

    Attributes:
      epsilon_lower_bound: ε̂ ≥ 0; with probability ≥ 1 − α it is ≤ the mechanism's true ε (at ``delta``).
      claimed_epsilon: The ε being audited (None when only a bound was asked for).
      delta: The δ of the claim (0 for pure DP).
      alpha: The false-positive rate of the whole audit (Bonferroni already applied).
      samples: Draws per side (n on D, n on D′).
      n_intervals: Number of Clopper–Pearson intervals (2 · events).
      witness: The event and direction attaining ε̂, with its counts.
      passed: ``epsilon_lower_bound <= claimed_epsilon`` (None without a claim).
    """

    epsilon_lower_bound: float
    claimed_epsilon: float | None
    delta: float
    alpha: float
    samples: tuple[int, int]
    n_intervals: int
    witness: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        if self.claimed_epsilon is None:
            return None
        return self.epsilon_lower_bound <= self.claimed_epsilon

    @property
    def verdict(self) -> str:
        p = self.passed
        if p is None:
            return "no claim"
        return "consistent" if p else "violation"

    def to_dict(self) -> dict[str, Any]:
        return {
            "claimed_epsilon": self.claimed_epsilon,
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "delta": self.delta,
            "alpha": self.alpha,
            "samples": list(self.samples),
            "n_intervals": self.n_intervals,
            "verdict": self.verdict,
            "witness": self.witness,
        }


def epsilon_lower_bound(
    counts_d: Any,
    counts_d_prime: Any,
    n_d: int,
    n_d_prime: int,
    *,
    alpha: float,
    delta: float = 0.0,
    event_names: Sequence[Any] | None = None,
    claimed_epsilon: float | None = None,
) -> AuditResult:
    """ε̂ from event counts on D and D′ (the core of every audit).

    Args:
      counts_d: For each event E_j (fixed before sampling), how many of the ``n_d`` draws of M(D) fell in it.
      counts_d_prime: The same for the ``n_d_prime`` draws of M(D′).
      n_d, n_d_prime: Draws per side.
      alpha: False-positive rate of the whole bound; each of the 2·J two-sided intervals gets α/(2J).
      delta: The δ of the claim (subtracted before the ratio).
      event_names: Labels for the witness (default: the event index).
      claimed_epsilon: Stored in the result to give a verdict.

    Returns:
      An :class:`AuditResult`.
    """
    alpha = check_probability(alpha, "alpha")
    delta = check_real(delta, "delta", low=0.0, high=1.0, closed="left")
    n_d = check_int(n_d, "n_d", low=1)
    n_d_prime = check_int(n_d_prime, "n_d_prime", low=1)
    if claimed_epsilon is not None:
        claimed_epsilon = check_real(
            claimed_epsilon, "claimed_epsilon", low=0.0, closed="left", allow_inf=True
        )
    c = np.asarray(counts_d, dtype=np.int64).ravel()
    cp = np.asarray(counts_d_prime, dtype=np.int64).ravel()
    if c.shape != cp.shape or c.size == 0:
        raise PrivacyParameterError(
            f"counts_d and counts_d_prime must be non-empty and of equal length. Got {c.shape} and "
            f"{cp.shape} instead."
        )
    n_int = 2 * c.size
    a = alpha / n_int
    p_lo, p_hi = clopper_pearson(c, n_d, a)
    q_lo, q_hi = clopper_pearson(cp, n_d_prime, a)
    with np.errstate(divide="ignore", invalid="ignore"):
        fwd = np.where(
            (p_lo - delta > 0) & (q_hi > 0), np.log(np.maximum(p_lo - delta, 1e-300)) - np.log(q_hi), -np.inf
        )
        bwd = np.where(
            (q_lo - delta > 0) & (p_hi > 0), np.log(np.maximum(q_lo - delta, 1e-300)) - np.log(p_hi), -np.inf
        )
    names = list(event_names) if event_names is not None else list(range(c.size))
    jf, jb = int(np.argmax(fwd)), int(np.argmax(bwd))
    if fwd[jf] >= bwd[jb]:
        j, direction, val = jf, "D over D'", float(fwd[jf])
    else:
        j, direction, val = jb, "D' over D", float(bwd[jb])
    eps_hat = max(0.0, val) if math.isfinite(val) else 0.0
    witness = {
        "event": _jsonable(names[j]),
        "direction": direction,
        "count_d": int(c[j]),
        "count_d_prime": int(cp[j]),
        "p_d": [float(p_lo[j]), float(p_hi[j])],
        "p_d_prime": [float(q_lo[j]), float(q_hi[j])],
    }
    return AuditResult(eps_hat, claimed_epsilon, delta, alpha, (n_d, n_d_prime), n_int, witness)


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, tuple):
        return [_jsonable(v) for v in x]
    return x


def _draw(sampler: Callable[[int], Any], n: int, name: str) -> np.ndarray:
    out = np.asarray(sampler(n))
    if out.shape[:1] != (n,):
        raise PrivacyParameterError(
            f"The '{name}' sampler must return {n} outputs (first axis). Got shape {out.shape} instead."
        )
    return out


def audit_mechanism(
    sample_d: Callable[[int], Any],
    sample_d_prime: Callable[[int], Any],
    n: int,
    alpha: float,
    *,
    claimed_epsilon: float | None = None,
    delta: float = 0.0,
    outcomes: Sequence[Any] | None = None,
    labels: dict | None = None,
) -> AuditResult:
    """Audit a mechanism with discrete outputs on one neighbouring pair.

    Args:
      sample_d: ``sample_d(n)`` returns n independent outputs of M(D) (a 1-D array of hashable scalars;
        post-process richer outputs into a small outcome set first; post-processing never increases ε).
      sample_d_prime: The same for M(D′).
      n: Draws per side.
      alpha: False-positive rate of the whole audit (Bonferroni over 2·|outcomes| intervals).
      claimed_epsilon: The ε to check; the result's ``passed`` is ``ε̂ ≤ claimed_epsilon``.
      delta: The δ of the claim.
      outcomes: The outcome set, fixed in advance (recommended: it fixes the Bonferroni count). Default:
        the outcomes observed on either side (exact only if every possible outcome was observed).
      labels: Optional human-readable names of outcomes, for the witness.

    Returns:
      An :class:`AuditResult`.

    Example:
      >>> import numpy as np
      >>> from privalign.mechanisms import RandomizedResponse
      >>> rr, g = RandomizedResponse(1.0), np.random.default_rng(0)
      >>> res = audit_mechanism(lambda n: rr(np.zeros(n), rng=g), lambda n: rr(np.ones(n), rng=g),
      ...                       n=20_000, alpha=1e-3, claimed_epsilon=1.0, outcomes=[0, 1])
      >>> res.passed
      True
    """
    n = check_int(n, "n", low=1)
    x = _draw(sample_d, n, "sample_d").ravel()
    y = _draw(sample_d_prime, n, "sample_d_prime").ravel()
    if outcomes is None:
        outs = np.unique(np.concatenate([x, y]))
    else:
        outs = np.asarray(list(outcomes))
        known = np.isin(np.concatenate([x, y]), outs)
        if not known.all():
            raise PrivacyParameterError(
                f"The sampler produced an outcome outside 'outcomes': {np.concatenate([x, y])[~known][0]!r}."
            )
    cx = np.array([(x == o).sum() for o in outs])
    cy = np.array([(y == o).sum() for o in outs])
    return epsilon_lower_bound(
        cx,
        cy,
        n,
        n,
        alpha=alpha,
        delta=delta,
        event_names=[(labels or {}).get(o, f"output == {o!r}") for o in outs.tolist()],
        claimed_epsilon=claimed_epsilon,
    )


def audit_threshold(
    sample_d: Callable[[int], Any],
    sample_d_prime: Callable[[int], Any],
    n: int,
    alpha: float,
    *,
    thresholds: Sequence[float],
    claimed_epsilon: float | None = None,
    delta: float = 0.0,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
) -> AuditResult:
    """Audit a mechanism with real-valued outputs through thresholded events of a statistic.

    Events are ``{T ≤ t}`` and ``{T > t}`` for every threshold ``t`` (2·|thresholds| events, 4·|thresholds|
    intervals). Choose the statistic and thresholds *before* sampling (e.g. from the claimed law);
    choosing them on the same samples invalidates α.

    Args:
      sample_d, sample_d_prime: ``sample(n)`` returns n outputs (first axis = draws).
      n: Draws per side.
      alpha: False-positive rate of the whole audit.
      thresholds: Thresholds on T.
      claimed_epsilon, delta: The (ε, δ) claim to check.
      statistic: Maps the (n, ...) outputs to n reals (default: the outputs themselves, flattened per draw
        to their first coordinate).
    """
    n = check_int(n, "n", low=1)
    ts = np.asarray(list(thresholds), dtype=np.float64)
    if ts.size == 0 or not np.all(np.isfinite(ts)):
        raise PrivacyParameterError(
            f"The 'thresholds' parameter must be a non-empty list of finite reals. Got {ts!r} instead."
        )
    stat = (
        statistic
        if statistic is not None
        else (lambda a: np.asarray(a, dtype=np.float64).reshape(a.shape[0], -1)[:, 0])
    )
    x = np.asarray(stat(_draw(sample_d, n, "sample_d")), dtype=np.float64)
    y = np.asarray(stat(_draw(sample_d_prime, n, "sample_d_prime")), dtype=np.float64)
    le_x = (x[None, :] <= ts[:, None]).sum(axis=1)
    le_y = (y[None, :] <= ts[:, None]).sum(axis=1)
    counts_x = np.concatenate([le_x, n - le_x])
    counts_y = np.concatenate([le_y, n - le_y])
    names = [f"T <= {t:g}" for t in ts] + [f"T > {t:g}" for t in ts]
    return epsilon_lower_bound(
        counts_x, counts_y, n, n, alpha=alpha, delta=delta, event_names=names, claimed_epsilon=claimed_epsilon
    )
