"""Iterative hard thresholding for sparse BTL rewards: non-private IHT, Sample-DP IHT, Label-DP RR-IHT.

Spec: ``spec-reward-estimation.md`` §5 (Sample-DP-IHT), §6 (RR-IHT), §12 (invariants). Proof notes:
``docs/privacy/sample_dp_iht.md`` and ``docs/privacy/rr_iht.md``.

All three share one loop (``θ⁰ = 0``)::

    for t = 0..T−1:
        g ← (1/m_t) Σ_{i∈B_t} (σ(x_iᵀθᵗ) − t_i)·x_i     # t_i = y_i, or the debiased ŷ_i (RR-IHT)
        θᵗ⁺¹ ← Π_{‖·‖₂≤B_θ}( Threshold_s(θᵗ − η·g) )

with ``B_t`` the full data (``variant="full"``) or the t-th of T disjoint batches (``"disjoint"``), and
``Threshold_s`` exact top-s hard thresholding (IHT, RR-IHT) or private Peeling (Sample-DP IHT).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, cast

import numpy as np

from privalign._validation import check_choice, check_int, check_probability, check_real
from privalign.accounting.calibration import bisect_monotone
from privalign.accounting.events import (
    ComposedEvent,
    NonPrivateEvent,
    ParallelComposedEvent,
    PeelingEvent,
    PrivacyEvent,
)
from privalign.errors import PrivacyParameterError
from privalign.estimation.base import (
    RADIUS,
    STEP_SIZE,
    RewardEstimator,
    _is_sparse,
    btl_gradient,
    check_epsilon,
    check_features,
    check_Xy,
    hard_threshold,
    project_l2,
    sigmoid,
    softplus,
)
from privalign.estimation.labels import debiased_labels, privatize_labels
from privalign.rng import as_generator

__all__ = [
    "IHT",
    "SampleDPIHT",
    "RRIHT",
    "debiased_gradient",
    "debiased_loss",
    "default_n_iter",
    "advanced_composition_split",
    "peeling_sensitivity",
    "gradient_step",
    "fused_btl_gradient",
    "peeling_threshold",
    "user_batches",
    "peeling_snr",
]


#: Per-iteration Laplace scale (in units of 1/c_x) that the default T of Sample-DP IHT keeps Peeling's noise
#: below; see :func:`default_n_iter`.
NOISE_SCALE_TARGET = 0.05
#: Dimension up to which :data:`NOISE_SCALE_TARGET` applies as is; for larger d the per-call target shrinks
#: by ``H_200/H_d`` (H_d the d-th harmonic number), so that the *expected largest* of the d noise magnitudes,
#: ``b·H_d``, stays at its d = 200 value ``0.05·H_200 ≈ 0.29`` (see :func:`default_n_iter`).
NOISE_REFERENCE_DIM = 200
#: Iterations per unit of ln n in the default T (enough for the optimisation error to fall below the
#: statistical error at the default step size; 3·ln n ≈ 35 at n = 128k).
ITERS_PER_LOG_N = 3.0


def _harmonic(d: int) -> float:
    return float(np.sum(1.0 / np.arange(1, int(d) + 1)))


def default_n_iter(
    n: int,
    *,
    noise_multiplier: float = 0.0,
    step_size: float = 4.0,
    feature_bound: float = 1.0,
    n_features: int | None = None,
) -> int:
    """Default number of disjoint-batch iterations T (a function of public quantities only).

    ``T = max(1, min(⌈3·ln n⌉, ⌊τ_d·n / (2·η·c_x²·ν)⌋))`` with ν the Peeling noise multiplier
    (``noise_multiplier = 0``, the non-private case, drops the second term) and the per-call noise target
    ``τ_d = 0.05·min(1, H_200/H_d)`` for ``n_features = d`` (``τ = 0.05`` when d is not given).

    * ``⌈3 ln n⌉`` iterations let the optimisation error (geometric in T) fall below the statistical
      error (∝ T/n with T disjoint batches), so the error keeps falling with n. The earlier default
      ``clip(⌈ln n⌉, 5, 20)`` stopped the optimisation early: on the synthetic rate problem (d = 200,
      s* = 5, ε = 8) its error floored at ≈ 0.19 from n = 64k on.
    * The second term caps T so that Peeling's per-call Laplace scale ``ν·λ = ν·2ηc_x·T/n`` stays below
      ``0.05/c_x`` (:data:`NOISE_SCALE_TARGET`): at small n (or small ε) fewer, larger batches beat
      many noisy ones.
    * Peeling picks a coordinate for its signal only if the signal beats the largest of the d noise
      draws, whose mean is ``b·H_d ≈ b·(ln d + 0.58)``. A fixed per-call target ignored this: at d = 3,200
      and 6,400 (n = 8k, s* = 5, ε = 8) the error was 1.43 and 1.59, against 0.17 and 0.18 with ``τ_d``
      (data seeds 0–2, estimator seeds 100–102; est's notes). For d ≤ 200 nothing changes.

    T, n, η, c_x, s, ε and δ are public (n under replace-one), so the schedule is data-independent and
    the privacy accounting (T disjoint batches, each Peeling at the full (ε, δ)) is unchanged for any T.
    """
    t_opt = int(math.ceil(ITERS_PER_LOG_N * math.log(max(n, 2))))
    if noise_multiplier > 0.0:
        tau = NOISE_SCALE_TARGET
        if n_features is not None and int(n_features) > NOISE_REFERENCE_DIM:
            tau *= _harmonic(NOISE_REFERENCE_DIM) / _harmonic(int(n_features))
        t_noise = int(math.floor(tau * n / (2.0 * step_size * feature_bound**2 * noise_multiplier)))
        t_opt = min(t_opt, t_noise)
    return int(max(1, min(t_opt, n)))


def _check_common(est: Any, X: Any, y: Any) -> tuple[Any, np.ndarray, int, float | None]:
    """Validate parameters and data. Returns ``(X, y, s, pending_bound)``.

    For dense input without ``clip``, the O(n·d) finiteness/bound scan of ``X`` is not done here but fused
    into the IHT loop's first pass over each row (``pending_bound`` is then ``c_x``; see
    :func:`fused_btl_gradient`): the loop raises the same error before any result is set. Sparse input and
    ``clip=True`` are checked (or clipped) here, as before (``pending_bound`` is ``None``).
    """
    feature_bound = check_real(est.feature_bound, "feature_bound", low=0.0, closed="neither")
    defer = not bool(est.clip) and not _is_sparse(X)
    Xv, yv = check_Xy(X, y, feature_bound=feature_bound, clip=bool(est.clip), check_values=not defer)
    d = Xv.shape[1]
    s = check_int(est.sparsity, "sparsity", low=1)
    if s > d:
        raise PrivacyParameterError(
            f"The 'sparsity' parameter must be at most the number of features d={d}. Got {s} instead."
        )
    check_real(est.step_size, "step_size", low=0.0, closed="neither")
    check_real(est.radius, "radius", low=0.0, closed="neither", allow_inf=True)
    return Xv, yv, s, (float(feature_bound) if defer else None)


def _batches(
    n: int, T: int, variant: str, rng: np.random.Generator, shuffle: bool = True
) -> list[Any] | None:
    """Disjoint, data-independent batches or ``None`` for full data.

    ``shuffle=True``: sorted index arrays of a random permutation split into T parts (each batch is then
    copied by fancy indexing). ``shuffle=False``: T contiguous row ranges (``slice`` objects, so a dense
    batch is a view and nothing is copied); still data-independent, hence private, but statistically
    sound only if the rows are not ordered by anything that matters.
    """
    if variant == "full":
        return None
    if T > n:
        raise PrivacyParameterError(
            f"The 'n_iter' parameter must be at most the number of samples n={n} for disjoint batches. Got "
            f"{T}."
        )
    if not shuffle:
        bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(n), T)])
        return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    perm = rng.permutation(n)
    return [np.sort(chunk) for chunk in np.array_split(perm, T)]


def user_batches(
    codes: np.ndarray, n_users: int, T: int, rng: np.random.Generator, shuffle: bool = True
) -> tuple[list[np.ndarray], list[int]]:
    """T disjoint batches that partition the *users* (user-level Sample-DP IHT): the user slots ``0..U−1``
    (a random permutation, or in order with ``shuffle=False``) split into T near-equal parts, each batch the
    sorted rows of its part's users; returns the batches and each batch's number of users U_t. The
    assignment depends on U, T and the random state only (never on the data), so U_t is public."""
    if T > n_users:
        raise PrivacyParameterError(
            f"The 'n_iter' parameter must be at most the number of users U={n_users} for user-level "
            f"batches (each batch holds at least one user). Got {T}."
        )
    order = rng.permutation(n_users) if shuffle else np.arange(n_users)
    parts = np.array_split(order, T)
    part_of = np.empty(n_users, dtype=np.int64)
    for t, chunk in enumerate(parts):
        part_of[chunk] = t
    row_part = part_of[codes]
    rows = np.argsort(row_part, kind="stable")
    bounds = np.searchsorted(row_part[rows], np.arange(T + 1))
    batches = [np.sort(rows[bounds[t] : bounds[t + 1]]) for t in range(T)]
    return batches, [len(c) for c in parts]


#: Rows per chunk of the fused dense pass are chosen so that a chunk is about this many bytes: small enough
#: to stay in cache between its two matrix-vector products and its min/max scan, large enough for BLAS.
FUSED_CHUNK_BYTES = 2**21
#: Chunks are dealt round-robin to this many *lanes*; each lane sums its chunks in order and the lane sums
#: are added in lane order, so the result does not depend on how many threads ran the lanes.
FUSED_LANES = 8
_POOL: Any = None
_POOL_LOCK = threading.Lock()
_BLAS_LIMIT: Any = None  # threadpoolctl limiter, active while _BLAS_USERS > 0
_BLAS_USERS = 0


def _fused_pool(threads: int) -> Any:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < threads:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="privalign-iht")
        return _POOL


@contextlib.contextmanager
def _one_blas_thread() -> Any:
    """Hold BLAS to one thread while any fused pass runs (reference-counted across concurrent callers, so
    the original setting is restored only when the last one leaves)."""
    global _BLAS_LIMIT, _BLAS_USERS
    with _POOL_LOCK:
        if _BLAS_USERS == 0:
            from threadpoolctl import threadpool_limits

            _BLAS_LIMIT = threadpool_limits(limits=1, user_api="blas")
        _BLAS_USERS += 1
    try:
        yield
    finally:
        with _POOL_LOCK:
            _BLAS_USERS -= 1
            if _BLAS_USERS == 0:
                _BLAS_LIMIT.restore_original_limits()
                _BLAS_LIMIT = None


def default_fused_threads() -> int:
    """Threads for :func:`fused_btl_gradient`: the CPUs this process may use, at most :data:`FUSED_LANES`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    return max(1, min(FUSED_LANES, cpus))


