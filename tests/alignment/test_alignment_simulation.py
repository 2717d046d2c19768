"""The vectorized protocol engine vs a straightforward per-replicate loop, scaling behaviour on synthetic
pools, theory helpers and outputs."""

import json
import math

import numpy as np
import pytest
from scipy import special

from privalign.alignment.laws import privitp_law, sequential_law
from privalign.alignment.normalizer import solve_normalizer
from privalign.alignment.simulation import MethodSpec, plot_results, run_protocol, write_results
from privalign.alignment.synthetic import make_synthetic_pool
from privalign.alignment.theory import (
    best_policy_coverage,
    coverage,
    epsilon_star,
    estimate_theory,
    reward_model_error,
    sigma_reg,
)
from privalign.errors import PrivacyParameterError

SPECS = [
    MethodSpec("bon"),
    MethodSpec("itp", beta=0.05),
    MethodSpec("privbon", epsilon=8.0),
    MethodSpec("privitp", beta=0.05, sigma_x=0.2, sigma_z=0.2),
]


def _loop_reference(pool, n, replicates, seed):
    """Per-replicate loop with independent draws and the single-prompt exact laws."""
    rng = np.random.default_rng(seed)
    out = {k: [] for k in range(4)}
    for p in range(pool.proxy.shape[0]):
        r, t = pool.proxy[p], pool.true[p]
        vals = np.zeros((4, replicates))
        for j in range(replicates):
            perm = rng.permutation(r.size)
            A, B = perm[:n], perm[n : 2 * n]
            vals[0, j] = t[A][np.argmax(r[A])]
            vals[2, j] = special.softmax(r[A] / (2 / 8.0)) @ t[A]
            lam = solve_normalizer(r[A], 0.05)
            pr, fb = sequential_law(np.clip((r[B] - lam) / (1 - lam), 0, 1))
            vals[1, j] = pr @ t[B] + fb * t.mean()
            pr, fb, _ = privitp_law(r[A], r[B], beta=0.05, r_max=1.0, sigma_x=0.2, sigma_z=0.2, L=3.0)
            vals[3, j] = pr @ t[B] + fb * t.mean()
        for k in range(4):
            out[k].append(vals[k].mean() - t.mean())
    return {k: (np.mean(v), np.std(v, ddof=1) / math.sqrt(len(v))) for k, v in out.items()}


@pytest.mark.statistical
def test_vectorized_engine_agrees_with_loop():
    """Both are unbiased estimates of the same expected lift; the difference must be within
    z·sqrt(se_v² + se_l²) with z = norm.isf(1e-3/8) (two-sided, Bonferroni over 4 methods, α = 1e-3)."""
    from scipy.stats import norm

    pool = make_synthetic_pool(24, 64, random_state=5)
    res = run_protocol(pool, SPECS, n_grid=[8], replicates=30, random_state=7, progress=False)
    ref = _loop_reference(pool, 8, 30, 11)
    z = norm.isf(1e-3 / 8)
    for k, m in enumerate(res["methods"]):
        lv, sv = m["true_lift"][0], m["true_lift_se"][0]
        ll, sl = ref[k]
        assert abs(lv - ll) <= z * math.hypot(sv, sl), (m["name"], lv, ll)


def test_bon_degrades_others_do_not():
    pool = make_synthetic_pool(40, 1024, hack_rate=0.004, random_state=0)
    specs = [
        MethodSpec("bon"),
        MethodSpec("itp", beta=0.1),
        MethodSpec("privbon", epsilon=4.0),
        MethodSpec("privitp", beta=0.1, sigma_x=0.2, sigma_z=0.2),
    ]
    res = run_protocol(
        pool, specs, n_grid=[2**k for k in range(10)], replicates=8, random_state=0, progress=False
    )
    lift = {m["spec"]["kind"]: np.array(m["true_lift"]) for m in res["methods"]}
    se = {m["spec"]["kind"]: np.array(m["true_lift_se"]) for m in res["methods"]}
    # BoN: past its peak it falls by many standard errors
    k = int(np.argmax(lift["bon"]))
    assert k < 9 and lift["bon"][k] - lift["bon"][-1] > 4 * math.hypot(se["bon"][k], se["bon"][-1])
    for kind in ("itp", "privbon", "privitp"):
        best_before = lift[kind][:-1].max()
        assert lift[kind][-1] >= best_before - 3 * se[kind][-1] - 0.01, kind  # no such drop


