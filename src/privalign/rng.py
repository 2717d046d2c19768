"""Noise sources: one interface, two implementations.

* :class:`SeededNoise` wraps a ``numpy.random.Generator``. For experiments and reproducibility. PCG64 is
  *not* a cryptographically secure generator, and numpy's float samplers are vulnerable to
  floating-point attacks (Mironov 2012): never use it to serve real users (see LIMITATIONS.md).
* :class:`FastSeededNoise` (opt-in) is a :class:`SeededNoise` with faster *exact* Gumbel draws and Gumbel
  argmax, for simulations: same laws, a different random stream than :class:`SeededNoise` for the same seed.
* :class:`SecureNoise` draws from OS entropy and uses OpenDP's floating-point-safe samplers for the
  Laplace, Gaussian and Gumbel-argmax draws. It refuses seeds.

Mechanisms take ``rng`` as a required keyword argument, either a ``numpy.random.Generator`` or a
:class:`NoiseSource`; :func:`as_noise_source` converts. Nothing in privalign seeds global state.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import numpy as np

from privalign.errors import MissingDependencyError, PrivacyParameterError

__all__ = [
    "NoiseSource",
    "SeededNoise",
    "FastSeededNoise",
    "SecureNoise",
    "as_noise_source",
    "as_generator",
    "entropy_int",
]


def entropy_int(ss: np.random.SeedSequence) -> int:
    """The entropy of ``ss`` as an ``int`` (what manifests record to replay a run).

    Raises:
      TypeError: ``ss`` was built from a sequence of ints, not one int or OS entropy.
    """
    e = ss.entropy
    if isinstance(e, int | np.integer):
        return int(e)
    raise TypeError(
        f"The 'ss' parameter must be a SeedSequence built from one int or None. Got entropy {e!r} instead."
    )


@runtime_checkable
class NoiseSource(Protocol):
    """What a mechanism needs from a source of randomness.

    All methods return float64 arrays (or int arrays for indices). ``scale`` is the distribution's scale
    parameter (Gumbel β, Laplace b, Gaussian standard deviation σ).
    """

    secure: bool

    def uniform(self, size: int | tuple[int, ...]) -> np.ndarray: ...

    def gumbel(self, scale: float, size: int | tuple[int, ...]) -> np.ndarray: ...

    def laplace(self, scale: float, size: int | tuple[int, ...]) -> np.ndarray: ...

    def normal(self, scale: float, size: int | tuple[int, ...]) -> np.ndarray: ...

    def gumbel_argmax(self, scores: np.ndarray, scale: float) -> np.ndarray:
        """``argmax(scores + Gumbel(scale))`` along the last axis (ints, shape ``scores.shape[:-1]``)."""
        ...

    def gumbel_topk(self, scores: np.ndarray, k: int, scale: float) -> np.ndarray:
        """Indices of the ``k`` largest of ``scores + Gumbel(scale)`` along the last axis, in decreasing
        order of the noisy value (ints, shape ``scores.shape[:-1] + (k,)``)."""
        ...

    def bernoulli(self, p: float | np.ndarray, size: int | tuple[int, ...] | None = None) -> np.ndarray: ...

    def permutation(self, n: int) -> np.ndarray: ...


class SeededNoise:
    """Noise from a ``numpy.random.Generator`` (reproducible; not for serving).

    Args:
      generator: A ``numpy.random.Generator``; an int seed or ``None`` is turned into one with
        ``numpy.random.default_rng``.
    """

    secure = False

    def __init__(self, generator: np.random.Generator | int | None = None) -> None:
        self.generator = as_generator(generator)

    def uniform(self, size):
        return self.generator.random(size)

    def gumbel(self, scale, size):
        return self.generator.gumbel(0.0, scale, size)

    def laplace(self, scale, size):
        return self.generator.laplace(0.0, scale, size)

    def normal(self, scale, size):
        return self.generator.normal(0.0, scale, size)

    def gumbel_argmax(self, scores, scale):
        scores = np.asarray(scores, dtype=np.float64)
        if scale == 0.0:
            return np.argmax(scores, axis=-1)
        # In-place to avoid a second temporary of the same size.
        noisy = self.generator.gumbel(0.0, scale, scores.shape)
        noisy += scores
        return np.argmax(noisy, axis=-1)

    def gumbel_topk(self, scores, k, scale):
        scores = np.asarray(scores, dtype=np.float64)
        noisy = scores.copy() if scale == 0.0 else self.generator.gumbel(0.0, scale, scores.shape) + scores
        return _topk_desc(noisy, k)

    def bernoulli(self, p, size=None):
        p = np.asarray(p, dtype=np.float64)
        shape = p.shape if size is None else size
        return self.generator.random(shape) < p

    def permutation(self, n):
        return self.generator.permutation(n)

    def __repr__(self) -> str:
        return f"SeededNoise({self.generator!r})"


class FastSeededNoise(SeededNoise):
    """:class:`SeededNoise` with faster exact Gumbel draws and Gumbel argmax (simulations only; opt-in).

    * ``gumbel(scale, size) = −scale·log E`` with ``E ~ Exp(1)`` from numpy's ziggurat
      (``standard_exponential``): exactly Gumbel(0, scale) in law (``P(−log E ≤ x) = P(E ≥ e^{−x}) =
      exp(−e^{−x})``), one exponential and one log per draw instead of two logs of a uniform.
    * ``gumbel_argmax(scores, scale)`` samples the Gumbel-max law ``softmax(scores/scale)`` row by row by
      rejection: propose ``J`` uniform over the candidates, accept with probability
      ``exp((s_J − max s)/scale)``; an accepted ``J`` has exactly the softmax law. Trials run in vectorized
      rounds (``trials_per_round`` per row, at most ``rounds`` rounds); a row that accepted nothing then
      takes ``argmax(s + gumbel)`` — also the softmax law, so the mixture is exact. Expected trials per
      row: ``n / Σ_j exp((s_j − max s)/scale)`` (≈ e for scores spanning one scale unit); the work per row
      does not grow with ``n`` unless the law is peaked, and then the fallback bounds it by one Gumbel
      draw per candidate.

    Same laws as :class:`SeededNoise`, *different random stream* for the same seed (so outputs for a seed
    differ from :class:`SeededNoise`'s): choose it explicitly. Not for serving, like :class:`SeededNoise`
    (numpy floats, data-dependent running time); serving uses :class:`SecureNoise`.
    """

    def __init__(
        self,
        generator: np.random.Generator | int | None = None,
        *,
        trials_per_round: int = 4,
        rounds: int = 16,
    ) -> None:
        super().__init__(generator)
        for name, v in (("trials_per_round", trials_per_round), ("rounds", rounds)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise PrivacyParameterError(
                    f"The '{name}' parameter must be an integer ≥ 1. Got {v!r} instead."
                )
        self.trials_per_round, self.rounds = int(trials_per_round), int(rounds)

    def gumbel(self, scale, size):
        e = np.asarray(self.generator.standard_exponential(size), dtype=np.float64)
        np.log(e, out=e)
        e *= -scale
        return e

    def gumbel_argmax(self, scores, scale, *, row_max=None):
        """As :meth:`SeededNoise.gumbel_argmax`; ``row_max`` optionally gives each row's maximum of
        ``scores``, already computed by the caller (it must be ≥ every entry of its row: any such bound
        keeps the law exact, the maximum is the most efficient envelope)."""
        scores = np.asarray(scores, dtype=np.float64)
        if scale == 0.0:
            return np.argmax(scores, axis=-1)
        flat = scores.reshape(-1, scores.shape[-1])
        p, n = flat.shape
        top = flat.max(axis=1) if row_max is None else np.asarray(row_max, dtype=np.float64).reshape(p)
        out = np.empty(p, dtype=np.int64)
        active = np.arange(p)
        k = self.trials_per_round
        for _ in range(self.rounds):
            if active.size == 0:
                break
            j = self.generator.integers(0, n, size=(active.size, k))
            u = self.generator.random((active.size, k))
            logp = flat[active[:, None], j]
            logp -= top[active, None]
            logp /= scale
            acc = u < np.exp(logp, out=logp)
            hit = acc.any(axis=1)
            first = acc.argmax(axis=1)
            out[active[hit]] = j[hit, first[hit]]
            active = active[~hit]
        if active.size:
            noisy = self.gumbel(scale, (active.size, n))
            noisy += flat[active]
            out[active] = np.argmax(noisy, axis=1)
        return out[0] if scores.ndim == 1 else out.reshape(scores.shape[:-1])

    def gumbel_topk(self, scores, k, scale):
        scores = np.asarray(scores, dtype=np.float64)
        noisy = scores.copy() if scale == 0.0 else self.gumbel(scale, scores.shape) + scores
        return _topk_desc(noisy, k)

    def __repr__(self) -> str:
        return f"FastSeededNoise({self.generator!r})"


class SecureNoise:
    """Cryptographically secure, floating-point-safe noise (for serving).

    * Uniforms and Bernoullis: 53-bit uniforms from ``os.urandom`` (the OS CSPRNG).
    * Laplace and Gaussian vectors, Gumbel argmax and Gumbel top-k: OpenDP's samplers (``make_laplace``,
      ``make_gaussian``, ``make_noisy_max``, ``make_noisy_top_k``, the last two with the zCDP measure, i.e.
      Gumbel noise), which sample exactly and round safely, defending against the floating-point attack of
      Mironov (2012). Their running time is data-dependent (a timing side channel; see LIMITATIONS.md).
    * ``gumbel`` (raw Gumbel draws) is built from secure uniforms by inversion; it is used only in
      diagnostics, never to release a selection (use :meth:`gumbel_argmax`).

    Seeds are refused: a reproducible secure source is a contradiction.
    """

    secure = True

    def __init__(self, seed: Any = None) -> None:
        if seed is not None:
            raise PrivacyParameterError(
                "The 'seed' parameter of SecureNoise must be None (secure noise cannot be seeded). Got "
                f"{seed!r} instead."
            )
        try:
            # Import the submodules we use rather than ``opendp.prelude``, which also imports the
            # scikit-learn extras (~8 s of start-up on a loaded 2-core machine, ~0.9 s this way).
            import types

            import opendp.domains
            import opendp.measurements
            import opendp.measures
            import opendp.metrics
            import opendp.mod
        except ImportError as exc:  # pragma: no cover - opendp is a core dependency
            raise MissingDependencyError("SecureNoise needs opendp: pip install opendp") from exc
        opendp.mod.enable_features("contrib")
        dp = types.SimpleNamespace(m=opendp.measurements)
        for module in (opendp.domains, opendp.metrics, opendp.measures):
            for name in module.__all__:
                setattr(dp, name, getattr(module, name))
        self._dp = dp
        self._cache: dict[tuple, Any] = {}

    # -- uniforms from OS entropy -------------------------------------------------------------
    def uniform(self, size):
        shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
        n = int(np.prod(shape, dtype=np.int64))
        raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) if n else np.zeros(0, dtype=np.uint64)
        return ((raw >> np.uint64(11)).astype(np.float64) * (2.0**-53)).reshape(shape)

    def bernoulli(self, p, size=None):
        """Bernoulli(p) draws. A scalar ``p`` in [0, 1/2] (randomized response's flip probability) is sampled
        *exactly* by OpenDP (:meth:`flip_mask`); otherwise by comparing a secure 53-bit uniform with ``p``
        (success probability ⌈p·2⁵³⌉/2⁵³ ≥ p)."""
        p = np.asarray(p, dtype=np.float64)
        shape = p.shape if size is None else size
        if p.ndim == 0 and 0.0 <= float(p) <= 0.5:
            return self.flip_mask(float(p), shape)
        return self.uniform(shape) < p

    def flip_mask(self, p: float, size: int | tuple[int, ...]) -> np.ndarray:
        """A boolean array whose entries are independent Bernoulli(``p``), ``p`` in [0, 1/2], drawn with
        OpenDP's exact Bernoulli sampler (``make_randomized_response_bitvec`` with f = 2p on the zero vector:
        each bit is set with probability exactly f/2 = p, the float's exact rational value; no float
        comparison, no rounding). ``p = 0`` gives all ``False``.
        """
        shape = (int(size),) if isinstance(size, int | np.integer) else tuple(int(s) for s in size)
        n = int(np.prod(shape, dtype=np.int64))
        if not 0.0 <= p <= 0.5:
            raise PrivacyParameterError(
                f"The 'p' parameter of flip_mask must be in [0, 0.5]. Got {p!r} instead."
            )
        if p == 0.0 or n == 0:
            return np.zeros(shape, dtype=bool)
        key = ("flip_mask", p)
        m = self._cache.get(key)
        if m is None:
            dp = self._dp
            m = dp.m.make_randomized_response_bitvec(
                dp.bitvector_domain(max_weight=1), dp.discrete_distance(), f=2.0 * p
            )
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = m
        out = m(np.zeros((n + 7) // 8, dtype=np.uint8))
        bits = np.unpackbits(np.frombuffer(bytes(out), dtype=np.uint8), count=n)
        return bits.astype(bool).reshape(shape)

    def permutation(self, n):
        # Sort n secure 53-bit uniforms (a uniformly random permutation up to the probability of a tie,
        # at most n²/2^54, in which case the stable sort keeps index order).
        u = self.uniform(n)
        return np.argsort(u, kind="stable")

    def gumbel(self, scale, size):
        u = self.uniform(size)
        u = np.where(u == 0.0, 2.0**-53, u)
        return -scale * np.log(-np.log(u))

    # -- OpenDP samplers ----------------------------------------------------------------------
    def _measurement(self, kind: str, scale: float):
        key = (kind, float(scale))
        m = self._cache.get(key)
        if m is None:
            dp = self._dp
            dom = dp.vector_domain(dp.atom_domain(T=float, nan=False))
            if kind == "laplace":
                m = dp.m.make_laplace(dom, dp.l1_distance(T=float), scale=float(scale))
            elif kind == "gaussian":
                m = dp.m.make_gaussian(dom, dp.l2_distance(T=float), scale=float(scale))
            elif kind == "gumbel_argmax":
                # Gumbel noise is what OpenDP uses for noisy max under zCDP; its argmax has the
                # softmax law exp(s_i/scale)/Σ exp(s_j/scale).
                m = dp.m.make_noisy_max(
                    dom,
                    dp.linf_distance(T=float, monotonic=False),
                    dp.zero_concentrated_divergence(),
                    scale=float(scale),
                )
            elif kind.startswith("gumbel_topk:"):
                m = dp.m.make_noisy_top_k(
                    dom,
                    dp.linf_distance(T=float, monotonic=False),
                    dp.zero_concentrated_divergence(),
                    k=int(kind.split(":", 1)[1]),
                    scale=float(scale),
                )
            else:  # pragma: no cover
                raise ValueError(kind)
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = m
        return m

    def laplace(self, scale, size):
        shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
        n = int(np.prod(shape, dtype=np.int64))
        out = self._measurement("laplace", scale)([0.0] * n)
        return np.asarray(out, dtype=np.float64).reshape(shape)

    def normal(self, scale, size):
        shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
        n = int(np.prod(shape, dtype=np.int64))
        out = self._measurement("gaussian", scale)([0.0] * n)
        return np.asarray(out, dtype=np.float64).reshape(shape)

    def gumbel_argmax(self, scores, scale):
        scores = np.asarray(scores, dtype=np.float64)
        if scale == 0.0:
            return np.argmax(scores, axis=-1)
        m = self._measurement("gumbel_argmax", scale)
        if scores.ndim == 1:
            return np.int64(m(scores.tolist()))
        flat = scores.reshape(-1, scores.shape[-1])
        idx = np.fromiter((m(row.tolist()) for row in flat), dtype=np.int64, count=flat.shape[0])
        return idx.reshape(scores.shape[:-1])

    def gumbel_topk(self, scores, k, scale):
        scores = np.asarray(scores, dtype=np.float64)
        if scale == 0.0:
            return _topk_desc(scores, k)
        m = self._measurement(f"gumbel_topk:{int(k)}", scale)
        flat = scores.reshape(-1, scores.shape[-1])
        idx = np.array([m(row.tolist()) for row in flat], dtype=np.int64).reshape(flat.shape[0], int(k))
        return idx.reshape(scores.shape[:-1] + (int(k),))

    def __repr__(self) -> str:
        return "SecureNoise()"


def _topk_desc(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries along the last axis, largest first (equal values among the selected
    are ordered by index; which of several tied values at the k-th place is selected is unspecified)."""
    k = int(k)
    if k == values.shape[-1]:
        part = np.broadcast_to(np.arange(k), values.shape).copy()
    else:
        part = np.argpartition(-values, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(values, part, axis=-1)
    order = np.lexsort((part, -vals), axis=-1)
    return np.take_along_axis(part, order, axis=-1)


def as_generator(random_state: np.random.Generator | int | None) -> np.random.Generator:
    """scikit-learn style: turn ``None``/int/Generator into a ``numpy.random.Generator``.

    ``None`` gives a fresh, OS-seeded generator (never the global state).
    """
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or isinstance(random_state, int | np.integer | np.random.SeedSequence):
        return np.random.default_rng(random_state)
    raise TypeError(
        f"The 'random_state' parameter must be None, an int, a SeedSequence or a numpy.random.Generator. "
        f"Got {random_state!r} instead."
    )


def as_noise_source(rng: NoiseSource | np.random.Generator) -> NoiseSource:
    """Accept a ``numpy.random.Generator`` (wrapped in :class:`SeededNoise`) or any :class:`NoiseSource`."""
    if isinstance(rng, np.random.Generator):
        return SeededNoise(rng)
    if isinstance(rng, SeededNoise | SecureNoise) or isinstance(rng, NoiseSource):
        return rng
    raise TypeError(
        "The 'rng' parameter must be a numpy.random.Generator or a privalign NoiseSource "
        f"(SeededNoise, SecureNoise). Got {rng!r} of type {type(rng).__name__} instead."
    )
