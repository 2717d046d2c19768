"""Dense baselines: ℓ2-regularised MLE, dense randomized-response MLE, DP-SGD on the linear head.

Spec: ``spec-reward-estimation.md`` §7. Proof notes: ``docs/privacy/dense_rr.md``, ``docs/privacy/dp_sgd.md``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import scipy.optimize
import scipy.sparse as sp

from privalign._validation import check_choice, check_int, check_probability, check_real
from privalign.accounting.calibration import CalibrationLimitError, bisect_monotone
from privalign.accounting.events import (
    GaussianEvent,
    NonPrivateEvent,
    PoissonSampledEvent,
    PrivacyEvent,
    SelfComposedEvent,
)
from privalign.errors import PrivacyParameterError
from privalign.estimation.base import (
    ALPHA,
    EstimatorParam,
    RewardEstimator,
    check_epsilon,
    check_Xy,
    matvec,
    project_l2,
    rmatvec,
    sigmoid,
    softplus,
)
from privalign.rng import as_generator

__all__ = [
    "MLE",
    "DenseRR",
    "DPSGDLinear",
    "fit_logistic",
    "default_alpha",
    "auto_learning_rate",
    "default_clip_norm",
    "default_batch_size",
    "dpsgd_epsilon",
    "calibrate_dpsgd_noise",
    "user_clip_factors",
]


def fit_logistic(
    X: Any,
    targets: np.ndarray,
    *,
    alpha: float,
    theta0: np.ndarray | None = None,
    max_iter: int = 500,
    tol: float = 1e-8,
    return_n_iter: bool = False,
) -> Any:
    """Minimise ``(1/n) Σ [softplus(x_iᵀθ) − t_i·x_iᵀθ] + (α/2)‖θ‖²`` with L-BFGS.

    For ``t ∈ {0, 1}`` this is the ℓ2-regularised logistic (BTL) negative log-likelihood; for debiased
    labels ``t = ŷ`` it is the unbiased loss of spec §6 (form 2 and form 3 have the same gradient).
    Sparse ``X`` stays sparse.
    """
    n, d = X.shape
    t = np.asarray(targets, dtype=np.float64)

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = matvec(X, theta)
        f = float(np.mean(softplus(z) - t * z)) + 0.5 * alpha * float(theta @ theta)
        g = rmatvec(X, sigmoid(z) - t) / n + alpha * theta
        return f, g

    x0 = np.zeros(d) if theta0 is None else np.asarray(theta0, dtype=np.float64).copy()
    res = scipy.optimize.minimize(
        fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": max_iter, "gtol": tol}
    )
    if return_n_iter:
        return np.asarray(res.x, dtype=np.float64), max(1, int(res.nit))
    return np.asarray(res.x, dtype=np.float64)


def _check_dense_common(est: Any, X: Any, y: Any) -> tuple[Any, np.ndarray, float]:
    fb = est.feature_bound
    if fb is not None:
        fb = check_real(fb, "feature_bound", low=0.0, closed="neither")
    Xv, yv = check_Xy(X, y, feature_bound=fb, clip=bool(est.clip))
    if est.alpha is None:
        alpha = default_alpha(*Xv.shape)
    else:
        alpha = check_real(est.alpha, "alpha", low=0.0, closed="neither")
    check_int(est.max_iter, "max_iter", low=1)
    return Xv, yv, alpha


def default_alpha(n: int, d: int) -> float:
    """Default ridge penalty of :class:`MLE` and :class:`DenseRR`: ``α = 0.1·d/n`` (n and d are public).

    A fixed α fails at one end of the (n, d) range: on the synthetic rate problem (s* = 5, ε = 8) dense RR
    with α = 1e-3 reaches error ≈ 60 at d = 3200, n = 8000 (worse than θ̂ = 0, error 9), while α = 0.1
    over-shrinks (≈ 4.3 at every n for d = 200). ``0.1·d/n`` was the best of {1e-3, 3e-3, 1e-2, 3e-2}
    within a factor ≈ 1.3 at (n, d) = (8k, 3200), (8k, 800), (2k, 200), and keeps falling with n at d = 200.
    """
    return 0.1 * d / max(n, 1)


class MLE(RewardEstimator):
    """Non-private ℓ2-regularised BTL maximum likelihood over all d coordinates (reference method).

    Args:
      alpha: ridge penalty α > 0 on ``(α/2)‖θ‖²`` (added to the mean loss); ``None`` (default):
        :func:`default_alpha` ``= 0.1·d/n``.
      max_iter: L-BFGS iterations.
      feature_bound: optional public bound c_x checked on the features (``None``: not checked).
      clip: clip into [−c_x, c_x] instead of raising.

    Attributes:
      coef_, privacy_event_ (``NonPrivateEvent``).
    """

    name = "MLE"
    aliases = ("mle",)
    privacy_kind = "none"
    title = "MLE"
    params = (ALPHA,)

    def __init__(
        self,
        *,
        alpha: float | None = None,
        max_iter: int = 500,
        feature_bound: float | None = None,
        clip: bool = False,
    ) -> None:
        self.alpha = alpha
        self.max_iter = max_iter
        self.feature_bound = feature_bound
        self.clip = clip

    def fit(self, X: Any, y: Any) -> MLE:
        Xv, yv, alpha = _check_dense_common(self, X, y)
        self.coef_, self.n_iter_ = fit_logistic(
            Xv, yv, alpha=alpha, max_iter=int(self.max_iter), return_n_iter=True
        )
        self.n_features_in_ = Xv.shape[1]
        self.privacy_event_ = NonPrivateEvent(unit="sample", relation="replace_one")
        return self


class DenseRR(RewardEstimator):
    """Label-DP dense baseline: randomized response on labels, then the debiased ridge MLE over all d
    coordinates (no thresholding; spec §7, Chowdhury, Zhou & Natarajan 2024).

    Args:
      epsilon: ε in (0, ∞] of randomized response (``inf``: no flips; then the fit equals :class:`MLE`).
      alpha: ridge penalty α > 0 (needed: the debiased loss is unbounded below on separable data);
        ``None`` (default): ``0.1·d/n/(1 − 2ρ)²`` (:func:`default_alpha` scaled by the variance factor of
        the debiased labels, ρ = 1/(1 + e^ε) the flip probability; data-independent: n, d, ε are public).
      max_iter: L-BFGS iterations.
      feature_bound, clip: as :class:`MLE`.
      random_state: seed of the randomized response.

    Attributes:
      coef_, flip_probability_, privacy_event_.

    Privacy:
      Unit: one label (``"label"``; features public). Relation: replace-one. Sensitivity: n/a (a bit).
      Guarantee: ε-label-DP by randomized response; the MLE is post-processing.
      Event: ``RandomizedResponseEvent(epsilon, unit="label")`` (``NonPrivateEvent`` at ε = ∞).

    References:
      Chowdhury, Zhou & Natarajan, "Differentially Private Reward Estimation with Preference
      Feedback", AISTATS 2024, arXiv:2310.19733v2 (RR + debiased MLE). Warner 1965.
    """

    name = "DenseRR"
    aliases = ("rr",)
    user_level = True
    privacy_kind = "label"
    title = "dense RR"
    params = (ALPHA,)

    def __init__(
        self,
        *,
        epsilon: float = 1.0,
        alpha: float | None = None,
        max_iter: int = 500,
        feature_bound: float | None = None,
        clip: bool = False,
        random_state: Any = None,
    ) -> None:
        self.epsilon = epsilon
        self.alpha = alpha
        self.max_iter = max_iter
        self.feature_bound = feature_bound
        self.clip = clip
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> DenseRR:
        from privalign.estimation.labels import debiased_labels, privatize_labels

        eps = check_epsilon(self.epsilon)
        Xv, yv, alpha = _check_dense_common(self, X, y)
        rng = as_generator(self.random_state)
        y_tilde, rho, event = privatize_labels(yv, eps, rng)
        if self.alpha is None:  # debiased labels have variance ∝ 1/(1 − 2ρ)²: regularise as much more
            alpha = alpha / (1.0 - 2.0 * rho) ** 2
        targets = debiased_labels(y_tilde, rho)
        self.coef_, self.n_iter_ = fit_logistic(
            Xv, targets, alpha=alpha, max_iter=int(self.max_iter), return_n_iter=True
        )
        self.n_features_in_ = Xv.shape[1]
        self.flip_probability_ = rho
        self.privacy_event_ = event
        return self


# ------------------------------------------------------------------------------------------------
# DP-SGD on the linear head
# ------------------------------------------------------------------------------------------------


def dpsgd_epsilon(
    noise_multiplier: float,
    sampling_probability: float,
    steps: int,
    delta: float,
    *,
    accountant: str = "pld",
    discretization: float = 1e-2,
) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian steps under **replace-one**, via ``dp_accounting``.

    ``accountant="pld"`` uses ``PLDAccountant(REPLACE_ONE)`` (pessimistic discretisation, an upper
    bound at any ``discretization``; a coarser grid is faster and only looser). ``"rdp"`` uses
    ``RdpAccountant`` (add/remove-one only, for Poisson sampling) and converts to replace-one by group
    privacy: a replacement is a removal followed by an addition, and
    (ε₁, δ₁)-DP under add/remove implies (2ε₁, (1 + e^{ε₁})·δ₁)-DP for neighbours at distance 2
    (Dwork & Roth 2014, Thm 2.2 extended to δ > 0; Vadhan 2017, Lemma 2.2). That is loose, so ``"pld"``
    is the default.
    """
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    ev = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sampling_probability, dp_accounting.GaussianDpEvent(noise_multiplier)
        ),
        steps,
    )
    if accountant == "pld":
        acc = pld_privacy_accountant.PLDAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
            value_discretization_interval=discretization,
        )
        acc.compose(ev)
        return float(acc.get_epsilon(delta))
    if accountant == "rdp":
        from dp_accounting.rdp import rdp_privacy_accountant

        acc = rdp_privacy_accountant.RdpAccountant()
        acc.compose(ev)
        # Largest δ₁ (bisection on log δ₁) with (1 + e^{ε₁(δ₁)})·δ₁ ≤ δ; ε₁ decreases in δ₁. The test is
        # made in log space, log(1 + e^{ε₁}) + log δ₁ ≤ log δ (no overflow of e^{ε₁}), and the returned δ₁ is
        # one at which the test was *checked* (the low end is checked first; if it fails, ε = ∞).
        log_delta = math.log(delta)

        def feasible(log_d1: float) -> bool:
            e1 = acc.get_epsilon(math.exp(log_d1))
            return math.isfinite(e1) and float(np.logaddexp(0.0, e1)) + log_d1 <= log_delta

        a, b = log_delta - 60.0, log_delta
        if not feasible(a):
            return math.inf
        for _ in range(80):
            m = 0.5 * (a + b)
            if feasible(m):
                a = m
            else:
                b = m
        return float(2.0 * acc.get_epsilon(math.exp(a)))
    raise PrivacyParameterError(
        f"The 'accountant' parameter must be one of ['pld', 'rdp']. Got {accountant!r} instead."
    )


