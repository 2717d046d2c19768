"""Every verdict rule of the claims table on constructed results: each rule must be able to return
"holds", "does not hold" and "inconclusive" (where all three make sense), from the numbers alone.

The constructed records have the fields the experiments write (per-prompt lifts ``lift_pp`` and the
``prompts`` they belong to, so the paired tests run as they do on real runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privalign.experiments import verdicts as V
from privalign.experiments.report import evaluate_claims
from privalign.stats import paired_tost, t_crit

P = 40  # prompts
NS = [1, 4, 16, 64, 256, 1024]
SYN = "synthetic (planted reward hacking)"
REAL = "real: imdb-smollm2.jsonl.gz"


def _rec(method, variant, n, pp, *, pool=SYN, **extra):
    pp = np.asarray(pp, float)
    return {
        "method": method,
        "variant": variant,
        "N": n,
        "n_prompts": pp.size,
        "lift": float(pp.mean()),
        "lift_se": float(pp.std(ddof=1) / math.sqrt(pp.size)),
        "lift_pp": pp.tolist(),
        "prompts": list(range(pp.size)),
        "pool_label": pool,
        **extra,
    }


def _curve(method, means, *, noise=1.0, seed=0, pool=SYN, variant=None, prompt_sd=5.0, **extra):
    """Per-prompt lifts = mean(N) + a prompt effect shared across N + independent noise."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(0, prompt_sd, P)
    return [
        _rec(method, variant or method, n, m + effect + rng.normal(0, noise, P), pool=pool, **extra)
        for n, m in zip(NS, means)
    ]


BON_DEGRADES = [0, 30, 55, 58, 40, 5]
BON_RISES = [0, 30, 45, 50, 52, 53]


# --- statistics ------------------------------------------------------------------------------------


def test_paired_diff_matches_prompts_and_cancels_prompt_effects():
    a = {"lift_pp": [1.0, 10.0, 100.0], "prompts": [0, 1, 2]}
    b = {"lift_pp": [101.0, 2.0, 11.0], "prompts": [2, 0, 1]}  # same prompts, other order, +1 each
    d = V.paired_diff(a, b)
    assert d["mean"] == pytest.approx(1.0) and d["se"] == pytest.approx(0.0) and d["n"] == 3
    assert V.paired_diff(a, {"lift_pp": [1.0], "prompts": [0]}) is None


def test_exact_critical_values_and_mcnemar():
    assert t_crit(10) == pytest.approx(1.812461, abs=1e-6)  # t_{0.95, 10}
    assert t_crit(10, k=5) == pytest.approx(2.763769, abs=1e-6)  # t_{0.99, 10}
    # P(X >= 9), X ~ Bin(10, 1/2) = 11/1024
    assert V.mcnemar_exact(9, 1) == pytest.approx(11 / 1024)
    assert V.mcnemar_exact(0, 0) == 1.0


# --- P1-1 ----------------------------------------------------------------------------------------


def test_p1_1_three_outcomes():
    assert V.p1_1_rule(_curve("BoN", BON_DEGRADES))[0] == "holds"
    v, m = V.p1_1_rule(_curve("BoN", BON_RISES, pool=REAL))
    assert v == "inconclusive" and "inconclusive on this pool" in m and "real" in m
    # planted hacks reachable (1024 × 0.01 ≈ 10 per pool) and BoN still rises, tightly: does not hold
    v, m = V.p1_1_rule(_curve("BoN", BON_RISES, noise=0.2), planted_hack_rate=0.01)
    assert v == "does not hold" and "planted" in m
    # the same numbers on a real pool: never "does not hold"
    assert V.p1_1_rule(_curve("BoN", BON_RISES, noise=0.2, pool=REAL))[0] == "inconclusive"
    v, m = V.p1_1_rule(_curve("BoN", BON_DEGRADES)[:3])
    assert v == "inconclusive" and "N too small" in m


def test_p1_1_does_not_hold_through_the_report_reads_the_hack_rate_from_the_manifest():
    rises = _curve("BoN", BON_RISES, noise=0.2)
    runs = {"p1-scaling": {"manifest": {"status": "complete", "config": {"syn_hack_rate": 0.01}}}}
    c = {c["id"]: c for c in evaluate_claims({"p1-scaling": rises}, runs)}["P1-1"]
    assert c["verdict"] == "does not hold" and "N_max·hack_rate = 10.2" in c["measured"]
    # without the manifest the hack rate is unknown: never "does not hold"
    assert {c["id"]: c for c in evaluate_claims({"p1-scaling": rises})}["P1-1"]["verdict"] == "inconclusive"


# --- P1-2..P1-4 ----------------------------------------------------------------------------------


def test_monotone_three_outcomes_and_positive_control():
    ctrl = _curve("BoN", BON_DEGRADES)
    flat = _curve("PrivBoN", [0, 10, 20, 25, 25, 25], seed=1)
    falls = _curve("PrivBoN", [0, 10, 20, 25, 15, 5], seed=1)
    noisy = _curve("PrivBoN", [0, 10, 20, 25, 23, 21], noise=60.0, seed=1)
    assert V.monotone_rule(ctrl + flat, "PrivBoN")[0] == "holds"
    assert V.monotone_rule(ctrl + falls, "PrivBoN")[0] == "does not hold"
    v, m = V.monotone_rule(ctrl + noisy, "PrivBoN")
    assert v == "inconclusive"
    # no positive control: the same flat curve is inconclusive
    v, m = V.monotone_rule(_curve("BoN", BON_RISES) + flat, "PrivBoN")
    assert v == "inconclusive" and "no over-optimisation on this pool" in m
    v, m = V.monotone_rule(ctrl[:3] + flat[:3], "PrivBoN")
    assert v == "inconclusive" and "N too small" in m
    # a curve with no lift at all cannot be called monotone
    v, m = V.monotone_rule(ctrl + _curve("PrivBoN", [0] * 6, noise=0.5, prompt_sd=0.5, seed=3), "PrivBoN")
    assert v == "inconclusive" and "vacuous" in m


