"""FastSeededNoise: the opt-in fast exact Gumbel draw and Gumbel argmax for seeded simulations.

Each statistical test states α and uses exact critical values (scipy.stats.chi2.isf / kstwo)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats

from privalign.alignment import PrivBoN
from privalign.errors import PrivacyParameterError
from privalign.rng import FastSeededNoise, SecureNoise, SeededNoise, as_noise_source

ALPHA = 1e-4


def _chi2_ok(counts: np.ndarray, probs: np.ndarray) -> bool:
    n = counts.sum()
    stat = float(np.sum((counts - n * probs) ** 2 / (n * probs)))
    return stat <= stats.chi2.isf(ALPHA, df=probs.size - 1)


@pytest.mark.statistical
@pytest.mark.parametrize(
    "scores, scale, kw",
    [
        (np.array([0.0, 0.3, 0.5, 1.0, 0.9, 0.2]), 0.5, {}),  # accepted by rejection almost always
        (
            np.array([0.0, 0.1, 0.2, 1.0, 0.95, 0.05]),
            0.05,
            {"trials_per_round": 1, "rounds": 1},
        ),  # fallback often
        (np.array([0.0, 0.0, 1.0]), 0.2, {"trials_per_round": 2, "rounds": 2}),  # both paths
    ],
)
def test_argmax_has_the_softmax_law(scores, scale, kw):
    """Chi-square goodness of fit against softmax(scores/scale), α = 1e-4 per case."""
    src = FastSeededNoise(np.random.default_rng(0), **kw)
    idx = src.gumbel_argmax(np.broadcast_to(scores, (60_000, scores.size)), scale)
    assert idx.shape == (60_000,) and idx.dtype == np.int64
    assert _chi2_ok(np.bincount(idx, minlength=scores.size), special.softmax(scores / scale))


@pytest.mark.statistical
def test_gumbel_draw_is_gumbel():
    """One-sample Kolmogorov–Smirnov test against Gumbel(0, 2), α = 1e-4 (exact null law
    scipy.stats.kstwo)."""
    x = FastSeededNoise(1).gumbel(2.0, 20_000)
    d = stats.kstest(x, stats.gumbel_r(scale=2.0).cdf).statistic
    assert d <= stats.kstwo.isf(ALPHA, x.size)


def test_shapes_scale_zero_reproducible_and_topk():
    s = np.random.default_rng(2).uniform(0, 1, (3, 4, 9))
    a = FastSeededNoise(5).gumbel_argmax(s, 0.3)
    assert a.shape == (3, 4) and np.array_equal(a, FastSeededNoise(5).gumbel_argmax(s, 0.3))
    assert np.array_equal(FastSeededNoise(5).gumbel_argmax(s, 0.0), np.argmax(s, axis=-1))
    one = FastSeededNoise(5).gumbel_argmax(s[0, 0], 0.3)
    assert isinstance(int(one), int) and 0 <= one < 9
    top = FastSeededNoise(5).gumbel_topk(s[0], 3, 0.3)
    assert top.shape == (4, 3) and all(len(set(r)) == 3 for r in top)
    assert isinstance(as_noise_source(FastSeededNoise(0)), FastSeededNoise)


@pytest.mark.parametrize(
    "kw", [{"trials_per_round": 0}, {"rounds": -1}, {"rounds": 1.5}, {"trials_per_round": True}]
)
def test_bad_parameters(kw):
    with pytest.raises(PrivacyParameterError, match=next(iter(kw))):
        FastSeededNoise(0, **kw)


def test_privbon_opt_in_only():
    """The default seeded stream is unchanged (pinned in test_alignment_pinned); the fast one is opt-in and
    gives valid selections with the same event."""
    r = np.random.default_rng(3).uniform(0, 1, (50, 32))
    sel = PrivBoN(2.0)
    fast = sel.select_batch(r, rng=FastSeededNoise(np.random.default_rng(9)))
    slow = sel.select_batch(r, rng=np.random.default_rng(9))
    assert fast.indices.shape == (50,) and ((fast.indices >= 0) & (fast.indices < 32)).all()
    assert fast.worst_case_event == slow.worst_case_event
    assert not np.array_equal(fast.indices, slow.indices)  # a different stream (P(equal) ≈ 0)
    assert not FastSeededNoise.secure and SecureNoise.secure and isinstance(FastSeededNoise(0), SeededNoise)


@pytest.mark.parametrize(
    "bad, msg",
    [
        (np.nan, "only finite values"),
        (np.inf, "only finite values"),
        (1.5, "declared public range"),
        (-0.1, "declared public range"),
    ],
)
def test_one_pass_validation_falls_back_to_the_full_checks(bad, msg):
    """The block-wise range check (128 rows per block at 1,024 columns) finds a bad value in the last block
    and the full checks then raise their usual message."""
    r = np.random.default_rng(0).uniform(0, 1, (300, 1024))
    r[-1, -1] = bad
    with pytest.raises(PrivacyParameterError, match=msg):
        PrivBoN(2.0).select_batch(r, rng=np.random.default_rng(0))
    with pytest.raises(PrivacyParameterError, match=msg):
        PrivBoN(2.0).select(r[-1], rng=np.random.default_rng(0))


@pytest.mark.statistical
def test_privbon_batch_with_fast_noise_has_the_softmax_law():
    """PrivBoN.select_batch hands the range check's row maxima to the sampler: same draws as without them,
    and the selections follow softmax(r/σ) (chi-square, α = 1e-4)."""
    r = np.array([0.0, 0.2, 0.9, 1.0, 0.5])
    rows = np.broadcast_to(r, (40_000, r.size))
    sel = PrivBoN(4.0)  # σ = 2Δ/ε = 0.5
    idx = sel.select_batch(rows, rng=FastSeededNoise(np.random.default_rng(4))).indices
    assert np.array_equal(idx, FastSeededNoise(np.random.default_rng(4)).gumbel_argmax(rows, sel.scale))
    assert _chi2_ok(np.bincount(idx, minlength=r.size), special.softmax(r / sel.scale))