def fused_btl_gradient(
    X: np.ndarray,
    rows: slice | np.ndarray | None,
    targets: np.ndarray,
    theta: np.ndarray,
    *,
    bound: float | None = None,
    chunk_bytes: int = FUSED_CHUNK_BYTES,
    threads: int | None = None,
) -> tuple[np.ndarray, bool]:
    """Mean BTL gradient over the rows ``X[rows]`` of a dense matrix, reading each row from memory once.

    The rows are processed in cache-sized chunks: for each chunk ``z = X_c θ`` (over θ's support only
    when θ is sparse, as IHT iterates are; θ = 0 needs no product), ``r = σ(z) − t_c``, ``g += X_cᵀ r``
    and, when ``bound`` is given, ``min``/``max`` of the chunk, all while the chunk is in cache. This
    replaces two full passes (``X θ`` then ``Xᵀ r``) and a separate ``O(n·d)`` input scan by one pass, and
    never copies a whole batch (``rows`` as an index array is gathered chunk by chunk).

    Chunks run on ``threads`` threads (numpy releases the GIL in the gathers, products and scans); BLAS is
    held to one thread per worker meanwhile (``threadpoolctl``; process-wide while the call runs). The
    result is bit-identical for any number of threads (see :data:`FUSED_LANES`).

    Args:
      X: Dense ``(n, d)`` float32/float64 array.
      rows: ``None`` (all rows), a ``slice`` with step 1, or an index array.
      targets: Targets of the selected rows, in the order of ``rows``.
      theta: Current iterate (float64).
      bound: If given, also check that every entry of the selected rows is finite and in ``[−bound, bound]``.
      chunk_bytes: Approximate size of one chunk.
      threads: Worker threads (default :func:`default_fused_threads`); 1 runs in the calling thread.

    Returns:
      ``(g, ok)``: the float64 mean gradient and whether the check passed (``True`` when ``bound`` is None).
      On a failed check the scan stops early and ``g`` is meaningless.
    """
    d = X.shape[1]
    step = max(1, int(chunk_bytes) // (d * X.itemsize))
    support = np.flatnonzero(theta)
    sparse_theta = support.size <= d // 8
    th = (theta[support] if sparse_theta else theta).astype(X.dtype, copy=False)
    if rows is None:
        rows = slice(0, X.shape[0])
    if isinstance(rows, slice):
        a0, a1, stride = rows.indices(X.shape[0])
        if stride != 1:
            raise PrivacyParameterError(
                f"The 'rows' parameter must be a slice with step 1. Got {rows!r} instead."
            )
        m = a1 - a0
    else:
        a0, m = 0, len(rows)
    starts = list(range(0, m, step))
    failed = threading.Event()

    def lane(k: int) -> np.ndarray:
        g = np.zeros(d, dtype=np.float64)
        # One gather buffer per lane, reused: a fresh multi-MB array per chunk costs page faults.
        buf = None if isinstance(rows, slice) else np.empty((min(step, m), d), dtype=X.dtype)
        # Unchecked chunks may hold NaN/inf: that arithmetic is discarded, so its warnings are silenced.
        with np.errstate(invalid="ignore", over="ignore"):
            for a in starts[k::FUSED_LANES]:
                if failed.is_set():
                    break
                b = min(a + step, m)
                if buf is None:
                    Xc = X[a0 + a : a0 + b]
                else:  # mode="clip" lets take write into `out` unbuffered (the indices are valid anyway)
                    Xc = np.take(X, cast(np.ndarray, rows)[a:b], axis=0, out=buf[: b - a], mode="clip")
                if not sparse_theta:
                    z = np.asarray(Xc @ th, dtype=np.float64)
                elif support.size:
                    z = np.asarray(Xc[:, support] @ th, dtype=np.float64)
                else:
                    z = np.zeros(b - a)
                r = sigmoid(z) - targets[a:b]
                g += r.astype(X.dtype, copy=False) @ Xc
                # The chunk is in cache now. NaN fails both comparisons and ±inf one of them, so this
                # one scan checks finiteness and the bound.
                if bound is not None and not (Xc.min() >= -bound and Xc.max() <= bound):
                    failed.set()
                    break
        return g

    threads = default_fused_threads() if threads is None else check_int(threads, "threads", low=1)
    threads = min(threads, FUSED_LANES, max(1, len(starts)))
    if threads == 1:
        parts = [lane(k) for k in range(FUSED_LANES)]
    else:
        pool = _fused_pool(threads)
        with _one_blas_thread():
            parts = list(pool.map(lane, range(FUSED_LANES)))
    if failed.is_set():
        return parts[0], False
    g = parts[0]
    for p in parts[1:]:
        g += p
    g /= max(m, 1)
    return g, True


def _iht_loop(
    X: Any,
    targets: np.ndarray,
    *,
    sparsity: int,
    n_iter: int,
    step_size: float,
    radius: float,
    batches: list[Any] | None,
    threshold: Callable[[np.ndarray, Any], np.ndarray],
    pending_bound: float | None = None,
    progress: bool = False,
    denominators: Sequence[float] | None = None,
) -> np.ndarray:
    """The shared IHT loop; ``threshold(v, m_t)`` receives the batch size (for the sensitivity).

    ``denominators`` (user level, one per batch): the gradient is ``(1/D_t) Σ_{i∈B_t} g_i`` with the public
    ``D_t`` instead of the mean over the batch's rows, and ``threshold`` receives ``D_t``.

    Dense input goes through :func:`fused_btl_gradient` (one pass over the batch per iteration).
    ``pending_bound`` (from :func:`_check_common`) makes the first pass over each row also check it; a
    violation raises the standard :func:`~privalign.estimation.base.check_features` error, so nothing
    computed from unchecked data is ever returned. Disjoint batches (one per iteration, partitioning the
    rows) see every row exactly once; the full variant checks all rows in iteration 0.
    """
    if batches is not None and len(batches) != n_iter:  # every row must be read (and so checked) once
        raise PrivacyParameterError(f"{len(batches)} batches for {n_iter} iterations: they must be equal.")
    d = X.shape[1]
    dense = not _is_sparse(X)
    theta = np.zeros(d)
    it = range(n_iter)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="IHT", leave=False)
    for t in it:
        rows = None if batches is None else batches[t]
        tb = targets if rows is None else targets[rows]
        if dense:
            check = pending_bound if (batches is not None or t == 0) else None
            g, ok = fused_btl_gradient(X, rows, tb, theta, bound=check)
            if not ok:
                check_features(X, "X", feature_bound=pending_bound)  # raises the standard, precise error
                raise AssertionError(
                    "the fused bound check disagrees with check_features"
                )  # pragma: no cover
            m: float = len(tb)
        else:
            Xb = X if rows is None else X[rows]
            g = btl_gradient(Xb, tb, theta)
            m = Xb.shape[0]
            del Xb  # free a copied batch before the next one is gathered
        if denominators is not None:  # Σ g_i / D_t: the mean rescaled to the public denominator
            g = g * (m / float(denominators[t]))
            m = denominators[t]
        v = theta - step_size * g
        theta = project_l2(threshold(v, m), radius)
    return theta