def test_p1_3_judges_the_fixed_sigma_curve_through_the_report():
    ctrl = _curve("BoN", BON_DEGRADES)
    priv = dict(epsilon_max=2.0, expected_epsilon_realized=0.7, delta=1e-5)
    flat = _curve("PrivITP-fixed", [0, 10, 20, 25, 25, 25], seed=1, **priv)
    falls = _curve("PrivITP-fixed", [0, 10, 20, 25, 15, 5], seed=1, **priv)
    noisy = _curve("PrivITP-fixed", [0, 10, 20, 25, 23, 21], noise=60.0, seed=1, **priv)
    rematched = _curve("PrivITP", [0, 10, 20, 25, 15, 5], seed=2)  # falls: reported for contrast only

    def p1_3(recs):
        c = {c["id"]: c for c in evaluate_claims({"p1-scaling": recs})}["P1-3"]
        return c["verdict"], c["measured"]

    v, m = p1_3(ctrl + flat + rematched)
    assert v == "holds" and "ε_max=2" in m and "for contrast, PrivITP re-matched" in m
    assert m.endswith(": does not hold")
    assert p1_3(ctrl + falls + rematched)[0] == "does not hold"
    assert p1_3(ctrl + noisy + rematched)[0] == "inconclusive"


# --- P1-5 ----------------------------------------------------------------------------------------


