"""DPPrefSyn as a frontier route (``dpprefsyn:dpo@ε``; privalign.rlhf.dpprefsyn, issue 37 item 5).

* Accounting: the three stages' own mechanism events, each re-accounted in the house accountants, are within
  their shares (ε/8, ε/8, 3ε/4; δ/3 each), and the route's event composes to (ε, ≤ δ).
* Audits on worst-case neighbours, each with deliberately broken variants that the audit must catch
  (Clopper–Pearson + Bonferroni, false-positive probability ≤ the stated α):
  - the DP-SGD stage over the per-cluster block features (new here): one record in cluster a vs the
    neighbour's record in cluster b; broken ``occupied_blocks_only`` (noise only on the heads of clusters
    present in the batch, the leak of a naive per-cluster DP-SGD) and ``no_noise``;
  - DP-PCA and DP k-means at the route's own ε shares (privalign.audit.clustering's worst-case pairs and
    broken variants ``no_clip`` / ``sensitivity_ignored``).
* Release: what the route writes (``privacy.json``'s payload) is the same on neighbouring datasets and
  holds no seed, hash or exact private statistic.
* End to end: the route runs through the frontier on a tiny random Llama, its checkpoints are records, its
  guarantee is (ε, δ)-DP at the frontier's δ, and a rerun trains nothing.
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from privalign.estimation.dpprefsyn import SPLIT

torch = pytest.importorskip("torch")
pytest.importorskip("peft")


def _pairs(n: int, swap: int | None = None):
    """Toy private pairs; ``swap``: that pair's texts exchanged and its prompt changed (a replace-one
    neighbour)."""
    from privalign.data.preferences_io import TextPairs

    prompts = [f"p{i} " for i in range(n)]
    ch = ["good " * (1 + i % 3) for i in range(n)]
    rj = ["bad " * (1 + i % 2) for i in range(n)]
    if swap is not None:
        prompts[swap], ch[swap], rj[swap] = "zz ", rj[swap] + "xy", ch[swap]
    return TextPairs(prompts, ch, rj, list(range(n)), "toy")


def _train(pairs, *, eps=4.0, delta=1e-3, seed=0):
    from _util import tiny_char_llama
    from privalign.rlhf.dpo import DPOConfig
    from privalign.rlhf.dpprefsyn import DPPrefSynSettings, train_dpprefsyn

    model, tok = tiny_char_llama(layers=1, seed=0)
    cfg = DPOConfig(privacy="none", batch_size=4, epochs=1, max_length=16, lora_rank=2)
    settings = DPPrefSynSettings(n_components=4, n_clusters=2, candidates=3, max_new_tokens=4, max_length=16)
    seen: list[int] = []
    out = train_dpprefsyn(
        pairs, [f"public {k} " for k in range(8)], cfg, epsilon=eps, delta=delta, model=model, tokenizer=tok,
        rng=np.random.default_rng(seed), settings=settings, on_step=lambda t, pol: seen.append(t),
    )  # fmt: skip
    return out, seen


@pytest.fixture(scope="module")
def run():
    return _train(_pairs(24))


# ---------------------------------------------------------------------------------------------------------
# accounting
# ---------------------------------------------------------------------------------------------------------


def test_stages_compose_to_the_stated_epsilon(run):
    from privalign.accounting.accountant import ApproxDPAccountant, ZCDPAccountant
    from privalign.accounting.conversions import gaussian_delta
    from privalign.accounting.events import event_from_dict
    from privalign.accounting.rdp import RDPAccountant

    out, seen = run
    priv = out["privacy"]
    eps, delta = 4.0, 1e-3
    assert seen == list(range(1, out["steps"] + 1)) and out["steps"] == 2  # 8 synthetic pairs / batch 4
    split = priv["split"]
    assert split["stages"] == ["dp_pca", "dp_kmeans", "dp_sgd"]
    assert split["epsilon"] == [eps * s for s in SPLIT] == [0.5, 0.5, 3.0] and sum(split["epsilon"]) == eps
    assert all(d <= delta / 3 for d in split["delta"]) and sum(split["delta"]) <= delta
    # the route's event: basic composition of the three shares, in the house accountant
    acct = ApproxDPAccountant()
    acct.compose(event_from_dict(priv["privacy_event"]))
    e_tot, d_tot = acct.get_total()
    assert e_tot == pytest.approx(eps, rel=1e-12) and e_tot <= eps and d_tot <= delta
    assert priv["guarantee"] == {"epsilon": e_tot, "delta": d_tot}
    # each stage's own mechanism event is within its share
    pca, km, sgd = (event_from_dict(e) for e in priv["stage_events"])
    (e1, d1), (e2, d2), (e3, d3) = zip(split["epsilon"], split["delta"])
    assert type(pca).__name__ == "GaussianEvent" and gaussian_delta(pca.noise_multiplier, e1) <= d1
    assert ZCDPAccountant().compose(km).get_epsilon(d2) <= e2
    assert RDPAccountant("pld").compose(sgd).get_epsilon(d3) <= e3 * (1 + 1e-3)  # PLD discretisation
    assert "Unit: one preference pair" in priv["statement"] and "ε₃=3" in priv["statement"]


# ---------------------------------------------------------------------------------------------------------
# audits
# ---------------------------------------------------------------------------------------------------------

ALPHA = 1e-4  # false-positive probability of each audit (Clopper–Pearson, Bonferroni over its intervals)
DRAWS = 4_000  # per side: the broken variants separate the neighbours (almost) perfectly


def _block_row(cluster: int, K: int, k: int) -> np.ndarray:
    """DPPrefSyn's block feature of one comparison in ``cluster``: its (unit) projection e₁ in that block."""
    psi = np.zeros((1, K * k))
    psi[0, cluster * k] = 1.0
    return psi