def auto_learning_rate(noise_multiplier: float, batch_size: int, d: int) -> float:
    """DP-SGD's noise-aware step size ``η = min(1, 0.03·b/(ν·√d))`` (``learning_rate=None``).

    The injected noise moves θ by ``η·ν·C·√d/b`` per step against a gradient step of at most ``η·C``; their
    ratio ``ν·√d/b`` does not depend on C. Capping ``η·ν·√d/b`` at 0.03 keeps the noise walk (which tail
    averaging then damps) from dominating where ν√d/b is large (small ε, large d), and leaves η = 1 where
    the noise is small. ν, b and d are public, so the step size is data-independent. On the rate problem
    (s* = 5, C = 8, 10 epochs, batch min(1024, n); 2 draws) it brought DP-SGD below the zero estimator's
    error 9 at d = 3,200 (η = 1: 15.6 → 6.9) and ε = 0.5 (10.7 → 5.7) at n = 8k, and ε = 1 (8.1 → 3.4).
    """
    if noise_multiplier <= 0.0:
        return 1.0
    return float(min(1.0, 0.03 * batch_size / (noise_multiplier * math.sqrt(d))))


def default_clip_norm(d: int, feature_bound: float | None = None, norm_bound: float | None = None) -> float:
    """DP-SGD's default clip norm ``C = min(c_x·√(d/3), B)`` (``clip_norm=None``; ``c_x`` = ``feature_bound``,
    1 if not given; ``B`` = ``norm_bound``, a public ℓ2 bound of a comparison difference, ∞ if not given).

    ``c_x·√(d/3)`` is the ℓ2 norm of a row whose coordinates have the root mean square ``c_x/√3`` of the
    uniform design on [−c_x, c_x]. A per-example gradient is ``(σ(xᵀθ) − y)·x``, so C at the typical ‖x‖
    clips few gradients; ``C = 1`` clipped all of them at d = 200 (‖x‖ ≈ 8) and biased the fixed point, so
    that the error did not fall with n. Where the feature map guarantees ``‖x‖₂ ≤ B`` (MiniLM
    differences: B = 2, :attr:`~privalign.estimation.features.PairFeatures.norm_bound`), no gradient exceeds
    B, so ``C > B`` only adds noise ``σ·C`` without clipping less; the cap removes that waste (C = 22.6 → 2
    on MiniLM, d = 384, c_x = 2). d, c_x and B are public: C is data-independent, and the accounting uses
    whatever C is used (the noise is ``N(0, (ν·C)²)``, sensitivity 2C under replace-one).
    For sparse features without a useful public ℓ2 bound (hashed n-grams: ‖x‖₂ ≪ c_x·√d) a smaller C may
    be better; pass it explicitly (``LIMITATIONS.md``).
    """
    c = 1.0 if feature_bound is None else float(feature_bound)
    C = float(c * math.sqrt(d / 3.0))
    return C if norm_bound is None else float(min(C, float(norm_bound)))