def _sweep(gap, *, noise=0.5, match="worst", seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in (16, 256):
        base = rng.normal(0, 5, P)
        out.append(_rec("BoN", "BoN", n, 50 + base, epsilon=None))
        for e in (1.0, 10.0):
            pb = 3 * e + base + rng.normal(0, 0.5, P)
            out.append(_rec("PrivBoN", "PrivBoN", n, pb, epsilon=e))
            out.append(
                _rec(
                    "PrivITP",
                    f"PrivITP [{match}]",
                    n,
                    pb + gap + rng.normal(0, noise, P),
                    epsilon=e,
                    privacy_match=match,
                    epsilon_max=e,
                    expected_epsilon_realized=0.5 * e,
                    delta=1e-5,
                )
            )
    return out


def test_p1_5_three_outcomes_at_equal_privacy():
    assert V.p1_5_rule(_sweep(+1.0))[0] == "holds"
    v, m = V.p1_5_rule(_sweep(-10.0))
    assert v == "does not hold" and "ε_max=" in m and "E[ε]=" in m and "equal privacy" in m
    assert V.p1_5_rule(_sweep(-1.0, noise=40.0))[0] == "inconclusive"
    v, m = V.p1_5_rule(_sweep(+1.0, match="sigma"))
    assert v == "inconclusive" and "not at equal privacy" in m


# --- P1-6 ----------------------------------------------------------------------------------------


def _budget(served, t_basic, lifts, *, over=False):
    return [
        {
            "method": "PrivITP",
            "accounting": "ex-post filter",
            "sigma": 0.5,
            "seed_index": k,
            "served": served,
            "t_basic": t_basic,
            "budget_epsilon": 50.0,
            "spent_epsilon": 51.0 if over else 49.0,
            "served_lifts": lifts,
        }
        for k in range(3)
    ]


def test_p1_6_three_outcomes():
    rng = np.random.default_rng(0)
    good = (0.3 + rng.normal(0, 0.1, 20)).tolist()
    zero = rng.normal(0, 0.3, 20).tolist()
    assert V.p1_6_rule(_budget(20, 5, good))[0] == "holds"
    assert V.p1_6_rule(_budget(5, 5, good))[0] == "does not hold"
    assert V.p1_6_rule(_budget(20, 5, good, over=True))[0] == "does not hold"
    v, m = V.p1_6_rule(_budget(20, 5, zero))
    assert v == "inconclusive" and "no σ" in m.replace("at no σ", "no σ")


# --- P1-7 ----------------------------------------------------------------------------------------


def _epsstar(excess_above, control, *, grid=(1.0, 2.0, 10.0, 20.0, 40.0), noise=0.01):
    rng = np.random.default_rng(0)
    j = rng.uniform(0.5, 1.0, P)  # per-prompt regret of the best σ
    out = []
    for e in grid:
        for variant in ("plain", "sigma_reg"):
            if e >= 10.0:
                add = excess_above if variant == "sigma_reg" else 0.3
            else:
                add = control
            pp = j + add + rng.normal(0, noise, P)
            out.append(
                {
                    "variant": variant,
                    "label": variant,
                    "epsilon": e,
                    "regret": float(pp.mean()),
                    "regret_se": float(pp.std(ddof=1) / math.sqrt(P)),
                    "regret_pp": pp.tolist(),
                    "prompts": list(range(P)),
                    "eps_star": 10.0,
                    "sigma_reg": 0.2,
                    "n_prompts": P,
                    "sigma_reg_source": "calibration prompts",
                }
            )
    pp = j + rng.normal(0, noise, P)
    out.append(
        {
            "variant": "plain",
            "label": "best",
            "epsilon": 15.0,
            "regret": float(pp.mean()),
            "regret_se": float(pp.std(ddof=1) / math.sqrt(P)),
            "regret_pp": pp.tolist(),
            "prompts": list(range(P)),
            "eps_star": 10.0,
            "sigma_reg": 0.2,
            "n_prompts": P,
        }
    )
    return out


def test_p1_7_three_outcomes():
    assert V.p1_7_rule(_epsstar(0.0, 0.3))[0] == "holds"
    assert V.p1_7_rule(_epsstar(0.2, 0.3))[0] == "does not hold"
    v, m = V.p1_7_rule(_epsstar(0.0, 0.0))
    assert v == "inconclusive" and "control failed" in m
    v, m = V.p1_7_rule(_epsstar(0.0, 0.3, grid=(10.0, 20.0)))
    assert v == "inconclusive" and "bracket" in m


# --- P1-8 ----------------------------------------------------------------------------------------


def _fixed(eps_max, exp_eps, *, noise=0.001):
    rng = np.random.default_rng(0)
    out = []
    for n, em, ee in zip(NS, eps_max, exp_eps):
        pp = ee + rng.normal(0, noise, P)
        out.append(
            {
                "method": "PrivITP-fixed",
                "variant": "PrivITP fixed",
                "N": n,
                "epsilon_max": em,
                "expected_epsilon_realized": float(pp.mean()),
                "expected_epsilon_pp": pp.tolist(),
                "prompts": list(range(P)),
            }
        )
    return out


def test_p1_8_three_outcomes():
    grows = [1, 1.2, 2, 4, 10, 30]
    assert V.p1_8_rule(_fixed(grows, [0.5] * 6))[0] == "holds"
    assert V.p1_8_rule(_fixed(grows, [0.8 * g for g in grows]))[0] == "does not hold"
    v, m = V.p1_8_rule(_fixed([1.0] * 6, [0.5] * 6))
    assert v == "inconclusive" and "hardly grows" in m
    assert V.p1_8_rule(_fixed(grows, [0.5, 0.5, 0.5, 0.5, 4, 8]))[0] == "inconclusive"


# --- P2-1..P2-3 ----------------------------------------------------------------------------------


def _regime(ok=True):
    return [{"value": v, "mean_error": 1.0 if ok else 6.0, "zero_error": 9.0} for v in (1e3, 1e4, 1e5)]


def test_slope_rule_three_outcomes_and_learning_regime():
    fit = lambda s, hw: {
        "slope": s,
        "slope_lo": s - hw,
        "slope_hi": s + hw,
        "points": 20,
        "values": 4,
        "decades": 2.0,
    }
    assert V.slope_rule(fit(-1.0, 0.2), low=-2.5, high=-0.5, regime=_regime(), what="x")[0] == "holds"
    assert V.slope_rule(fit(0.2, 0.2), low=-2.5, high=-0.5, regime=_regime(), what="x")[0] == "does not hold"
    # the old rule held on the point estimate; a CI covering the boundary is inconclusive
    assert V.slope_rule(fit(-1.0, 1.5), low=-2.5, high=-0.5, regime=_regime(), what="x")[0] == "inconclusive"
    v, m = V.slope_rule(fit(-1.0, 0.2), low=-2.5, high=-0.5, regime=_regime(ok=False), what="x")
    assert v == "inconclusive" and "learning regime" in m
    assert V.slope_rule(None, low=0, high=1, regime=None, what="x")[0] == "inconclusive"


def _rates(sweep, method, values, slope, *, noise=0.01, reps=3, zero_factor=10.0):
    """p2-rates records: log error = slope · log value + noise; ‖θ*‖² = zero_factor × the largest error."""
    rng = np.random.default_rng(0)
    errs = [(v, math.exp(slope * math.log(v) + rng.normal(0, noise))) for v in values for _ in range(reps)]
    zero = zero_factor * max(e for _, e in errs)
    return [
        {"sweep": sweep, "method": method, "value": v, "error": e, "zero_error": zero, "replicate": k % reps}
        for k, (v, e) in enumerate(errs)
    ]


# claim, sweep, method, values, slope inside the admissible range, outside it, on its upper boundary
RATE_CLAIMS = [
    ("P2-1", "n", "SampleDPIHT", (1e3, 3e3, 1e4, 3e4), -1.5, 0.0, -0.8),
    ("P2-2", "s", "RRIHT", (2, 4, 8, 16), 1.0, 2.5, 1.5),
    ("P2-3", "d", "RRIHT", (1e2, 1e3, 1e4, 1e5), 0.0, 1.0, 0.35),
]


@pytest.mark.parametrize("cid, sweep, method, values, inside, outside, edge", RATE_CLAIMS)
def test_rate_claims_three_outcomes_through_the_report(cid, sweep, method, values, inside, outside, edge):
    """P2-1..P2-3 with each claim's own sweep, method and admissible range."""

    def claim(recs):
        c = {c["id"]: c for c in evaluate_claims({"p2-rates": recs})}[cid]
        fitted = float(c["measured"].split(": slope ")[1].split(" ")[0])
        return c["verdict"], c["measured"], fitted

    v, m, fitted = claim(_rates(sweep, method, values, inside))
    assert v == "holds" and fitted == pytest.approx(inside, abs=0.02)
    v, m, fitted = claim(_rates(sweep, method, values, outside))
    assert v == "does not hold" and fitted == pytest.approx(outside, abs=0.02)
    v, m, fitted = claim(_rates(sweep, method, values, edge, noise=0.05))
    assert v == "inconclusive" and "boundary" in m and fitted == pytest.approx(edge, abs=0.1)
    # inside the range, but the errors are no better than θ̂ = 0: not the rate's slope
    v, m, _ = claim(_rates(sweep, method, values, inside, zero_factor=1.5))
    assert v == "inconclusive" and "not in the learning regime" in m


def test_p2_1_window_is_the_theory_range_and_rejects_the_quick_runs_wide_interval():
    """Issue 27: the quick run's CI [−2.47, −0.74] "held" under the old window [−2.5, −0.5]; the window is now
    [−2.2, −0.8] (slopes −1 to −2 of the rate, ± 0.2), under which that CI is inconclusive, a CI inside it
    holds and one beyond it (a slope of −2.5, faster than the privacy term allows) does not hold."""
    from privalign.experiments.report import CLAIMS, P2_1_WINDOW

    low, high = P2_1_WINDOW
    assert (low, high) == (-2.2, -0.8)
    assert "[-2.2, -0.8]" in {c.id: c for c in CLAIMS}["P2-1"].rule
    ci = lambda lo, hi: {"slope": (lo + hi) / 2, "slope_lo": lo, "slope_hi": hi, "points": 20, "values": 4}
    quick = ci(-2.47, -0.74)
    assert (
        V.slope_rule(quick, low=-2.5, high=-0.5, regime=_regime(), what="x")[0] == "holds"
    )  # the old window
    v, m = V.slope_rule(quick, low=low, high=high, regime=_regime(), what="x")
    assert v == "inconclusive" and "boundary" in m
    assert V.slope_rule(ci(-1.6, -1.0), low=low, high=high, regime=_regime(), what="x")[0] == "holds"
    assert V.slope_rule(ci(-2.7, -2.3), low=low, high=high, regime=_regime(), what="x")[0] == "does not hold"
    assert V.slope_rule(ci(-0.7, -0.4), low=low, high=high, regime=_regime(), what="x")[0] == "does not hold"


# --- P2-4 ----------------------------------------------------------------------------------------


def _cmp(b, c, eps=(2.0, 8.0)):
    return [
        {
            "dataset": "imdb",
            "epsilon": e,
            "sparse": "RRIHT",
            "dense": "DenseRR",
            "b": b,
            "c": c,
            "n_test": 400,
            "acc_sparse": 0.7,
            "acc_dense": 0.6,
        }
        for e in eps
    ]


def test_mcnemar_rule_three_outcomes():
    assert V.mcnemar_rule(_cmp(60, 10))[0] == "holds"
    assert V.mcnemar_rule(_cmp(10, 60))[0] == "does not hold"
    assert V.mcnemar_rule(_cmp(22, 18))[0] == "inconclusive"
    v, m = V.mcnemar_rule(_cmp(60, 10, eps=(8.0,)))
    assert v == "inconclusive" and "MISSING ε = [2.0]" in m


def _accuracy(b, c, *, second=None, n=200, eps=(2.0, 8.0), correct=True):
    """p2-accuracy records for both (sparse, dense) pairs: ``b`` test pairs only the sparse method gets right,
    ``c`` only the dense one, the rest right for both; ``second`` = (b, c) of the Sample-DP IHT / DP-SGD
    pair when it differs."""

    def outcomes(b, c):
        rest = n - b - c
        return {"sparse": "1" * b + "0" * c + "1" * rest, "dense": "0" * b + "1" * c + "1" * rest}

    first, other = outcomes(b, c), outcomes(*(second or (b, c)))
    return [
        {
            "kind": "accuracy",
            "dataset": "imdb",
            "method": m,
            "epsilon": e,
            "accuracy": o[side].count("1") / n,
            **({"correct": o[side]} if correct else {}),
        }
        for e in eps
        for m, side, o in (
            ("RRIHT", "sparse", first),
            ("DenseRR", "dense", first),
            ("SampleDPIHT", "sparse", other),
            ("DPSGDLinear", "dense", other),
        )
    ]


def _replicated(per_seed, *, n=400, eps=(2.0, 8.0), variant="tuned", second=None, correct=True):
    """Replicated p2-accuracy records: fit seed r has ``per_seed[r] = (b, c)``: b test pairs only the sparse
    method gets right, c only the dense one, the rest right for both; for both compared pairs (``second``:
    the Sample-DP IHT / DP-SGD seeds when they differ)."""

    def outcomes(b, c):
        rest = n - b - c
        return {"sparse": "1" * b + "0" * c + "1" * rest, "dense": "0" * b + "1" * c + "1" * rest}

    out = []
    for e in eps:
        for ms, md, seeds in (
            ("RRIHT", "DenseRR", per_seed),
            ("SampleDPIHT", "DPSGDLinear", second or per_seed),
        ):
            for rep, (b, c) in enumerate(seeds):
                o = outcomes(b, c)
                for m, side in ((ms, "sparse"), (md, "dense")):
                    out.append(
                        {
                            "kind": "accuracy",
                            "dataset": "imdb",
                            "method": m,
                            "epsilon": e,
                            "variant": variant,
                            "rep": rep,
                            "accuracy": o[side].count("1") / n,
                            **({"correct": o[side]} if correct else {}),
                        }
                    )
    return out


def _p2_4(recs):
    c = {c["id"]: c for c in evaluate_claims({"p2-accuracy": recs})}["P2-4"]
    return c["verdict"], c["measured"]


WIN = [(60, 10), (58, 12), (62, 9), (59, 11), (61, 10)]
LOSS = [(c, b) for b, c in WIN]


def test_seed_paired_diff_exact_values():
    # 2 seeds × 4 pairs; differences per seed (1,0,0,0) and (1,1,0,-1): d_r = 0.25, 0.25
    a = np.array([[1, 1, 0, 1], [1, 1, 0, 0]])
    b = np.array([[0, 1, 0, 1], [0, 0, 0, 1]])
    r = V.seed_paired_diff(a, b)
    assert r["mean"] == pytest.approx(0.25) and r["R"] == 2 and r["n"] == 4
    assert r["se_seed"] == pytest.approx(0.0)  # both seeds differ by 0.25: no between-seed spread
    D = np.array([1.0, 0.5, 0.0, -0.5])  # seed-averaged per-pair differences
    assert r["se_pair"] == pytest.approx(math.sqrt(D.var(ddof=1) / 4))
    assert r["df"] == pytest.approx(3.0)  # Welch–Satterthwaite with the seed part 0: the pairs' n − 1
    # the seed part is the variance of the per-seed differences over R
    a2 = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]])
    b2 = np.zeros((3, 4))
    r2 = V.seed_paired_diff(a2, b2)
    assert r2["se_seed"] == pytest.approx(math.sqrt(np.var([1.0, 0.0, 0.5], ddof=1) / 3))
    assert r2["se"] == pytest.approx(math.hypot(r2["se_seed"], r2["se_pair"]))
    assert V.seed_paired_diff(a[:1], b[:1])["se"] is None  # one seed: the DP-noise variance is unmeasured


