"""Reference invariants the experiments rely on (style guide §11): PrivBoN at ε = ∞ equals BoN; PrivITP
with vanishing noise equals ITP; vectorized equals loop for a fixed seed; and the same through the
evaluation protocol the experiments call."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privalign.alignment import BestOfN, InferenceTimePessimism, PrivBoN, PrivITP
from privalign.alignment.simulation import MethodSpec, run_protocol
from privalign.alignment.synthetic import make_synthetic_pool


def test_privbon_at_infinite_epsilon_equals_bon(rng):
    scores = rng.random((20, 16))
    bon, priv = BestOfN(), PrivBoN(math.inf)
    for row in scores:
        assert np.array_equal(bon.law(row).probabilities, priv.law(row).probabilities)
    got = priv.select_batch(scores, rng=np.random.default_rng(0)).indices
    assert np.array_equal(got, np.argmax(scores, axis=1))


def test_privbon_at_infinite_epsilon_equals_bon_in_the_protocol(seed):
    pool = make_synthetic_pool(6, 64, random_state=seed)
    specs = [MethodSpec("bon"), MethodSpec("privbon", epsilon=math.inf)]
    res = run_protocol(pool, specs, n_grid=[1, 4, 16], replicates=5, random_state=seed, progress=False)
    a, b = res["methods"]
    assert a["true_lift"] == b["true_lift"] and a["proxy"] == b["proxy"]


def test_privitp_with_vanishing_noise_equals_itp(rng):
    beta, r_max = 0.05, 1.0
    itp = InferenceTimePessimism(beta, r_max=r_max)
    priv = PrivITP(beta, sigma_x=1e-7, sigma_z=1e-7, r_max=r_max, L=0.0)
    for _ in range(10):
        a, b = rng.random(16), rng.random(16)
        la, lb = itp.law(a, pool_b_scores=b), priv.law(a, pool_b_scores=b)
        np.testing.assert_allclose(lb.probabilities, la.probabilities, atol=1e-4)
        assert abs(lb.fallback - la.fallback) < 1e-4


@pytest.mark.parametrize("make", [lambda: PrivBoN(2.0), lambda: BestOfN()])
def test_vectorized_equals_loop_for_a_fixed_seed(make, rng):
    scores = rng.random((12, 10))
    sel = make()
    batch = sel.select_batch(scores, rng=np.random.default_rng(123)).indices
    g = np.random.default_rng(123)
    loop = [sel.select(row, rng=g).index for row in scores]
    assert list(batch) == loop


def test_experiment_gaussian_ablation_vectorized_equals_loop(seed):
    """The only evaluation code in privalign.experiments (the PrivBoN-Gaussian ablation) equals a plain
    per-replicate, per-draw loop with the same random stream."""
    from privalign.experiments.paper1 import gaussian_rnm_outcomes

    pool = make_synthetic_pool(3, 20, random_state=seed)
    cfg = {"transform": "none", "score_low": 0.0, "score_high": 1.0, "replicates": 4, "mc_draws": 6}
    lifts, _ = gaussian_rnm_outcomes(pool, cfg, 5, np.random.default_rng(seed), 0.1)
    g = np.random.default_rng(seed)
    expect = []
    for p in range(3):
        c = int(pool.counts[p])
        cp, tp = np.clip(pool.proxy[p, :c], 0, 1), pool.true[p, :c]
        idx = g.permuted(np.broadcast_to(np.arange(c), (4, c)), axis=1)[:, :5]
        noise = [g.standard_normal(idx.shape) for _ in range(6)]
        val = 0.0
        for r in range(4):
            for z in noise:
                val += tp[idx[r, int(np.argmax(cp[idx[r]] + 0.1 * z[r]))]]
        expect.append(val / 24 - tp.mean())
    np.testing.assert_allclose(lifts, expect, rtol=0, atol=1e-12)