def test_outputs_and_privacy_report(tmp_path):
    pool = make_synthetic_pool(6, 64, random_state=1)
    res = run_protocol(pool, SPECS, n_grid=[1, 2, 4], replicates=4, random_state=3, progress=False)
    path = write_results(res, tmp_path)
    data = json.loads(path.read_text())
    assert data["config"]["seed_entropy"] == "3"
    pv = data["methods"][3]["privacy"]
    assert len(pv["epsilon_max"]) == 3 and pv["epsilon1"] > 0 and pv["delta"] == 1e-6
    assert data["methods"][2]["privacy"]["epsilon"] == 8.0
    assert all(e2 <= em for e2, em in zip(pv["expected_epsilon2_realized"], pv["epsilon_max"]))
    figs = plot_results(res, tmp_path)
    assert all(f.stat().st_size > 5000 for f in figs)


def test_short_pools_error_or_skip():
    pool = make_synthetic_pool(4, 30, random_state=0)
    with pytest.raises(PrivacyParameterError, match="fewer candidates"):
        run_protocol(pool, SPECS, n_grid=[16], replicates=2, progress=False)
    res = run_protocol(pool, [MethodSpec("bon")], n_grid=[16], replicates=2, progress=False)
    assert res["n_prompts"] == 4
    with pytest.raises(PrivacyParameterError, match="No prompt"):
        run_protocol(pool, SPECS, n_grid=[16], replicates=2, progress=False, skip_short=True)


def test_theory_helpers():
    assert epsilon_star(1.0, 4.0, 0.5) == pytest.approx(8.0)
    # 2Δ/ε ≤ σ_reg ⇔ ε ≥ ε*
    c, e = 3.0, 0.2
    es = epsilon_star(1.0, c, e)
    for eps in (0.5 * es, 2 * es):
        assert (2.0 / eps <= sigma_reg(c, e)) == (eps >= es)
    # C = 1 + 2χ² with χ²(p‖q) = ½ E_q[(p/q − 1)²]
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.full(4, 0.25)
    chi2 = 0.5 * np.sum(q * (p / q - 1) ** 2)
    assert coverage(p)[0] == pytest.approx(1 + 2 * chi2)
    assert list(best_policy_coverage([[1, 0, 1, 0], [0, 0, 0, 1]])) == [2.0, 4.0]
    assert reward_model_error([[0.5, 0.5]], [[1.0, 0.0]])[0] == pytest.approx(0.5)
    est = estimate_theory(np.full((2, 4), 0.5), np.array([[1, 0, 0, 0], [1, 1, 0, 0.0]]), sensitivity=1.0)
    assert est["coverage"] == pytest.approx(3.0) and est["epsilon_star"] == pytest.approx(
        2 * math.sqrt(3) / 0.5
    )