def test_p2_4_replicated_three_outcomes_through_the_report():
    v, m = _p2_4(_replicated(WIN))
    assert v == "holds" and "Bonferroni over 4: sparse significantly better in 4, dense in 0" in m
    assert "5 seeds" in m and "MDD" in m and "α=0.05" in m
    v, m = _p2_4(_replicated(LOSS))
    assert v == "does not hold" and "dense in 4" in m
    # a powered tie: equivalent within ±0.03 → does not hold
    v, m = _p2_4(_replicated([(30, 30)] * 5, n=2000))
    assert v == "does not hold" and "equivalent within ±0.03 accuracy (TOST, α=0.05/4) in 4" in m
    # RR-IHT wins, Sample-DP IHT does not: not every sparse method beats its dense one
    noisy = [(22, 18), (18, 22), (25, 15), (15, 25), (20, 20)]
    v, m = _p2_4(_replicated(WIN, second=noisy))
    assert v == "inconclusive" and "sparse significantly better in 2, dense in 0" in m
    v, m = _p2_4(_replicated(WIN, eps=(8.0,)))
    assert v == "inconclusive" and "MISSING ε = [2.0]" in m
    v, m = _p2_4(_replicated(WIN, correct=False))
    assert v == "inconclusive" and "lack per-pair outcomes" in m