# ------------------------------------------------------------------------------------------------
# Non-private IHT
# ------------------------------------------------------------------------------------------------


class IHT(RewardEstimator):
    """Non-private iterative hard thresholding for the sparse BTL/logistic model (reference method).

    Args:
      sparsity: s, the number of non-zeros kept (1 ≤ s ≤ d).
      n_iter: T iterations (default 100 for ``variant="full"``, ``default_n_iter(n)`` for ``"disjoint"``).
      step_size: η.
      radius: B_θ, the ℓ2 ball the iterates are projected on (``inf``: none).
      feature_bound: the public coordinate bound c_x; rows must satisfy ‖x‖∞ ≤ c_x.
      clip: clip features into [−c_x, c_x] instead of raising.
      variant: ``"full"`` (all data every iteration) or ``"disjoint"`` (T disjoint batches, the same
        schedule as :class:`SampleDPIHT`, so that Sample-DP IHT with the noise off equals it exactly).
      shuffle: disjoint batches from a random permutation (default) or contiguous row blocks (no copy).
      random_state: seed of the batch permutation (``"disjoint"`` only).

    Attributes:
      coef_: the fitted θ̂ (dense, at most s non-zeros). support_: its sorted support.
      n_iter_: T used. privacy_event_: ``NonPrivateEvent`` (no guarantee).
    """

    name = "IHT"
    aliases = ("iht",)
    privacy_kind = "none"
    sparse = True
    title = "IHT"
    params = (STEP_SIZE, RADIUS)

    def __init__(
        self,
        *,
        sparsity: int = 16,
        n_iter: int | None = None,
        step_size: float = 4.0,
        radius: float = 5.0,
        feature_bound: float = 1.0,
        clip: bool = False,
        variant: str = "full",
        shuffle: bool = True,
        random_state: Any = None,
    ) -> None:
        self.sparsity = sparsity
        self.n_iter = n_iter
        self.step_size = step_size
        self.radius = radius
        self.feature_bound = feature_bound
        self.clip = clip
        self.variant = variant
        self.shuffle = shuffle
        self.random_state = random_state

    def _resolve_T(self, n: int, variant: str) -> int:
        if self.n_iter is None:
            return 100 if variant == "full" else default_n_iter(n)
        return check_int(self.n_iter, "n_iter", low=1)

    def fit(self, X: Any, y: Any) -> IHT:
        """Fit on comparisons ``X`` (n × d, dense or sparse) with labels ``y`` ∈ {0, 1}; returns self."""
        Xv, yv, s, pending = _check_common(self, X, y)
        variant = check_choice(self.variant, "variant", ("full", "disjoint"))
        T = self._resolve_T(Xv.shape[0], variant)
        rng = as_generator(self.random_state)
        batches = _batches(Xv.shape[0], T, variant, rng, bool(self.shuffle))
        self.coef_ = _iht_loop(
            Xv,
            yv,
            sparsity=s,
            n_iter=T,
            step_size=float(self.step_size),
            radius=float(self.radius),
            batches=batches,
            threshold=lambda v, m: hard_threshold(v, s),
            pending_bound=pending,
        )
        self.support_ = np.flatnonzero(self.coef_)
        self.n_iter_ = T
        self.n_features_in_ = Xv.shape[1]
        self.privacy_event_ = NonPrivateEvent(unit="sample", relation="replace_one")
        return self