def test_engine_matches_single_prompt_law(rng):
    """The engine's nested scan + fixed-node quadrature reproduces the single-prompt exact law (orders 8/16
    on fine panels) for every N, to 1e-6."""
    from privalign.accounting.expost import ell1, ell2
    from privalign.alignment.laws import privitp_acceptance
    from privalign.alignment.simulation import _Draw, _privitp_nested, _privitp_nodes

    c, grid = 64, [1, 2, 8, 32]
    cp, tp = rng.uniform(0, 1, c), (rng.random(c) < 0.4).astype(float)
    spec = MethodSpec("privitp", beta=0.05, sigma_x=0.1, sigma_z=0.1)
    nodes, pw = _privitp_nodes(spec, 1.0, None, 6)
    w = 1.0 + 0.3 - nodes
    pre = (
        nodes,
        w,
        pw,
        ell1(nodes, width=w, r_max=1, sensitivity=1, sigma_z=0.1),
        ell2(nodes, width=w, r_max=1, sensitivity=1, sigma_z=0.1),
        6,
    )
    acc = privitp_acceptance(cp[:, None], nodes[None, :], w[None, :], 0.1)
    perm = np.stack([rng.permutation(c) for _ in range(3)])
    draw = _Draw.make(cp, tp, cp, perm, 32, two_pools=False)
    et, _, _ = _privitp_nested(spec, pre, 1.0 - acc, draw, grid, 1.0, 10**6)
    for j in range(3):
        for g, n in enumerate(grid):
            a_idx, b_idx = perm[j, :n], perm[j, 32 : 32 + n]
            p, fb, err = privitp_law(
                cp[a_idx], cp[b_idx], beta=0.05, r_max=1.0, sigma_x=0.1, sigma_z=0.1, L=3.0
            )
            assert et[j, g] == pytest.approx(p @ tp[b_idx] + fb * tp.mean(), abs=1e-6)


def test_simulate_prepares_the_scores_once_and_reports_the_clipped_fraction(tmp_path, monkeypatch):
    """``privalign simulate`` prepared the scores twice (once in the CLI only to count the clipped ones);
    the library call ``simulate`` prepares them once and reports the clipped fraction."""
    import privalign.alignment.simulation as sim
    from privalign.cli import main

    calls = []
    real = sim.prepare_scores
    monkeypatch.setattr(sim, "prepare_scores", lambda *a, **k: calls.append(1) or real(*a, **k))
    argv = ["simulate", "--synthetic", "3,16", "--methods", "bon", "--replicates", "2", "--no-progress"]
    assert main([*argv, "--score-range", "-1,1", "--out", str(tmp_path / "o")]) == 0
    assert len(calls) == 1
    pool = make_synthetic_pool(3, 16, random_state=0)
    rep = sim.simulate(
        pool, [MethodSpec("bon")], n_grid=[1, 4], replicates=2, transform="global_z", score_range=(-1, 1),
        progress=False, out=tmp_path / "lib",
    )  # fmt: skip
    z = (pool.proxy - pool.proxy.mean()) / pool.proxy.std()
    assert rep.clipped_scores == int(np.sum(np.abs(z) > 1)) > 0
    assert rep.clipped_fraction == pytest.approx(rep.clipped_scores / z.size)
    assert rep.results_path is not None and rep.results_path.exists() and len(rep.figures) == 2
    assert rep.summary()["clipped_fraction"] == rep.clipped_fraction


def test_a_selector_without_a_vectorised_kernel_is_evaluated_through_its_exact_law(monkeypatch):
    """A registered method runs through the engine's generic kernel (its ``law`` per replicate, the fallback
    credited with the base mean): for the built-in selectors it gives what their vectorised kernels give."""
    import privalign.alignment.simulation as sim

    pool = make_synthetic_pool(3, 64, random_state=5)
    specs = [
        MethodSpec("bon"),
        MethodSpec("itp", beta=0.05),
        MethodSpec("privbon", epsilon=4.0),
        MethodSpec("privitp", beta=0.05, sigma_x=0.3, sigma_z=0.2),
    ]
    kw = dict(n_grid=[1, 4, 16], replicates=3, random_state=7, progress=False)
    fast = run_protocol(pool, specs, **kw)
    monkeypatch.setattr(sim, "_KERNELS", {})
    slow = run_protocol(pool, specs, **kw)
    for a, b in zip(fast["methods"], slow["methods"], strict=True):
        # PrivITP's engine integrates λ̃ by quadrature (≈ 4e-7, see test_engine_matches_single_prompt_law)
        assert np.allclose(a["true_value"], b["true_value"], atol=1e-6, rtol=0), a["name"]
        assert np.allclose(a["proxy"], b["proxy"], atol=1e-6, rtol=0), a["name"]