def test_p2_4_one_noise_draw_is_not_a_result():
    """Issue 27: the single-fit rule called a one-seed sparse win significant (IMDb ε = 4, 117 / 71
    discordant of 462, McNemar p = 0.0005). Unreplicated comparisons are now inconclusive, and a win of one
    seed that the other seeds do not repeat is absorbed by the between-seed variance."""
    one = _replicated([(117, 71)], n=462)
    for r in one:  # records from before replication: no variant, no rep
        r.pop("variant"), r.pop("rep")
        r["tuned_params"] = {"sparsity": 4}
    assert (
        V.mcnemar_rule(
            [
                {
                    "dataset": "imdb",
                    "epsilon": e,
                    "sparse": s,
                    "dense": d,
                    "b": 117,
                    "c": 71,
                    "n_test": 462,
                    "acc_sparse": 0.7,
                    "acc_dense": 0.6,
                }
                for e in (2.0, 8.0)
                for s, d in (("RRIHT", "DenseRR"), ("SampleDPIHT", "DPSGDLinear"))
            ]
        )[0]
        == "holds"
    )  # what the old rule said on these outcomes
    v, m = _p2_4(one)
    assert v == "inconclusive" and "4 unreplicated" in m and "DP-noise variance unmeasured" in m
    # five seeds: the first repeats the artefact, the others do not
    v, m = _p2_4(_replicated([(117, 71), (60, 90), (70, 80), (95, 70), (75, 85)], n=462))
    assert v == "inconclusive" and "sparse significantly better in 0, dense in 0" in m


def test_p2_4_untuned_is_printed_beside_and_does_not_decide():
    recs = _replicated(WIN, variant="tuned") + _replicated(LOSS, variant="untuned")
    v, m = _p2_4(recs)
    assert v == "holds" and m.startswith("tuned (decides)")
    assert "beside it, untuned at the full ε (does not decide): does not hold" in m
    # a run without tuning is decided by its untuned cells
    v, m = _p2_4(_replicated(LOSS, variant="untuned"))
    assert v == "does not hold" and m.startswith("untuned (decides)")


def test_paired_tost_exact_t_quantiles_and_the_motivating_tie():
    # 30 / 30 discordant of 2,000: Δ̂ = 0, SE = √(60/1999/2000); equivalence within ±0.03 at α = 0.05
    t = paired_tost(30, 30, 2000, margin=0.03, alpha=0.05)
    se = math.sqrt(60 / 1999 / 2000)
    assert t["se"] == pytest.approx(se) and t["equivalent"]
    assert t["p"] == pytest.approx(stats_t_sf(0.03 / se, 1999))
    # the powered tie of the real-data run (IMDb ε = 8, RR-IHT vs dense RR, 16 / 18 of 462): equivalent
    # within ±0.03 at α = 0.05 for one comparison, not after Bonferroni over the 12 comparisons of P2-4
    # (TOST p = 0.021)
    tie = paired_tost(16, 18, 462, margin=0.03, alpha=0.05)
    assert tie["equivalent"] and tie["p"] == pytest.approx(0.0214, abs=5e-4)
    assert not paired_tost(16, 18, 462, margin=0.03, alpha=0.05 / 12)["equivalent"]
    assert not paired_tost(60, 10, 400, margin=0.03)["equivalent"]  # a clear difference is not equivalence
    assert paired_tost(0, 0, 100, margin=0.03)[
        "equivalent"
    ]  # identical predictions: SE = 0, |Δ̂| = 0 < margin


def stats_t_sf(x, df):
    from scipy import stats

    return float(stats.t.sf(x, df))


def test_p2_4_equivalence_branch_does_not_hold():
    """Issue 27: a powered tie read "inconclusive". A pair shown equivalent within ±0.03 accuracy (TOST at
    α/k on the seed-averaged difference) makes "sparse beats dense" not hold."""
    v, m = _p2_4(_replicated([(30, 30)] * 5, n=2000))
    assert v == "does not hold" and "EQUIVALENT" in m and "sparse significantly better in 0, dense in 0" in m
    # RR-IHT wins, Sample-DP IHT ties within the margin: not every sparse method beats its dense one
    v, m = _p2_4(_replicated([(300, 10)] * 5, second=[(30, 30)] * 5, n=2000))
    assert v == "does not hold" and "sparse significantly better in 2, dense in 0; equivalent" in m
    # the single-fit rule keeps its own tests: a wider margin turns the 16 / 18 tie of 462 into equivalence
    cmp = [dict(c, b=16, c=18, n_test=462) for c in _cmp(0, 0)] * 6
    assert V.mcnemar_rule(cmp)[0] == "inconclusive"
    assert V.mcnemar_rule(cmp, margin=0.04)[0] == "does not hold"