# ------------------------------------------------------------------------------------------------
# Sample-DP IHT
# ------------------------------------------------------------------------------------------------


def _advanced_epsilon(eps_i: float, T: int, delta_prime: float) -> float:
    """Dwork–Rothblum–Vadhan advanced composition of T ε_i-DP steps (Dwork & Roth 2014, Thm 3.20)."""
    if eps_i > 700.0:
        return math.inf
    return math.sqrt(2.0 * T * -math.log(delta_prime)) * eps_i + T * eps_i * math.expm1(eps_i)


def advanced_composition_split(epsilon: float, delta: float, T: int) -> tuple[float, float]:
    """Per-iteration ``(ε_i, δ_i)`` so that T adaptive (ε_i, δ_i)-DP steps are (ε, δ)-DP.

    Takes the better of basic composition ``(ε/T, δ/T)`` and advanced composition with
    ``δ_i = δ/(2T)``, ``δ′ = δ/2`` and the largest ε_i (bisection, rounded down) such that
    ``sqrt(2T ln(1/δ′))·ε_i + T·ε_i·(e^{ε_i} − 1) ≤ ε`` (Dwork & Roth 2014, Thm 3.20).
    """
    from privalign.accounting.conversions import round_up

    def down(total: float, k: int) -> float:  # the largest float x with k·x ≤ total exactly
        x = total / k
        while k * Fraction(x) > Fraction(total):
            x = math.nextafter(x, 0.0)
        return x

    basic = (down(epsilon, T), down(delta, T))
    # the float formula rounded up is what must fit ε
    eps_i = bisect_monotone(
        lambda e: round_up(_advanced_epsilon(e, T, delta / 2.0), 4) <= epsilon, 0.0, epsilon, feasible="below"
    )
    adv = (eps_i, down(delta / 2.0, T))  # T·δ_i ≤ δ/2 exactly, and δ′ = δ/2 (exact) gives the rest
    return adv if adv[0] > basic[0] else basic


def peeling_sensitivity(
    step_size: float, feature_bound: float, batch_size: float, group_size: int = 1
) -> float:
    """λ = 2·η·c_x·k/m: the ℓ∞ sensitivity of ``v = θ − (η/m)·Σ_{i∈B} g_i`` when ``group_size`` = k of the
    batch's terms change together (``|σ(·) − y| ≤ 1`` and ``‖x‖∞ ≤ c_x`` bound each per-example gradient by
    c_x in ℓ∞, so k of them move the sum by ≤ 2k·c_x). k = 1: one comparison replaced (m = the batch's rows).
    User level: k = K, the most rows a user holds, and m = K·U_t, the public denominator of a batch of U_t
    users (λ = 2ηc_x/U_t)."""
    return 2.0 * step_size * feature_bound * group_size / batch_size