def default_batch_size(n: int) -> int:
    """DP-SGD's default expected batch size ``b = min(n, max(256, ⌊8·√n⌋))`` (``batch_size=None``; n is
    public under replace-one): larger batches at larger n put less privacy noise on each step's mean gradient
    (256 / 506 / 1,011 / 2,023 at n = 1k / 4k / 16k / 64k)."""
    return int(min(n, max(256, int(8.0 * math.sqrt(n)))))


@functools.lru_cache(maxsize=256)
def calibrate_dpsgd_noise(
    epsilon: float,
    delta: float,
    sampling_probability: float,
    steps: int,
    *,
    accountant: str = "pld",
    tol: float = 1e-3,
) -> float:
    """Smallest noise multiplier (within relative ``tol``, rounded *up*) with ``dpsgd_epsilon ≤ ε``.

    Bisection on σ; the returned σ is the upper end of the final bracket, whose accounted ε is ≤ the
    target, so the calibration never overshoots (tested).
    """

    def ok(sigma: float) -> bool:
        return dpsgd_epsilon(sigma, sampling_probability, steps, delta, accountant=accountant) <= epsilon

    try:
        return bisect_monotone(ok, 0.1, 1.0, feasible="above", rtol=tol, limit=1e4)
    except CalibrationLimitError:
        raise PrivacyParameterError(  # a derived parameter: reported in terms of the user's ε
            f"The 'epsilon' parameter is too small for DP-SGD on this schedule: reaching it at δ={delta:.3g} "
            f"(sampling rate {sampling_probability:.3g}, {steps} steps) needs a noise multiplier above 1e4, "
            f"where the noise swamps any gradient; raise it (or use more data). Got {epsilon!r} instead."
        ) from None