# --- P2-5 ----------------------------------------------------------------------------------------


def _gap(d, hw, hw_bonf=None, prompts=24):
    hb = hw if hw_bonf is None else hw_bonf
    return {
        "dataset": "imdb",
        "a": "A",
        "b": "B",
        "diff": d,
        "lo": d - hw,
        "hi": d + hw,
        "lo_bonf": d - hb,
        "hi_bonf": d + hb,
        "prompts": prompts,
    }


def test_order_rule_is_symmetric_and_states_the_prompts_needed():
    g = lambda d, hw: [_gap(d, hw)]
    assert V.order_rule(g(0.1, 0.05))[0] == "holds"
    assert V.order_rule(g(-0.1, 0.05))[0] == "does not hold"
    v, m = V.order_rule(g(0.05, 0.15))  # point estimate in the paper's order, but not significant
    assert v == "inconclusive"
    assert "≈ 216" in m  # 24 · (0.15 / 0.05)² prompts for a ±0.05 half-width


def test_order_rule_does_not_hold_only_on_a_bonferroni_significant_reversal():
    """Issue 27: with k gaps, "does not hold" fires on any one, so each reversal is tested at 0.05/k: a gap
    whose 95% interval is below 0 but whose (1 − 0.05/k) interval is not reads "inconclusive" (the old rule
    said "does not hold"); a reversal beyond the Bonferroni interval still does not hold."""
    fine = [_gap(0.1, 0.05, 0.07), _gap(0.1, 0.05, 0.07)]
    v, m = V.order_rule(fine + [_gap(-0.06, 0.05, 0.07)])
    assert v == "inconclusive" and "0 significantly reversed ((1 − 0.05/3) interval, Bonferroni over 3)" in m
    assert V.order_rule(fine + [_gap(-0.1, 0.05, 0.07)])[0] == "does not hold"
    assert V.order_rule(fine + [_gap(0.1, 0.05, 0.07)])[0] == "holds"


def _winrate(values, P=30):
    return [
        {
            "kind": "winrate",
            "dataset": "imdb",
            "method": m,
            "epsilon": 8.0,
            "rep": rep,
            "per_prompt": [v] * P,
            "n_bootstrap": 200,
            "root_seed": 0,
            "judge_selected": v,
            "judge_base": 0.5,
            "unit": "x",
        }
        for m, v in values.items()
        for rep in range(3)
    ]


def test_p2_5_inconclusive_through_the_report_when_a_gap_is_not_resolved():
    """The win-rate wrapper reaches "inconclusive" from the intervals, not only from a missing method."""

    def p2_5(recs):
        c = {c["id"]: c for c in evaluate_claims({"p2-winrate": recs})}["P2-5"]
        return c["verdict"], c["measured"]

    v, m = p2_5(_winrate({"RRIHT": 0.7, "SampleDPIHT": 0.7, "DenseRR": 0.6, "DPSGDLinear": 0.5}))
    assert (
        v == "inconclusive"
        and "2 of 3 adjacent gaps significantly in the paper's direction (95% paired bootstrap), 0 " in m
    )
    v, m = p2_5(_winrate({"RRIHT": 0.8, "SampleDPIHT": 0.7, "DenseRR": 0.6, "DPSGDLinear": 0.5}))
    assert v == "holds" and "3 of 3 adjacent gaps" in m
    v, m = p2_5(_winrate({"RRIHT": 0.6, "SampleDPIHT": 0.7, "DenseRR": 0.6, "DPSGDLinear": 0.5}))
    assert v == "does not hold" and "1 significantly reversed ((1 − 0.05/3) interval, Bonferroni over 3)" in m


# --- P2-6 ----------------------------------------------------------------------------------------


def _policies(shift_rr, shift_dp, *, P=200, sd=0.1):
    """p2-rlhf policy records at ε = 8: per-prompt gold of each sparse policy = the dense one's + a difference
    with mean ``shift`` and standard deviation ``sd`` exactly (so the bootstrap's SE ≈ sd/√P)."""
    rng = np.random.default_rng(3)
    base = rng.uniform(0.2, 0.8, P)
    z = rng.standard_normal(P)
    z = (z - z.mean()) / z.std(ddof=1)

    def rec(method, gold):
        return {
            "kind": "policy",
            "method": method,
            "epsilon": 8.0,
            "per_prompt_gold": list(gold),
            "kl": 1.0,
            "kl_se": 0.01,
            "n_prompts": P,
            "steps": 300,
            "root_seed": 0,
            "n_bootstrap": 4000,
        }

    return [
        rec("RRIHT", base + shift_rr + sd * z),
        rec("DenseRR", base),
        rec("SampleDPIHT", base + shift_dp + sd * z),
        rec("DPSGDLinear", base),
    ]


def test_p2_6_does_not_hold_needs_a_bonferroni_significant_reversal():
    """Issue 27: two (sparse, dense) comparisons, "does not hold" on any one → each at 0.05/2. A reversal of
    2.1 SE (95% interval below 0, 97.5% interval not) was "does not hold" and is now "inconclusive"."""

    def p2_6(recs):
        c = {c["id"]: c for c in evaluate_claims({"p2-rlhf": recs})}["P2-6"]
        return c["verdict"], c["measured"]

    se = 0.1 / math.sqrt(200)
    v, m = p2_6(_policies(0.05, -2.1 * se))
    assert v == "inconclusive" and "97.50% CI (Bonferroni over 2)" in m
    assert p2_6(_policies(0.05, -4.0 * se))[0] == "does not hold"
    assert p2_6(_policies(0.05, 0.05))[0] == "holds"