def gradient_step(X: Any, targets: np.ndarray, theta: np.ndarray, step_size: float) -> np.ndarray:
    """``v = θ − η·(1/m) Σ (σ(x_iᵀθ) − t_i)·x_i`` on one batch (dense float64 output)."""
    return theta - step_size * btl_gradient(X, targets, theta)


@functools.lru_cache(maxsize=64)
def _peeling(sparsity: int, epsilon: float, delta: float, sensitivity: float) -> Any:
    """B's Peeling (frozen, stateless) cached by its parameters: its calibration bisection runs once."""
    from privalign.mechanisms.selection import Peeling

    return Peeling(sparsity, epsilon, delta, sensitivity, unit="sample", relation="replace_one")


def peeling_threshold(
    v: np.ndarray,
    batch_size: float,
    *,
    sparsity: int,
    epsilon: float,
    delta: float,
    step_size: float,
    feature_bound: float,
    rng: Any,
    group_size: int = 1,
    unit: str = "sample",
) -> tuple[np.ndarray, PeelingEvent]:
    """The private thresholding of one Sample-DP IHT step: Peeling of ``v`` at λ = 2ηc_x/m
    (λ = 2ηc_x·K/m with ``group_size`` = K at user level, ``unit="user"``; :func:`peeling_sensitivity`).

    ``v`` may be a batch of vectors (2-D; rows thresholded independently, for audits).

    Returns:
      ``(sparse_v, event)``; the event records the per-call target (ε, δ) that B's Peeling was
      calibrated to (``calibrate_peeling``: accounted cost ≤ target) and its noise multiplier.
    """
    lam = (
        peeling_sensitivity(step_size, feature_bound, batch_size)
        if group_size == 1
        else peeling_sensitivity(step_size, feature_bound, batch_size, group_size)
    )
    mech = _peeling(int(sparsity), float(epsilon), float(delta), float(lam))
    out, _ = mech(v, rng=rng)
    # The event records the requested per-call target (ε, δ) (``mech.event`` records the accounted
    # cost instead, which is ≤ the target); accountants recompute the cost from (sparsity,
    # noise_multiplier) either way.
    ev = PeelingEvent(
        sparsity=sparsity,
        noise_multiplier=mech.noise_multiplier,
        target_epsilon=epsilon,
        target_delta=delta,
        unit=unit,
        relation="replace_one",
    )
    return out, ev