def user_clip_factors(Xb: Any, r: np.ndarray, groups: np.ndarray, clip_norm: float) -> np.ndarray:
    """Per-row factors that clip each *user's* summed gradient ``Σ_{i∈u} r_i·x_i`` to ℓ2 norm ``clip_norm``
    once (user-level DP-SGD): row i gets ``min(1, C/‖Σ_{j∈u(i)} r_j x_j‖₂)``, so that ``Xbᵀ(r·factors)`` is
    the sum of the clipped per-user gradients. ``groups`` holds each row's user (any integer labels)."""
    _, inv = np.unique(groups, return_inverse=True)
    m = r.shape[0]
    agg = sp.csr_matrix((r, (inv, np.arange(m))), shape=(int(inv.max()) + 1, m))
    G = agg @ Xb  # (users in the batch) × d: each user's summed gradient
    sq = np.asarray(G.multiply(G).sum(axis=1)).ravel() if sp.issparse(G) else np.einsum("ij,ij->i", G, G)
    factor = np.minimum(1.0, clip_norm / np.maximum(np.sqrt(sq), 1e-300))
    return factor[inv]


class DPSGDLinear(RewardEstimator):
    """DP-SGD on the linear BTL head (spec §7; Abadi et al. 2016).

    Each step draws a Poisson batch (each comparison independently with probability ``q = b/n``),
    clips per-example gradients ``g_i = (σ(x_iᵀθ) − y_i)·x_i`` to ℓ2 norm ``clip_norm`` C, and updates
    ``θ ← Π_{B_θ}(θ − η·(Σ_i ḡ_i + N(0, (σ_noise·C)²·I_d))/b)``. ``σ_noise`` is calibrated to the target
    (ε, δ) with ``dp_accounting`` (PLD under replace-one by default).

    Args:
      epsilon: ε in (0, ∞] (``inf``: no noise, no clipping: plain Poisson-sampled SGD, non-private).
      delta: δ in (0, 1).
      clip_norm: C > 0; ``None`` (default): :func:`default_clip_norm` ``= min(c_x·√(d/3), B)`` (c_x =
        ``feature_bound``, 1 if not given; B = ``feature_norm_bound``, ∞ if not given). The C used is
        ``clip_norm_``.
      batch_size: expected batch size b (q = b/n); ``None`` (default): :func:`default_batch_size`
        ``= min(n, max(256, ⌊8√n⌋))`` (n is public under replace-one).
      epochs: passes over the data (default 10); steps = ⌈epochs·n/b⌉.
      learning_rate: η; ``None`` (default): :func:`auto_learning_rate` ``= min(1, 0.03·b/(ν·√d))``. The η
        used is ``learning_rate_``.
      radius: optional ℓ2 projection radius B_θ (post-processing, free); ``inf``: none.
      averaging: return the mean of the last ⌈averaging·steps⌉ iterates (in [0, 1]; 0: the last iterate;
        post-processing of the released iterates, free).
      accountant: ``"pld"`` (default) or ``"rdp"``.
      feature_bound: optional public c_x checked on the features; clip: clip instead of raising.
      feature_norm_bound: optional public ℓ2 bound B of a comparison difference, from the feature map
        (``PairFeatures.norm_bound``: 2 for MiniLM), used only to cap the default C; not checked on the data
        (the guarantee never relies on it: every gradient is clipped to C whatever ‖x‖ is).
      random_state: seed of the sampling and the Gaussian noise.
      max_pairs_per_user: K ≥ 1 for **user-level** DP-SGD (McMahan et al. 2018), fitted with
        ``fit(X, y, users=...)`` (each row's user; a user with more than K rows is refused): the Poisson
        sampling, the batch size b, n and the steps count *users*, each sampled user's gradient is the sum of
        its rows' gradients, clipped to C once. ``None`` (default): one comparison is the unit.

    Attributes:
      coef_, noise_multiplier_, sampling_probability_, steps_, clip_norm_, batch_size_, learning_rate_,
      privacy_event_.

    Defaults (chosen so that the error falls with n): with the earlier C = 1, batch 256, 5 epochs,
    η = 0.5 the error on ``make_btl(n, 200, 5)`` at ε = 8 did not fall with n (3.45 / 1.03 / 4.13 at
    n = 4k / 16k / 64k, the zero estimator's error 9); with these defaults it falls (docs/estimation.md,
    "Defaults that learn").

    Privacy:
      Unit: one comparison (``"sample"``). Relation: replace-one. Sensitivity: the clipped sum changes
      by at most 2C in ℓ2 when one comparison is replaced (C on each side; the PLD REPLACE adjacency of
      dp_accounting models exactly the ±C shift). Guarantee: (ε, δ)-DP with ε computed by
      ``dp_accounting``'s PLD accountant (``PLDAccountant(REPLACE_ONE)``), ≤ the target.
      Event: ``SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(σ_noise)), steps, unit="sample")``.

      With ``max_pairs_per_user=K`` — Unit: one user (every one of their ≤ K comparisons, features and
      labels, and how many there are). Relation: replace-one user (all of one user's 1..K pairs replaced by
      1..K others; the roster of user ids, hence U, is public). Each step samples every user
      independently with probability q = b/U; a sampled user u contributes ``clip_C(Σ_{i∈u} g_i)``, one
      vector of ℓ2 norm ≤ C whatever K is; the update divides by the expected b (a fixed denominator, as
      McMahan et al.'s ``f̃_f``). Replacing all of one user's rows changes the sum by ≤ 2C: the same
      Poisson-subsampled Gaussian mechanism over users, accounted as above with n = U. Guarantee: (ε, δ)-DP
      for the user. Event: the same ``SelfComposedEvent`` with ``unit="user"`` (K does not enter the
      accounting: the clip bounds the user; K is stated in the release).

    References:
      Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, arXiv:1607.00133v2, Alg. 1.
      McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018,
      arXiv:1710.06963v3, Alg. 1 (DP-FedAvg/DP-FedSGD: user sampling, per-user clipping, fixed
      denominator) and §3 (the moments accountant over users).
      Koskela, Jälkö & Honkela, arXiv:1906.03049 and Doroshenko et al., "Connect the Dots", PETS 2022,
      arXiv:2207.04380v1 (PLD accounting as implemented in dp_accounting); Zhu, Dong & Wang, "Optimal
      Accounting of Differential Privacy via Characteristic Function", arXiv:2106.08567v3 (dominating
      pairs of the subsampled Gaussian under replace-one).
    """

    name = "DPSGDLinear"
    aliases = ("dp-sgd",)
    user_level = True
    privacy_kind = "sample"
    title = "DP-SGD"
    step_param = "learning_rate"
    params = (
        EstimatorParam("epochs", "dpsgd_epochs", "float", 5.0, "DP-SGD epochs", low=1e-6),
        EstimatorParam(
            "batch_size", "dpsgd_batch", "int", 256, "DP-SGD expected batch size", low=1, at_most_n=True
        ),
        EstimatorParam("clip_norm", "dpsgd_clip", "float", 1.0, "DP-SGD clip norm C", low=1e-12),
        EstimatorParam(
            "learning_rate",
            "dpsgd_lr",
            "float",
            1.0,
            "DP-SGD learning rate (0: noise-aware min(1, 0.03·b/(ν·√d)))",
            low=0.0,
            zero_means_default=True,
        ),
    )

    def __init__(
        self,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-5,
        clip_norm: float | None = None,
        batch_size: int | None = None,
        epochs: float = 10.0,
        learning_rate: float | None = None,
        radius: float = 5.0,
        accountant: str = "pld",
        feature_bound: float | None = None,
        clip: bool = False,
        averaging: float = 0.5,
        feature_norm_bound: float | None = None,
        random_state: Any = None,
        max_pairs_per_user: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.averaging = averaging
        self.clip_norm = clip_norm
        self.batch_size = batch_size
        self.epochs = epochs
        self.learning_rate = learning_rate
        self.radius = radius
        self.accountant = accountant
        self.feature_bound = feature_bound
        self.clip = clip
        self.feature_norm_bound = feature_norm_bound
        self.random_state = random_state
        self.max_pairs_per_user = max_pairs_per_user

    def check_calibration(self, n: int) -> float:
        """The noise multiplier for ``n`` training comparisons (``n`` users with ``max_pairs_per_user``;
        cached, so ``fit`` reuses it): an ε too small for the schedule is refused, naming ε, before the fit
        starts (0 at ε = ∞)."""
        eps = check_epsilon(self.epsilon)
        if math.isinf(eps):
            return 0.0
        n = check_int(n, "n", low=1)
        b = default_batch_size(n)
        if self.batch_size is not None:
            b = check_int(self.batch_size, "batch_size", low=1, high=n)
        steps = int(math.ceil(check_real(self.epochs, "epochs", low=0.0, closed="neither") * n / b))
        accountant = check_choice(self.accountant, "accountant", ("pld", "rdp"))
        delta = check_probability(self.delta, "delta")
        return calibrate_dpsgd_noise(eps, delta, b / n, steps, accountant=accountant)

    def fit(self, X: Any, y: Any, users: Any = None) -> DPSGDLinear:
        """Fit; ``users`` (each row's user id) is required with ``max_pairs_per_user`` and refused without."""
        eps = check_epsilon(self.epsilon)
        delta = check_probability(self.delta, "delta")
        if self.clip_norm is not None:
            check_real(self.clip_norm, "clip_norm", low=0.0, closed="neither")
        fb = (
            None
            if self.feature_bound is None
            else check_real(self.feature_bound, "feature_bound", low=0.0, closed="neither")
        )
        nb = (
            None
            if self.feature_norm_bound is None
            else check_real(self.feature_norm_bound, "feature_norm_bound", low=0.0, closed="neither")
        )
        Xv, yv = check_Xy(X, y, feature_bound=fb, clip=bool(self.clip))
        n_rows, d = Xv.shape
        codes: np.ndarray | None = None
        if self.max_pairs_per_user is not None:  # user level: n counts users; each user's rows sum, then clip
            from privalign.estimation.users import user_groups

            codes, n = user_groups(users, n_rows, self.max_pairs_per_user)
        elif users is not None:
            raise PrivacyParameterError(
                "The 'users' parameter is used only with 'max_pairs_per_user' (user-level DP-SGD). Got "
                f"{type(users).__name__} without it."
            )
        else:
            n = n_rows
        unit = "sample" if codes is None else "user"
        C = default_clip_norm(d, fb, nb) if self.clip_norm is None else float(self.clip_norm)
        b = (
            default_batch_size(n)
            if self.batch_size is None
            else check_int(self.batch_size, "batch_size", low=1, high=n)
        )
        epochs = check_real(self.epochs, "epochs", low=0.0, closed="neither")
        lr = (
            None
            if self.learning_rate is None
            else check_real(self.learning_rate, "learning_rate", low=0.0, closed="neither")
        )
        radius = check_real(self.radius, "radius", low=0.0, closed="neither", allow_inf=True)
        accountant = check_choice(self.accountant, "accountant", ("pld", "rdp"))
        q = b / n
        steps = int(math.ceil(epochs * n / b))
        private = not math.isinf(eps)
        nm = calibrate_dpsgd_noise(eps, delta, q, steps, accountant=accountant) if private else 0.0
        if lr is None:
            lr = auto_learning_rate(nm, b, d)
        rng = as_generator(self.random_state)
        sq_norms = (
            np.asarray(Xv.multiply(Xv).sum(axis=1)).ravel()
            if sp.issparse(Xv)
            else np.einsum("ij,ij->i", Xv, Xv, dtype=np.float64)
        )
        row_norms = np.sqrt(sq_norms)
        avg_frac = check_real(self.averaging, "averaging", low=0.0, high=1.0, closed="both")
        avg_start = steps - max(1, int(math.ceil(avg_frac * steps))) if avg_frac > 0 else steps
        theta = np.zeros(d)
        theta_sum = np.zeros(d)
        n_avg = 0
        for step in range(steps):
            if codes is None:
                idx = np.flatnonzero(rng.random(n) < q)
            else:  # Poisson sampling of users: a sampled user brings all of their rows
                idx = np.flatnonzero((rng.random(n) < q)[codes])
            total = np.zeros(d)
            if idx.size:
                Xb = Xv[idx]
                r = sigmoid(matvec(Xb, theta)) - yv[idx]
                if private and codes is None:
                    gnorm = np.abs(r) * row_norms[idx]
                    r = r * np.minimum(1.0, C / np.maximum(gnorm, 1e-300))
                elif private and codes is not None:
                    r = r * user_clip_factors(Xb, r, codes[idx], C)
                total = rmatvec(Xb, r)
            if private:
                total = total + rng.normal(0.0, nm * C, size=d)
            theta = project_l2(theta - lr * total / b, radius)
            if step >= avg_start:
                theta_sum += theta
                n_avg += 1
        if n_avg:
            theta = project_l2(theta_sum / n_avg, radius)
        self.coef_ = theta
        self.n_features_in_ = d
        self.noise_multiplier_ = float(nm)
        self.sampling_probability_ = float(q)
        self.steps_ = steps
        self.clip_norm_ = float(C)
        self.batch_size_ = int(b)
        self.learning_rate_ = float(lr)
        if private:
            event: PrivacyEvent = SelfComposedEvent(
                event=PoissonSampledEvent(
                    sampling_probability=q,
                    event=GaussianEvent(noise_multiplier=nm, unit=unit),
                    unit=unit,
                ),
                count=steps,
                unit=unit,
                relation="replace_one",
            )
        else:
            event = NonPrivateEvent(unit=unit, relation="replace_one")
        self.privacy_event_ = event
        return self