# --- B-1 and the report wrapper ------------------------------------------------------------------


def _tvi(diffs, *, Q=300, sd=0.2, paired=True):
    """beyond-train-vs-inference records: at each T, DP-RM + BoN's per-query value = PrivBoN's + diffs[T] +
    noise (sd); without ``paired`` the per-query values are left out (the unpaired fallback)."""
    rng = np.random.default_rng(7)
    base = rng.normal(0.5, 0.3, Q)
    out = []
    for t, diff in diffs.items():
        for method, v in (("PrivBoN", base), ("DP reward model + BoN", base + diff + rng.normal(0, sd, Q))):
            out.append(
                {
                    "T": t,
                    "method": method,
                    "value": float(v.mean()),
                    "value_se": float(v.std(ddof=1) / math.sqrt(Q)),
                    **({"value_pq": v.tolist()} if paired else {}),
                }
            )
    return out


def test_b1_three_outcomes_through_the_report_decided_at_the_smallest_informative_t():
    """Issue 27: B-1 was decided at the largest T (10⁴) though it held at T = 1. Now it is decided at the
    smallest T where DP-RM is significantly ahead (paired over the queries, Bonferroni over the T grid)."""

    def b1(recs):
        c = {c["id"]: c for c in evaluate_claims({"beyond-train-vs-inference": recs})}["B-1"]
        return c["verdict"], c["measured"]

    v, m = b1(_tvi({1: 0.1, 10: 0.2, 100: 0.3, 10_000: 0.4}))
    assert v == "holds" and "decided at T=1 (from the grid's first T on)" in m
    assert "Bonferroni over the 4 values of T (paired over the evaluation queries)" in m
    v, m = b1(_tvi({1: -0.1, 10: 0.0, 100: 0.1, 10_000: 0.2}))  # a crossover between T = 10 and 100
    assert v == "holds" and "decided at T=100 (after the crossover)" in m and "T=1: " in m and "(behind)" in m
    v, m = b1(_tvi({1: -0.2, 10: -0.1, 100: -0.1, 10_000: -0.1}))
    assert v == "does not hold" and "PrivBoN significantly ahead at the largest T=10000" in m
    assert b1(_tvi({1: 0.0, 10: 0.005, 100: 0.0, 10_000: 0.005}))[0] == "inconclusive"
    # ahead at T = 10 only, significantly behind later: not "once T is large"
    assert b1(_tvi({1: 0.0, 10: 0.1, 100: -0.1, 10_000: 0.0}))[0] == "inconclusive"
    # the records of older runs (no per-query values): unpaired, normal quantiles
    v, m = b1(_tvi({1: 0.1, 10_000: 0.4}, paired=False))
    assert v == "holds" and "(unpaired)" in m


def test_scaling_claims_combine_synthetic_and_real_runs():
    syn = _curve("BoN", BON_DEGRADES) + _curve("ITP", [0, 10, 20, 25, 25, 25], seed=1)
    real = _curve("BoN", BON_RISES, pool=REAL) + _curve("ITP", [0, 10, 20, 25, 25, 25], seed=1, pool=REAL)
    claims = {c["id"]: c for c in evaluate_claims({"p1-scaling": syn, "p1-scaling-imdb": real})}
    assert claims["P1-1"]["verdict"] == "holds" and "planted" in claims["P1-1"]["measured"]
    assert "p1-scaling-imdb → inconclusive" in claims["P1-1"]["measured"]
    assert claims["P1-4"]["verdict"] == "holds"
    assert claims["P1-5"]["verdict"] == "inconclusive"  # no equal-privacy PrivITP curve in these runs


# --- B-2 -----------------------------------------------------------------------------------------


def _audit(bon_lb, priv_lbs):
    """beyond-membership records: one attack row per service (BoN, PrivBoN at each claimed ε), plus the
    advantage-vs-Q rows the rule must ignore."""
    rows = [{"kind": "attack", "service": "BoN", "epsilon_claimed": None, "eps_lower_bound": bon_lb}]
    rows += [
        {"kind": "attack", "service": "PrivBoN", "epsilon_claimed": e, "eps_lower_bound": lb}
        for e, lb in priv_lbs.items()
    ]
    for r in rows:
        r.update(advantage=0.4, Q_max=10, audit_alpha=0.05, samples=500)
    adv = [
        {"kind": "advantage", "service": r["service"], "epsilon_claimed": r["epsilon_claimed"], "Q": 10}
        for r in rows
    ]
    return rows + adv


def test_b2_three_outcomes_through_the_report():
    def b2(recs):
        c = {c["id"]: c for c in evaluate_claims({"beyond-membership": recs})}["B-2"]
        return c["verdict"], c["measured"]

    v, m = b2(_audit(1.5, {2.0: 0.4, 8.0: 3.0}))
    assert v == "holds" and "PrivBoN ε=8: audit ε ≥ 3.000" in m and "positive control" in m
    # a lower bound exactly at the claimed ε is no violation
    assert b2(_audit(1.5, {2.0: 2.0}))[0] == "holds"
    v, m = b2(_audit(1.5, {2.0: 0.4, 8.0: 8.5}))
    assert v == "does not hold" and "PrivBoN ε=8: audit ε ≥ 8.500" in m
    # the audit cannot see plain BoN's leak: it has no power, whatever it says about PrivBoN
    v, m = b2(_audit(0.0, {2.0: 0.4}))
    assert v == "inconclusive" and "no power" in m and "audit ε ≥ 0.00" in m
    v, m = b2([r for r in _audit(1.5, {2.0: 0.4}) if r["service"] == "PrivBoN"])
    assert v == "inconclusive" and "no power" in m