class SampleDPIHT(RewardEstimator):
    """Sample-DP iterative hard thresholding with Peeling (spec-reward-estimation.md §5).

    Each iteration takes a logistic/BTL gradient step on one batch and replaces hard thresholding by
    :class:`privalign.mechanisms.Peeling` (private top-s selection and release) at Laplace scale
    ``noise_multiplier × λ``, ``λ = 2·η·c_x/m`` (the ℓ∞ sensitivity of ``θᵗ − η·g`` under replacing one
    of the batch's m comparisons), then projects on the ℓ2 ball of radius B_θ.

    Args:
      epsilon: target ε in (0, ∞]; ``inf`` switches the noise off (exact hard thresholding, no privacy,
        ``NonPrivateEvent``): then the fit equals :class:`IHT` with the same variant, T, η and seed.
      delta: target δ in (0, 1).
      sparsity: s, coordinates kept per iteration (1 ≤ s ≤ d).
      n_iter: T (default :func:`default_n_iter`: ``min(⌈3 ln n⌉, ⌊τ_d·n/(2ηc_x²ν)⌋)``, at least 1, with ν
        the Peeling noise multiplier of (s, ε, δ) and ``τ_d = 0.05·min(1, H_200/H_d)``; ``⌈3 ln n⌉`` at
        ε = ∞ or for ``variant="full"``).
      step_size: η.
      radius: B_θ (public; ``inf``: no projection).
      feature_bound: c_x (public): every feature must satisfy |x_ij| ≤ c_x.
      clip: clip features into [−c_x, c_x] instead of raising (data-independent, so free).
      variant: ``"disjoint"`` (default: T disjoint batches, each Peeling at the full (ε, δ), parallel
        composition) or ``"full"`` (all data every iteration, ``λ = 2ηc_x/n``, per-iteration budget
        from :func:`advanced_composition_split`).
      shuffle: batches from a random permutation (default; each batch is copied) or contiguous row
        blocks (views, no copy: use on data already in random order). Both splits are data-independent.
      random_state: seed of the batch permutation and of the Peeling noise.
      max_pairs_per_user: K ≥ 1 for **user-level** privacy, fitted with ``fit(X, y, users=...)`` (each row's
        user; a user with more than K rows is refused; ``"disjoint"`` only): the T batches partition the
        *users* (a user's rows all fall in one batch), batch t of U_t users takes the step
        ``θ − (η/(K·U_t))·Σ_{i∈B_t} g_i`` (a public denominator, the batch's capacity in rows) and Peeling
        runs at ``λ = K·2ηc_x/(K·U_t) = 2ηc_x/U_t``; T ≤ U and the default T counts users. ``None``
        (default): one comparison is the unit.

    Attributes:
      coef_, support_, n_iter_, noise_multiplier_ (Laplace scale / λ per call), privacy_event_.

    Raises:
      PrivacyParameterError: labels ∉ {0, 1}, non-finite features, mismatched lengths, s ∉ [1, d],
        invalid ε/δ, features outside [−c_x, c_x] without ``clip``, T > n for disjoint batches. A failed
        fit leaves the estimator's fitted attributes as they were.

    Privacy:
      Unit: one comparison ``(k, a⁰, a¹, y)`` (``"sample"``: both ``x_i`` and ``y_i`` may change).
      Relation: replace-one (n is public).
      Sensitivity: ``‖v(D) − v(D′)‖∞ ≤ 2ηc_x/m`` for the batch that holds the changed record, since
      ``|σ(·) − y| ≤ 1`` and ``‖x‖∞ ≤ c_x``; θᵗ depends only on earlier batches.
      Guarantee: each Peeling call is (ε, δ)-DP as accounted by
      :func:`privalign.accounting.peeling.peeling_epsilon` from its 2s Laplace sub-mechanisms (spec §4
      option (b)); disjoint, data-independent batches give (ε, δ)-DP overall by adaptive parallel
      composition. ``"full"``: T adaptive calls at (ε_i, δ_i) compose to (ε, δ) (advanced or basic
      composition, whichever allows more per-call budget).
      Event: ``ParallelComposedEvent([PeelingEvent]×T, unit="sample")`` (disjoint) or
      ``ComposedEvent([PeelingEvent]×T, unit="sample")`` (full); ``NonPrivateEvent`` at ε = ∞.

      With ``max_pairs_per_user=K`` — Unit: one user (all of their ≤ K comparisons, and how many). Relation:
      replace-one user (all of one user's 1..K pairs replaced; the roster of user ids, hence U and every
      U_t, is public). The batches come from a secret uniform permutation of the users, so the output's law
      depends on the users' data as a multiset and the victim can be matched to the same batch on both
      sides (``shuffle=False`` is refused: slots by first appearance would move other users). Sensitivity:
      the user's rows all lie in one batch t, and replacing them moves ``Σ_{i∈B_t} g_i`` by ≤ 2K·c_x in ℓ∞
      (≤ K rows out, ≤ K rows in, each ≤ c_x), so ``‖v(D) − v(D′)‖∞ ≤ 2ηKc_x/(K·U_t) = 2ηc_x/U_t``; the
      denominator K·U_t does not depend on how many rows the users hold (the row count would: a mean over
      rows is not bounded this way). Guarantee: (ε, δ)-DP for the user by the same per-call Peeling
      guarantee and parallel composition over the T disjoint user batches. Event:
      ``ParallelComposedEvent([PeelingEvent(unit="user")]×T, unit="user")``.

    References:
      Cai, Wang & Zhang, "The Cost of Privacy", Ann. Statist. 2021, arXiv:1902.04495v5 (Peeling and
      its lemma; noisy IHT). McSherry, "Privacy Integrated Queries", SIGMOD 2009, Thm. 4 (parallel
      composition). Dwork & Roth 2014, Thm. 3.20 (advanced composition).
    """

    name = "SampleDPIHT"
    aliases = ("dp-iht",)
    user_level = True
    privacy_kind = "sample"
    sparse = True
    title = "Sample-DP IHT"
    params = (STEP_SIZE, RADIUS)

    def __init__(
        self,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-5,
        sparsity: int = 16,
        n_iter: int | None = None,
        step_size: float = 4.0,
        radius: float = 5.0,
        feature_bound: float = 1.0,
        clip: bool = False,
        variant: str = "disjoint",
        shuffle: bool = True,
        random_state: Any = None,
        max_pairs_per_user: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.sparsity = sparsity
        self.n_iter = n_iter
        self.step_size = step_size
        self.radius = radius
        self.feature_bound = feature_bound
        self.clip = clip
        self.variant = variant
        self.shuffle = shuffle
        self.random_state = random_state
        self.max_pairs_per_user = max_pairs_per_user

    def fit(self, X: Any, y: Any, users: Any = None) -> SampleDPIHT:
        """Fit privately; see the class docstring.

        Parameters, shapes and labels are validated before anything random happens. For dense ``X`` the
        finiteness/bound scan is fused into the first pass over each row (one memory pass instead of
        three); a violation raises before ``coef_`` or ``privacy_event_`` is set, so nothing computed from
        invalid data is released, but ``random_state`` (if a ``Generator``) may have been advanced.
        """
        eps = check_epsilon(self.epsilon)
        delta = check_probability(self.delta, "delta")
        Xv, yv, s, pending = _check_common(self, X, y)
        variant = check_choice(self.variant, "variant", ("disjoint", "full"))
        n = Xv.shape[0]
        codes: np.ndarray | None = None
        if self.max_pairs_per_user is not None:  # user level: batches of users, T and n count users
            from privalign.estimation.users import user_groups

            if variant != "disjoint":
                raise PrivacyParameterError(
                    "The 'variant' parameter must be 'disjoint' with 'max_pairs_per_user' (user-level "
                    f"Sample-DP IHT puts each user in one batch). Got {variant!r} instead."
                )
            if not self.shuffle:  # slots by first appearance would let one user's rows move the others
                raise PrivacyParameterError(
                    "The 'shuffle' parameter must be True with 'max_pairs_per_user' (user batches from a "
                    "secret random permutation of the users). Got False instead."
                )
            k_user = check_int(self.max_pairs_per_user, "max_pairs_per_user", low=1)
            codes, n = user_groups(users, Xv.shape[0], k_user)
        elif users is not None:
            raise PrivacyParameterError(
                "The 'users' parameter is used only with 'max_pairs_per_user' (user-level Sample-DP IHT). "
                f"Got {type(users).__name__} without it."
            )
        unit = "sample" if codes is None else "user"
        eta = float(self.step_size)
        c_x = float(self.feature_bound)
        if self.n_iter is not None:
            T = check_int(self.n_iter, "n_iter", low=1)
        elif math.isinf(eps) or variant == "full":
            T = default_n_iter(n)
        else:  # disjoint: the Peeling noise multiplier depends on (s, ε, δ) only (λ scales it)
            nm0 = _peeling(int(s), float(eps), float(delta), 1.0).noise_multiplier
            T = default_n_iter(
                n, noise_multiplier=nm0, step_size=eta, feature_bound=c_x, n_features=Xv.shape[1]
            )
        rng = as_generator(self.random_state)
        denominators: list[float] | None = None
        group = 1
        if codes is None:
            batches = _batches(n, T, variant, rng, bool(self.shuffle))
        else:
            batches, n_per_batch = user_batches(codes, n, T, rng, bool(self.shuffle))
            group = k_user
            denominators = [float(k_user * u) for u in n_per_batch]
        events: list[PeelingEvent] = []
        if math.isinf(eps):
            threshold = lambda v, m: hard_threshold(v, s)  # noqa: E731
            nm = 0.0
        else:
            eps_call, delta_call = (
                (eps, delta) if variant == "disjoint" else advanced_composition_split(eps, delta, T)
            )

            def threshold(v: np.ndarray, m: int) -> np.ndarray:
                out, ev = peeling_threshold(
                    v,
                    m,
                    sparsity=s,
                    epsilon=eps_call,
                    delta=delta_call,
                    step_size=eta,
                    feature_bound=c_x,
                    rng=rng,
                    group_size=group,
                    unit=unit,
                )
                events.append(ev)
                return out

        coef = _iht_loop(
            Xv,
            yv,
            sparsity=s,
            n_iter=T,
            step_size=eta,
            radius=float(self.radius),
            batches=batches,
            threshold=threshold,
            pending_bound=pending,
            denominators=denominators,
        )
        if math.isinf(eps):
            event: PrivacyEvent = NonPrivateEvent(unit=unit, relation="replace_one")
        elif variant == "disjoint":
            event = ParallelComposedEvent(events=tuple(events), unit=unit, relation="replace_one")
            nm = events[0].noise_multiplier
        else:
            event = ComposedEvent(events=tuple(events), unit="sample", relation="replace_one")
            nm = events[0].noise_multiplier
        self.coef_ = coef
        self.support_ = np.flatnonzero(coef)
        self.n_iter_ = T
        self.n_features_in_ = Xv.shape[1]
        self.noise_multiplier_ = float(nm)
        self.privacy_event_ = event
        return self


# ------------------------------------------------------------------------------------------------
# Label-DP RR-IHT
# ------------------------------------------------------------------------------------------------


def debiased_gradient(
    X: Any, y_tilde: np.ndarray, theta: np.ndarray, flip_probability: float, *, form: int = 3
) -> np.ndarray:
    """Per-sample debiased gradients, shape (n, d) (dense; for tests on small problems).

    * form 1: ``[∇ℓ_ỹ − ρ(∇ℓ_0 + ∇ℓ_1)]/(1 − 2ρ)``;
    * form 2: the gradient of the Natarajan et al. loss ``[(1 − ρ)ℓ(ỹ) − ρℓ(1 − ỹ)]/(1 − 2ρ)``;
    * form 3: ``(σ(xᵀθ) − ŷ)·x`` with ``ŷ = (ỹ − ρ)/(1 − 2ρ)`` (what RRIHT uses).
    """
    X = np.asarray(X.toarray() if hasattr(X, "toarray") else X, dtype=np.float64)
    yt = np.asarray(y_tilde, dtype=np.float64)
    rho = float(flip_probability)
    sig = sigmoid(X @ np.asarray(theta, dtype=np.float64))

    def grad_l(lbl: np.ndarray) -> np.ndarray:
        return (sig - lbl)[:, None] * X

    if form == 1:
        return (grad_l(yt) - rho * (grad_l(np.zeros_like(yt)) + grad_l(np.ones_like(yt)))) / (1.0 - 2.0 * rho)
    if form == 2:
        return ((1.0 - rho) * grad_l(yt) - rho * grad_l(1.0 - yt)) / (1.0 - 2.0 * rho)
    if form == 3:
        return (sig - debiased_labels(yt, rho))[:, None] * X
    raise PrivacyParameterError(f"The 'form' parameter must be one of [1, 2, 3]. Got {form!r} instead.")


def debiased_loss(X: Any, y_tilde: np.ndarray, theta: np.ndarray, flip_probability: float) -> float:
    """Mean Natarajan et al. (2013) unbiased loss, form (2) of spec §6."""
    X = np.asarray(X.toarray() if hasattr(X, "toarray") else X, dtype=np.float64)
    yt = np.asarray(y_tilde, dtype=np.float64)
    rho = float(flip_probability)
    z = X @ np.asarray(theta, dtype=np.float64)

    def loss(lbl: np.ndarray) -> np.ndarray:
        return softplus(z) - lbl * z  # −y log σ(z) − (1 − y) log(1 − σ(z))

    return float(np.mean(((1.0 - rho) * loss(yt) - rho * loss(1.0 - yt)) / (1.0 - 2.0 * rho)))


class RRIHT(RewardEstimator):
    """Label-DP RR-IHT: randomized response on the labels, debiased gradient, exact IHT (spec §6).

    Args:
      epsilon: ε in (0, ∞] of randomized response; ``inf`` flips nothing (then the fit equals
        :class:`IHT` with ``variant="full"`` and the same T, η, B_θ).
      sparsity: s (1 ≤ s ≤ d).
      n_iter: T (default 50); all data is used in every iteration.
      step_size: η. radius: B_θ (``inf``: none).
      feature_bound: c_x; clip: clip features instead of raising.
      refit: after IHT, minimise the debiased loss (form 2) restricted to the selected support
        (ridge ``refit_alpha``), then project on the B_θ ball. Post-processing of private labels, free.
      refit_alpha: ℓ2 penalty of the refit (> 0 keeps the possibly non-convex-below debiased loss bounded).
      random_state: seed of the randomized response.

    Attributes:
      coef_, support_, n_iter_, flip_probability_, privacy_event_.

    Raises:
      PrivacyParameterError: as :class:`SampleDPIHT`.

    Privacy:
      Unit: one preference label ``y_i`` (``"label"``); the features x_i (prompts, responses, φ) are
      **public**. Relation: replace-one (the bit flips). Sensitivity: not applicable (a bit).
      Guarantee: ε-label-DP: each label passes once through ε-DP randomized response (ε-local DP);
      everything after is post-processing. No δ.
      Event: ``RandomizedResponseEvent(epsilon, unit="label")`` (``NonPrivateEvent`` at ε = ∞).

    References:
      Warner 1965 (randomized response); Ghazi et al., "Deep Learning with Label Differential
      Privacy", arXiv:2102.06062v2, Def. 1 (label DP); Natarajan et al., "Learning with Noisy Labels",
      NeurIPS 2013, Lemma 1 (unbiased loss); Dwork & Roth 2014, Prop. 2.1 (post-processing).
    """

    name = "RRIHT"
    aliases = ("rr-iht",)
    user_level = True
    privacy_kind = "label"
    sparse = True
    title = "RR-IHT"
    params = (STEP_SIZE, RADIUS)

    def __init__(
        self,
        *,
        epsilon: float = 1.0,
        sparsity: int = 16,
        n_iter: int | None = None,
        step_size: float = 4.0,
        radius: float = 5.0,
        feature_bound: float = 1.0,
        clip: bool = False,
        refit: bool = False,
        refit_alpha: float = 1e-3,
        random_state: Any = None,
    ) -> None:
        self.epsilon = epsilon
        self.sparsity = sparsity
        self.n_iter = n_iter
        self.step_size = step_size
        self.radius = radius
        self.feature_bound = feature_bound
        self.clip = clip
        self.refit = refit
        self.refit_alpha = refit_alpha
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> RRIHT:
        """Privatise the labels with RR, then run debiased IHT; returns self."""
        eps = check_epsilon(self.epsilon)
        Xv, yv, s, pending = _check_common(self, X, y)
        T = 50 if self.n_iter is None else check_int(self.n_iter, "n_iter", low=1)
        alpha = check_real(self.refit_alpha, "refit_alpha", low=0.0, closed="neither")
        rng = as_generator(self.random_state)
        y_tilde, rho, rr_event = privatize_labels(yv, eps, rng)
        targets = debiased_labels(y_tilde, rho)
        coef = _iht_loop(
            Xv,
            targets,
            sparsity=s,
            n_iter=T,
            step_size=float(self.step_size),
            radius=float(self.radius),
            batches=None,
            threshold=lambda v, m: hard_threshold(v, s),
            pending_bound=pending,
        )
        if self.refit:
            from privalign.estimation.baselines import fit_logistic

            support = np.flatnonzero(coef)
            if support.size:
                sub = fit_logistic(Xv[:, support], targets, alpha=alpha, theta0=coef[support])
                coef = np.zeros_like(coef)
                coef[support] = sub
                coef = project_l2(coef, float(self.radius))
        self.coef_ = coef
        self.support_ = np.flatnonzero(coef)
        self.n_iter_ = T
        self.n_features_in_ = Xv.shape[1]
        self.flip_probability_ = float(rho)
        self.privacy_event_ = rr_event
        return self


def peeling_snr(
    X,
    y,
    *,
    epsilon: float,
    delta: float,
    sparsity: int,
    step_size: float,
    feature_bound: float,
    n_candidates: int = 1,
    n_fit: int | None = None,
) -> dict:
    """Non-private diagnostic: can Peeling find the top coordinates of Sample-DP IHT's first step?

    On the pairs ``(X, y)``, the gradient at θ = 0 is ``g = (1/n)·Σ (½ − y_i)·x_i``; Sample-DP IHT's first
    thresholding sees ``v = −η·g`` plus Laplace noise of scale ``b = ν·λ``, ``λ = 2ηc_x/m``, with m = n_fit/T
    pairs per batch (T = :func:`default_n_iter`) and ν Peeling's noise multiplier at
    (ε/K, δ/K) for K tuned candidates. The expected largest of the d noise magnitudes is ``b·H_d`` (H_d the
    d-th harmonic number: |Laplace(b)| is Exponential with mean b). A coordinate j can be picked for its
    signal only if ``η·|g_j|`` exceeds that; with T = 1 this needs ``n ≥ 2·c_x·ν·H_d/|g_j|``
    (``n_needed_top1`` for the largest |g_j|, ``n_needed_top_s`` for the s-th largest). The gradient
    magnitudes are those of the given pairs (they estimate population means, so they do not shrink with n).

    Not private: it reads the labels. It explains a result; nothing is chosen with it.
    """
    Xv = X.tocsr() if hasattr(X, "tocsr") else np.asarray(X, dtype=float)
    n, d = Xv.shape
    n_fit = int(n_fit or n)
    yv = np.asarray(y, dtype=float)
    g = np.abs(np.asarray(Xv.T @ (0.5 - yv)).ravel()) / n
    top = np.sort(g)[::-1]
    eps_c, delta_c = epsilon / n_candidates, delta / n_candidates
    nu = float(_peeling(int(sparsity), float(eps_c), float(delta_c), 1.0).noise_multiplier)
    T = default_n_iter(
        n_fit, noise_multiplier=nu, step_size=step_size, feature_bound=feature_bound, n_features=d
    )
    b = nu * 2.0 * step_size * feature_bound / (n_fit // T)
    h_d = float(np.sum(1.0 / np.arange(1, d + 1)))
    k = min(int(sparsity), d) - 1
    need = lambda gj: None if gj <= 0 else 2.0 * feature_bound * nu * h_d / gj  # None: no signal at all
    return {
        "epsilon": float(epsilon),
        "candidates": int(n_candidates),
        "epsilon_per_candidate": float(eps_c),
        "sparsity": int(sparsity),
        "noise_multiplier": nu,
        "n_fit": n_fit,
        "T": int(T),
        "laplace_scale": b,
        "expected_max_noise": b * h_d,
        "signal_top1": step_size * float(top[0]),
        "signal_top_s": step_size * float(top[k]),
        "n_needed_top1": need(float(top[0])),
        "n_needed_top_s": need(float(top[k])),
        "selectable_top_s": bool(step_size * top[k] > b * h_d),
    }