def _sgd_sampler(row: np.ndarray, *, eps: float, delta: float, rng, broken: str | None, K: int, k: int):
    """One DP-SGD step (n = 1, batch 1: q = 1) on one row with label 0, as DPPrefSyn configures
    :class:`~privalign.estimation.baselines.DPSGDLinear`; the outcome is ``[θ_a − θ_b < 0] + 2·[block b of
    θ is exactly 0]`` (a = cluster 0's first coordinate, b = cluster 1's)."""
    from privalign.estimation.baselines import DPSGDLinear

    def code(theta: np.ndarray) -> int:
        blk = theta[k : 2 * k]
        return int(theta[0] - theta[k] < 0) + 2 * int(np.all(blk == 0.0))

    proto = DPSGDLinear(epsilon=eps, delta=delta, epochs=1.0, batch_size=1, feature_norm_bound=1.0)
    nm = proto.check_calibration(1)

    def draw(n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            if broken is None:  # the real estimator, as DPPrefSynModel builds it
                m = DPSGDLinear(
                    epsilon=eps, delta=delta, epochs=1.0, batch_size=1, feature_norm_bound=1.0,
                    learning_rate=1.0, random_state=rng,
                ).fit(row, np.zeros(1))  # fmt: skip
                out[i] = code(m.coef_)
                continue
            g = 0.5 * row[0]  # (σ(0) − y)·ψ with y = 0: norm 0.5 ≤ C = 1, no clipping binds
            noise = rng.normal(0.0, nm * 1.0, K * k)
            if broken == "no_noise":  # BUG: the noise forgotten
                noise[:] = 0.0
            else:  # "occupied_blocks_only" BUG: noise only on the heads of clusters present in the batch
                occupied = np.repeat(np.abs(row[0]).reshape(K, k).sum(axis=1) > 0, k)
                noise = np.where(occupied, noise, 0.0)
            out[i] = code(-(g + noise))
        return out

    return draw


@pytest.mark.statistical
@pytest.mark.parametrize("broken", ["occupied_blocks_only", "no_noise"])
def test_audit_of_the_block_feature_dp_sgd_stage_catches_the_broken_variants(broken, seed):
    """ε₃ = 3 (the route at ε = 4), δ₃ = 1e-3/3 (rounded down). Neighbours: the changed comparison sits in
    cluster 0 (D) or in cluster 1 (D′) — a replacement that moves a record between clusters. The correct
    stage passes (ε̂ ≤ ε₃); both broken variants, claiming the same guarantee, are caught (ε̂ > ε₃). The pair is
    not tight for the calibration (on unit features a gradient has norm 0.5 < C = 1 and the two blocks are
    orthogonal: the correct stage's ε̂ was 0.10-0.16 at seeds 0-5); what it tests is that the noise reaches
    every cluster's head (broken ε̂ 5.2 and 5.8 at seeds 0-5, at 4,000 draws per side)."""
    from privalign.audit.audit import audit_mechanism
    from privalign.estimation.dpprefsyn import DPPrefSynModel

    (_, _), (_, _), (e3, d3) = DPPrefSynModel(epsilon=4.0, delta=1e-3).budgets()
    K, k = 2, 3
    results = {}
    for variant in (None, broken):
        rng = np.random.default_rng([seed, zlib.crc32(str(variant).encode())])
        kw = {"eps": e3, "delta": d3, "rng": rng, "broken": variant, "K": K, "k": k}
        results[variant] = audit_mechanism(
            _sgd_sampler(_block_row(0, K, k), **kw), _sgd_sampler(_block_row(1, K, k), **kw),
            n=DRAWS, alpha=ALPHA, claimed_epsilon=e3, delta=d3, outcomes=[0, 1, 2, 3],
        )  # fmt: skip
    assert results[None].passed, results[None].to_dict()
    assert not results[broken].passed and results[broken].epsilon_lower_bound > e3, results[broken].to_dict()


@pytest.mark.statistical
@pytest.mark.parametrize("mechanism", ["dp_pca", "dp_kmeans"])
def test_audit_of_pca_and_kmeans_at_the_routes_shares(mechanism, seed):
    """DP-PCA and DP k-means calibrated at the route's shares for ε = 16 (ε₁ = ε₂ = 2), δ = 3e-2 (δ_i = 1e-2),
    audited on their worst-case pairs (privalign.audit.clustering) at α = ALPHA: correct passes, the broken
    variant (no_clip; sensitivity_ignored) is caught. Seeds 0-5: DP-PCA ε̂ 1.38-1.46 (claim 2), no_clip
    6.2-6.4; k-means (one release's claim 0.74) ε̂ 0.45-0.51, sensitivity_ignored 1.28-1.40."""
    from privalign.audit.clustering import BROKEN_CLUSTERING, clustering_setup
    from privalign.estimation.dpprefsyn import DPPrefSynModel

    budgets = DPPrefSynModel(epsilon=16.0, delta=3e-2).budgets()
    eps_i, delta_i = budgets[0] if mechanism == "dp_pca" else budgets[1]
    assert eps_i == 2.0
    out = {}
    for variant in (None, *BROKEN_CLUSTERING[mechanism]):
        rng = np.random.default_rng([seed, zlib.crc32(f"{mechanism}{variant}".encode())])
        setup = clustering_setup(mechanism, epsilon=eps_i, delta=delta_i, rng=rng, broken=variant)
        out[variant] = setup.run(20_000, ALPHA)
    assert out[None].passed, out[None].to_dict()
    for variant in BROKEN_CLUSTERING[mechanism]:
        assert not out[variant].passed, out[variant].to_dict()


# ---------------------------------------------------------------------------------------------------------
# release
# ---------------------------------------------------------------------------------------------------------


class _FakeBench:
    """The frontier's services for one cell, on toy pairs (what :meth:`DPPrefSynRoute.train` reads)."""

    def __init__(self, pairs, cfg) -> None:
        from _util import tiny_char_llama

        self.cell = {"route": "dpprefsyn:dpo@4", "family": "dpprefsyn", "method": "dpo", "epsilon": 4.0}
        self.cell["seed_index"] = 0
        self.cfg, self.cache, self.run_dir = cfg, {}, None
        self._pairs = {"pairs": pairs, "grpo": [f"public {k} " for k in range(8)]}
        self._base = (*tiny_char_llama(layers=1, seed=0), "tiny")

    def pairs(self):
        return self._pairs

    def base(self):
        return self._base

    def seed(self, key, k=None):
        return np.random.SeedSequence([7, zlib.crc32(key.encode())])


def test_what_the_route_writes_is_the_same_on_neighbouring_datasets_and_holds_no_seed():
    from privalign.experiments.routes.dpprefsyn import DPPrefSynRoute

    cfg = {
        "delta": 1e-3, "dpo_beta": 0.1, "dpo_lr": 5e-4, "dpo_batch": 4, "dpo_epochs": 1, "dpo_max_length": 16,
        "dpo_lora_rank": 2, "dpo_clip": 1.0, "dpo_eval_every": 1, "max_new_tokens": 4,
        "dpprefsyn_components": 4, "dpprefsyn_clusters": 2, "dpprefsyn_candidates": 3,
    }  # fmt: skip
    route = DPPrefSynRoute()
    written = []
    for pairs in (_pairs(24), _pairs(24, swap=5)):
        bench = _FakeBench(pairs, cfg)
        assert route.steps(bench) == [1, 2]
        written.append(
            json.dumps(route.train(bench, lambda t, pol: None), sort_keys=True, ensure_ascii=False)
        )
    assert written[0] == written[1]  # privacy.json's payload: a function of public facts only
    payload = json.loads(written[0])
    assert set(payload) == {"privacy"}
    assert set(payload["privacy"]) == {"privacy_event", "stage_events", "guarantee", "split", "statement"}
    low = written[0].lower()
    assert not any(w in low for w in ("seed", "sha", "hash", "entropy", "sizes", "centers", "theta", "loss"))
    # the only numbers are the public ε, δ and schedule facts (n, the noise multipliers, steps, sampling rate)
    event, extra = route.guarantee(bench, payload)
    assert event == payload["privacy"]["privacy_event"] and extra["epsilon_accounted"] <= 4.0


# ---------------------------------------------------------------------------------------------------------
# end to end through the frontier
# ---------------------------------------------------------------------------------------------------------


def test_dpprefsyn_route_runs_through_the_frontier_and_resumes(tmp_path, monkeypatch):
    """``dpprefsyn:dpo@8`` as a frontier route on a tiny random Llama (fake gold): its checkpoints are
    records, its guarantee is (ε, δ)-DP with the frontier's δ, and a rerun trains nothing."""
    import privalign.experiments.frontier as fr
    import privalign.rlhf.dpprefsyn as dps_mod
    from _util import tiny_char_llama
    from privalign.experiments.base import RunContext

    def prompts(cfg):
        E, G, n = cfg["eval_prompts"], cfg["grpo_prompts"], cfg["n_pairs"]
        w = [f"prompt {k} " for k in range(E + G + n)]
        return {
            "eval": w[:E], "eval_info": {"offset": 0}, "grpo": w[E : E + G], "grpo_info": {"offset": E},
            "pairs": w[E + G :], "pairs_info": {"offset": E + G},
        }  # fmt: skip

    class Gold:
        def score(self, texts):
            return np.array([(sum(c in "aeiou" for c in t) + 1) / (len(t) + 2) for t in texts])

    monkeypatch.setattr(fr, "_prompts", prompts)
    model, tok = tiny_char_llama(layers=1, seed=0)
    model.eval()

    def ctx():
        c = RunContext(run_dir=tmp_path / "run")
        c.cache["base"], c.cache["gold"] = (model, tok, "tiny"), Gold()
        return c

    exp = fr.EXPERIMENTS["beyond-frontier"]
    cfg = {k: f.default for k, f in exp.schema.items()}
    cfg.update(
        routes=["dpprefsyn:dpo@8"], eval_prompts=3, grpo_prompts=8, n_pairs=16, max_new_tokens=4,
        reference_samples=4, eval_samples=2, bon_ns=[1, 2, 4], dpo_batch=4, dpo_epochs=1, dpo_max_length=16,
        dpo_lora_rank=2, dpo_eval_every=1, dpprefsyn_seeds=1, dpprefsyn_components=4, dpprefsyn_clusters=2,
        dpprefsyn_candidates=3, n_bootstrap=100, alt_gold="", delta=1e-3,
    )  # fmt: skip

    def run():
        out = []
        for i, cell in enumerate(exp.cells(cfg, ctx())):
            out += exp.run_cell(cell, cfg, ctx(), np.random.SeedSequence(0, spawn_key=(i,)))
        return out

    (r,) = [x for x in run() if x["kind"] == "frontier"]
    assert [p["x"] for p in r["points"]] == [0, 1, 2]  # 8 public prompts → 8 synthetic pairs / batch 4
    g = r["guarantee"]
    assert g["unit"].startswith("(ε, δ)-DP") and g["epsilon"] == 8.0
    assert g["epsilon_accounted"] <= 8.0 and g["privacy_event"]["kind"] == "composed"
    assert 1e-3 * (1 - 1e-12) <= g["delta"] <= 1e-3  # the accounted δ: three δ/3 shares, rounded down
    assert "DPPrefSyn" in g["statement"] and r["label"].startswith("DPPrefSyn")
    priv = next((tmp_path / "run" / "records").rglob("privacy.json"))
    assert not any(w in priv.read_text().lower() for w in ("seed", "sha256", "sizes", "theta"))

    def boom(*a, **k):
        raise AssertionError("retrained a route that has records")

    monkeypatch.setattr(dps_mod, "train_dpprefsyn", boom)
    again = [x for x in run() if x["kind"] == "frontier"]
    assert again == [r]


def test_the_route_refuses_a_dpo_batch_above_the_public_prompts():
    from privalign.experiments.routes.dpprefsyn import DPPrefSynRoute

    msg = DPPrefSynRoute.check({}, {"dpo_batch": 16, "grpo_prompts": 8})
    assert msg is not None and "dpo_batch" in msg and "16" in msg and "grpo_prompts = 8" in msg
    assert DPPrefSynRoute.check({}, {"dpo_batch": 8, "grpo_prompts": 8}) is None