# --- B-3 (beyond-frontier) -----------------------------------------------------------------------


def _frontier(routes, *, P=300, noise=0.1, seeds=3):
    """beyond-frontier records: ``routes`` maps a route spec to (golds, kls) of its path; per seed, per-prompt
    gold = gold + a prompt effect shared by every route + noise."""
    from privalign.experiments.frontier import parse_route, route_label, route_unit

    base = np.random.default_rng(99).normal(0, noise, size=P)
    out = []
    for j, (route, (golds, kls)) in enumerate(routes.items()):
        r = parse_route(route)
        rng = np.random.default_rng(100 + j)
        for k in range(seeds):
            pts = [
                {
                    "x": i,
                    "kl": kl,
                    "kl_se": 0.0,
                    "per_prompt_gold": (g + base + rng.normal(0, noise, P)).tolist(),
                }
                for i, (g, kl) in enumerate(zip(golds, kls))
            ]
            out.append(
                {
                    "kind": "frontier",
                    **r,
                    "seed_index": k,
                    "label": route_label(route),
                    "guarantee": {"unit": route_unit(r)},
                    "points": pts,
                    "root_seed": 3,
                    "n_bootstrap": 400,
                    "kl_budgets": [0.5, 1.0],
                    "equivalence_margin": 0.02,
                }
            )
    return out


FRONTIER_WINS = {"dpo:label@8": ([0.5, 0.7, 0.8], [0, 0.5, 3.0]), "bon:RRIHT@8": ([0.5, 0.55], [0, 1.5])}
FRONTIER_TIE = {"bon:RRIHT@8": ([0.5, 0.6], [0, 1.0]), "bon:DenseRR@8": ([0.5, 0.6], [0, 1.0])}
FRONTIER_CLOSE = {"bon:RRIHT@8": ([0.5, 0.6], [0, 1.0]), "bon:DenseRR@8": ([0.5, 0.6], [0, 1.0])}


def test_b3_three_outcomes_through_the_report():
    def b3(recs):
        c = {c["id"]: c for c in evaluate_claims({"beyond-frontier": recs})}["B-3"]
        return c["verdict"], c["measured"]

    v, m = b3(_frontier(FRONTIER_WINS))
    assert v == "holds" and "label-DP DPO" in m and "Holm" in m
    v, m = b3(_frontier(FRONTIER_TIE, P=3000, noise=0.02))
    assert v == "does not hold", m
    v, m = b3(_frontier(FRONTIER_CLOSE, P=8, noise=0.3, seeds=2))
    assert v == "inconclusive" and "power ≈ 0.8" in m
    # a winner that is significant only without the multiplicity correction is not "holds"
    assert b3(_frontier({"bon:RRIHT@8": ([0.5, 0.6], [0, 1.0])}))[0] == "inconclusive"  # nothing to compare


# --- P1-2 across ε and verdicts per pool kind ---------------------------------------------------------


def test_p1_2_across_epsilon_names_the_epsilons_where_it_holds():
    ctrl = _curve("BoN", BON_DEGRADES)
    flat = [0, 20, 30, 32, 33, 33]
    falls = [0, 30, 55, 58, 40, 5]
    strong = _curve("PrivBoN", flat, seed=1, epsilon=2.0)
    weak = _curve("PrivBoN", falls, seed=2, epsilon=50.0)
    v, m = V.monotone_across_epsilon(ctrl + strong + weak)
    assert v == "does not hold" and "holds at ε ∈ {2}" in m and "does not hold at ε ∈ {50}" in m
    assert V.monotone_across_epsilon(ctrl + strong)[0] == "holds"
    noisy = _curve("PrivBoN", [0] * 6, noise=0.5, prompt_sd=0.5, seed=3, epsilon=5.0)
    assert V.monotone_across_epsilon(ctrl + strong + noisy)[0] == "inconclusive"
    # without the positive control no ε is decided
    assert V.monotone_across_epsilon(_curve("BoN", BON_RISES) + strong)[0] == "inconclusive"
    # through the report: P1-2 reads the sweep and says where it holds
    sweep = ctrl + strong + weak
    c = {c["id"]: c for c in evaluate_claims({"p1-privacy-sweep": sweep})}["P1-2"]
    assert c["verdict"] == "does not hold" and "holds at ε ∈ {2}" in c["measured"]


def test_p1_verdicts_are_listed_per_pool_kind():
    syn = _curve("BoN", BON_DEGRADES)
    planted = _curve("BoN", BON_DEGRADES, pool="real: hh-planted.jsonl.gz", pool_kind="planted-real")
    natural = _curve("BoN", BON_RISES, pool=REAL)
    claims = {c["id"]: c for c in evaluate_claims({"p1-scaling": syn + [], "p1-scaling-imdb": natural})}
    m = claims["P1-1"]["measured"]
    assert (
        "planted synthetic: holds (p1-scaling)" in m
        and "natural real text: inconclusive (p1-scaling-imdb)" in m
    )
    claims = {c["id"]: c for c in evaluate_claims({"p1-scaling-imdb": planted})}
    assert claims["P1-1"]["verdict"] == "holds" and "planted real text: holds" in claims["P1-1"]["measured"]


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        (["holds", "holds"], "holds"),
        (["holds", "does not hold", "inconclusive"], "does not hold"),
        (["does not hold"], "does not hold"),
        (["holds", "inconclusive"], "inconclusive"),
        ([], "inconclusive"),  # nothing compared is not a claim that holds
    ],
)
def test_all_of_combines_comparisons_three_ways(verdicts, expected):
    """The one combiner of the all-comparisons rules (RLHF, equal-KL, frontier, P2 best-of-n, across ε)."""
    assert V.all_of(verdicts) == expected
