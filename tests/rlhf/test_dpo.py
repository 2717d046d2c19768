"""Private DPO (privalign.rlhf.dpo): the debiased loss, Opacus per-comparison gradients, the accounting
cross-check, the three routes on a tiny random Llama, and the statistical audits of both mechanisms."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("opacus")

from _util import tiny_char_llama  # noqa: E402
from privalign.errors import DataFormatError, PrivacyParameterError, UtilityWarning  # noqa: E402
from privalign.rlhf import dpo  # noqa: E402


def tiny_base(seed: int = 0):
    """A randomly initialised one-layer Llama and a character tokenizer (tests/_util.py)."""
    model, tok = tiny_char_llama(layers=1, seed=seed)
    return model, tok, "tiny-llama"


class Pairs:
    def __init__(self, prompts, chosen, rejected):
        self.prompts, self.chosen, self.rejected = list(prompts), list(chosen), list(rejected)


def make_pairs(n: int = 12) -> Pairs:
    return Pairs(
        [f"review {k}: " for k in range(n)],
        [f"great film {k}!" for k in range(n)],
        [f"dull film {k}." for k in range(n)],
    )


@pytest.fixture(scope="module")
def base():
    return tiny_base()


# ---------------------------------------------------------------------------------------------------------
# the debiased loss
# ---------------------------------------------------------------------------------------------------------


def test_robust_loss_is_plain_dpo_at_zero_flip_rate_and_unbiased_under_flips():
    h = torch.tensor([-3.0, -0.5, 0.0, 0.7, 4.0], dtype=torch.float64)
    beta = 0.3
    plain = -torch.nn.functional.logsigmoid(beta * h)
    assert torch.allclose(dpo.robust_dpo_loss(h, beta, 0.0), plain)
    for eps in (0.5, 1.0, 4.0):
        rho = 1.0 / (1.0 + math.exp(eps))
        # the defining property (Chowdhury et al. 2024): the mean over the flip is the clean loss
        avg = (1 - rho) * dpo.robust_dpo_loss(h, beta, rho) + rho * dpo.robust_dpo_loss(-h, beta, rho)
        assert torch.allclose(avg, plain, rtol=1e-12, atol=1e-12)
        # the rDPO loss written out = TRL 1.16's loss_type="robust" with label_smoothing = ρ (dpo_trainer.py)
        clean = -(1 - rho) * torch.nn.functional.logsigmoid(beta * h)
        flipped = -rho * torch.nn.functional.logsigmoid(-beta * h)
        trl = (clean - flipped) / (1 - 2 * rho)
        assert torch.allclose(dpo.robust_dpo_loss(h, beta, rho), trl, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rho", [-0.1, 0.5, 0.7, float("nan")])
def test_robust_loss_refuses_flip_rate_out_of_range(rho):
    with pytest.raises(PrivacyParameterError, match="flip_rate"):
        dpo.robust_dpo_loss(torch.zeros(2), 0.1, rho)


# ---------------------------------------------------------------------------------------------------------
# configuration, data and schedule
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, flag",
    [
        (dict(privacy="label", epsilon=0.0), "epsilon"),
        (dict(privacy="label", epsilon=float("inf")), "epsilon"),
        (dict(privacy="label", epsilon=1.0, delta=1e-5), "delta"),
        (dict(privacy="sample", epsilon=1.0, delta=1.0), "delta"),
        (dict(privacy="sample", epsilon=1.0, delta=0.0), "delta"),
        (dict(privacy="none", epsilon=1.0), "epsilon"),
        (dict(privacy="laplace", epsilon=1.0), "privacy"),
        (dict(privacy="label", epsilon=1.0, batch_size=0), "batch_size"),
        (dict(privacy="label", epsilon=1.0, beta=-1.0), "beta"),
        (dict(privacy="sample", epsilon=1.0, clip_norm=float("nan")), "clip_norm"),
    ],
)
def test_config_refuses_out_of_range(kw, flag):
    with pytest.raises(PrivacyParameterError, match=f"'{flag}'"):
        dpo.DPOConfig(**kw)


def test_schedule_refuses_batch_larger_than_data_and_delta_above_one_over_n():
    with pytest.raises(PrivacyParameterError, match="'batch_size'"):
        dpo.check_schedule(dpo.DPOConfig(privacy="label", epsilon=1.0, batch_size=13), 12)
    with pytest.raises(PrivacyParameterError, match="'delta'"):
        dpo.check_schedule(dpo.DPOConfig(privacy="sample", epsilon=1.0, delta=0.1, batch_size=4), 12)
    assert dpo.check_schedule(dpo.DPOConfig(privacy="label", epsilon=1.0, batch_size=5, epochs=2), 12) == 4


@pytest.mark.parametrize(
    "lines, match",
    [
        ([], "no preference pairs"),
        (['{"chosen": "a good one", "rejected": ""}'], "one-sided"),
        (['{"chosen": "a good one"}'], "rejected"),
        (['{"chosen": "same", "rejected": "same "}'], "identical"),
    ],
)
def test_read_pairs_refuses_bad_files(tmp_path, lines, match):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    with pytest.raises(DataFormatError, match=match):
        dpo.read_dpo_pairs(f)


# ---------------------------------------------------------------------------------------------------------
# Opacus per-comparison gradients and the accounting cross-check
# ---------------------------------------------------------------------------------------------------------


def _lora_setup(base, pairs, seed=0):
    model = copy.deepcopy(base[0])
    cfg = dpo.DPOConfig(privacy="none", lora_rank=2, max_length=24, batch_size=2)
    data = dpo._encode_pairs(base[1], pairs, cfg.max_length)
    model = dpo._add_lora(model, cfg, torch.Generator().manual_seed(seed))
    with torch.no_grad():  # move B off zero so that the gradients of A are not all zero
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    with torch.no_grad(), model.disable_adapter():
        ref = dpo.sequence_logprobs(model, data["ids"], data["attn"], data["resp"])
    return model, data, ref


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_opacus_per_pair_gradients_equal_per_pair_autograd(base):
    from opacus import GradSampleModule

    pairs = make_pairs(4)
    model, data, ref = _lora_setup(base, pairs)
    params = [p for p in model.parameters() if p.requires_grad]
    idx = np.array([0, 2, 3])
    expected = []
    for i in idx:
        model.zero_grad(set_to_none=True)
        dpo.robust_dpo_loss(dpo._pair_margins(model, data, np.array([i]), ref), 0.1, 0.0).sum().backward()
        expected.append([p.grad.detach().clone() for p in params])
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)
    model.zero_grad(set_to_none=True)
    dpo.robust_dpo_loss(dpo._pair_margins(gsm, data, idx, ref), 0.1, 0.0).sum().backward()
    got = dpo._per_pair_grads(params, len(idx))
    gsm.cleanup()
    for k in range(len(params)):
        for j in range(len(idx)):
            assert torch.allclose(got[k][j], expected[j][k], rtol=1e-4, atol=1e-7)
    assert any(float(g.abs().sum()) > 0 for g in got)


def test_clip_and_noise_clips_each_comparison_and_adds_scaled_noise():
    g = torch.Generator().manual_seed(0)
    per = [torch.tensor([[3.0, 4.0], [0.3, 0.4]]), torch.tensor([[[0.0]], [[0.0]]])]
    out = dpo.clip_and_noise(per, 1.0, 0.0, g)  # no noise: the clipped sum
    assert torch.allclose(out[0], torch.tensor([0.6 + 0.3, 0.8 + 0.4]))
    empty = [torch.zeros((0, 2)), torch.zeros((0, 1, 1))]
    draws = torch.stack([dpo.clip_and_noise(empty, 2.0, 1.5, g)[0] for _ in range(4000)])
    # std σC = 3 per coordinate; 4000 draws: the sample sd lies within ±5% with overwhelming probability
    assert abs(float(draws.std()) - 3.0) < 0.15


@pytest.mark.parametrize("sigma, q, steps", [(1.0, 0.01, 1000), (2.0, 0.1, 50), (0.8, 0.33, 6)])
def test_opacus_and_privalign_rdp_agree_on_the_same_schedule(sigma, q, steps):
    rec = dpo.opacus_cross_check(sigma, q, steps, 1e-5)
    assert rec["agrees"]
    assert rec["opacus_rdp_epsilon"] == pytest.approx(rec["privalign_rdp_epsilon"], rel=0.05)


def test_cross_check_refuses_only_the_unsafe_direction(monkeypatch):
    from opacus.accountants import RDPAccountant as OpacusRDP

    real = OpacusRDP.get_epsilon
    monkeypatch.setattr(OpacusRDP, "get_epsilon", lambda self, delta, **k: 2.0 * real(self, delta, **k))
    with pytest.raises(PrivacyParameterError, match="cross-check"):
        dpo.opacus_cross_check(1.0, 0.01, 100, 1e-5)
    monkeypatch.setattr(OpacusRDP, "get_epsilon", lambda self, delta, **k: 0.5 * real(self, delta, **k))
    rec = dpo.opacus_cross_check(1.0, 0.01, 100, 1e-5)  # privalign more conservative: fine
    assert rec["agrees"] and rec["opacus_rdp_epsilon"] < rec["privalign_rdp_epsilon"]


# ---------------------------------------------------------------------------------------------------------
# the three routes end to end on the tiny model
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "privacy, eps, delta", [("none", None, None), ("label", 2.0, None), ("sample", 4.0, 1e-3)]
)
def test_train_dpo_routes(base, privacy, eps, delta):
    cfg = dpo.DPOConfig(
        privacy=privacy, epsilon=eps, delta=delta, batch_size=4, epochs=1, lora_rank=2, max_length=24
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UtilityWarning)
        res = dpo.train_dpo(
            make_pairs(12), cfg, model=copy.deepcopy(base[0]), tokenizer=base[1], rng=np.random.default_rng(3)
        )
    assert res["steps"] == 3 and len(res["losses"]) == 3
    pr = res["privacy"]
    utility = [w for w in caught if issubclass(w.category, UtilityWarning)]
    if privacy == "sample":  # the ceiling from the real LoRA size; this tiny run is noise-dominated
        m = dpo._add_lora(copy.deepcopy(base[0]), cfg, torch.Generator().manual_seed(0))
        d = sum(p.numel() for p in m.parameters() if p.requires_grad)
        sigma = pr["accounting"]["noise_multiplier"]
        assert res["signal_to_noise_ceiling"] == pytest.approx(4 * math.sqrt(3) / (sigma * math.sqrt(d)))
        assert res["signal_to_noise_ceiling"] < 1 and len(utility) == 1
        assert "signal-to-noise ceiling" in str(utility[0].message) and f"d = {d}" in str(utility[0].message)
    else:
        assert res["signal_to_noise_ceiling"] is None and not utility
    if privacy == "none":
        assert pr["guarantee"] is None and pr["privacy_unit"] == "none"
        assert res["losses"][-1] < res["losses"][0]  # the non-private loss goes down on this easy task
    elif privacy == "label":
        assert pr["privacy_unit"] == "label" and pr["guarantee"]["epsilon"] == 2.0
        assert pr["flip_rate"] == pytest.approx(1 / (1 + math.exp(2.0)))
        assert pr["privacy_event"]["kind"] == "randomized_response"
    else:
        acct = pr["accounting"]
        assert pr["privacy_unit"] == "sample" and acct["epsilon"] <= 4.0
        assert acct["sampling_probability"] == pytest.approx(4 / 12) and acct["steps"] == 3
        from privalign.accounting.events import event_from_dict
        from privalign.rlhf.train import event_guarantee

        ev = event_from_dict(pr["privacy_event"])
        assert ev.unit == "sample"
        eps_ev, d_ev, _ = event_guarantee(pr["privacy_event"], delta=1e-3)
        assert eps_ev <= 4.0 * 1.01 and d_ev == 1e-3
    assert not any(n for n, _ in res["model"].named_parameters() if "lora" in n)  # merged


def test_label_route_swaps_exactly_the_randomized_pairs(base, monkeypatch):
    """Training reads the labels only through ỹ: with every label flipped (a stub mechanism) the rows of
    each pair are swapped."""
    seen = {}
    real = dpo._pair_margins

    def spy(model, data, idx, ref):
        seen["ids"] = data["ids"].clone()
        return real(model, data, idx, ref)

    monkeypatch.setattr(dpo, "_pair_margins", spy)
    monkeypatch.setattr(
        dpo, "privatize_preferences", lambda y, e, rng: (1 - np.asarray(y), 0.2, _rr_event(e))
    )
    pairs = make_pairs(4)
    cfg = dpo.DPOConfig(privacy="label", epsilon=1.0, batch_size=4, lora_rank=2, max_length=24)
    dpo.train_dpo(pairs, cfg, model=copy.deepcopy(base[0]), tokenizer=base[1], rng=np.random.default_rng(0))
    enc = dpo._encode_pairs(base[1], pairs, 24)
    assert torch.equal(seen["ids"][:4], enc["ids"][4:]) and torch.equal(seen["ids"][4:], enc["ids"][:4])


def _rr_event(eps):
    from privalign.accounting.events import RandomizedResponseEvent

    return RandomizedResponseEvent(epsilon=eps, unit="label")


# ---------------------------------------------------------------------------------------------------------
# statistical audits (each: false-positive rate α = 1e-3, exact Clopper–Pearson intervals, Bonferroni)
# ---------------------------------------------------------------------------------------------------------

ALPHA = 1e-3


@pytest.mark.statistical
def test_audit_label_dp_randomized_response_and_catch_a_too_small_flip_rate():
    """Worst-case neighbours: one preference label 1 vs 0 (all else equal; each coordinate is an independent
    run of the mechanism, so n draws are n coordinates). Claim ε = 1; the broken variant flips with
    probability 1/(1 + e^{2ε}) (true ε = 2)."""
    from privalign.audit import audit_mechanism
    from privalign.audit.broken import broken_mechanism
    from privalign.mechanisms import RandomizedResponse

    eps, n = 1.0, 20_000
    for mech, should_pass in ((None, True), (broken_mechanism(RandomizedResponse(eps), "wrong_flip"), False)):
        rng = np.random.default_rng(11)

        def draw(label, mech=mech, rng=rng):
            return lambda m: dpo.privatize_preferences(np.full(m, label), eps, rng, mechanism=mech)[0]

        res = audit_mechanism(draw(1), draw(0), n, ALPHA, claimed_epsilon=eps, outcomes=[0, 1])
        assert res.passed is should_pass, res.to_dict()


def _per_pair_at_init(base, pairs):
    """Per-comparison gradients of the DPO loss at the LoRA initialisation (policy = reference, h = 0),
    through Opacus, as in a sample-DP step."""
    from opacus import GradSampleModule

    model = copy.deepcopy(base[0])
    cfg = dpo.DPOConfig(privacy="none", lora_rank=2, max_length=24, batch_size=2)
    data = dpo._encode_pairs(base[1], pairs, cfg.max_length)
    model = dpo._add_lora(model, cfg, torch.Generator().manual_seed(0))
    with torch.no_grad(), model.disable_adapter():
        ref = dpo.sequence_logprobs(model, data["ids"], data["attn"], data["resp"])
    params = [p for p in model.parameters() if p.requires_grad]
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)
    idx = np.arange(len(pairs.prompts))
    dpo.robust_dpo_loss(dpo._pair_margins(gsm, data, idx, ref), 0.1, 0.0).sum().backward()
    out = [g.detach() for g in dpo._per_pair_grads(params, len(idx))]
    gsm.cleanup()
    return out


def _no_clip(per, clip, sigma, gen):
    import torch as t

    return [g.sum(0) + t.randn(g.shape[1:], generator=gen) * sigma * clip for g in per]


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_audit_sample_dp_step_and_catch_no_clipping_and_too_little_noise(base):
    """One DP-SGD step with q = 1 on neighbouring datasets that differ in one comparison: D holds pair 0 as
    given, D′ holds it with chosen and rejected swapped. At the initialisation h = 0, so the swapped pair's
    gradient is exactly the negative of the original (the worst case for replace-one: the clipped sums
    differ by 2C). Claim: dpsgd_epsilon(σ, q=1, 1 step, δ) under replace-one (a Gaussian of sensitivity 2C).
    Statistic: the noisy sum projected on the direction of the difference, in units of σC; thresholds
    fixed in advance. Broken variants: no clipping (C far below the gradient norm) and σ/8."""
    from privalign.audit import audit_threshold
    from privalign.estimation.baselines import dpsgd_epsilon

    pairs = make_pairs(3)
    swapped = Pairs(
        pairs.prompts, [pairs.rejected[0], *pairs.chosen[1:]], [pairs.chosen[0], *pairs.rejected[1:]]
    )
    g_d, g_dp = _per_pair_at_init(base, pairs), _per_pair_at_init(base, swapped)
    flat = lambda gs, i: torch.cat([g[i].reshape(-1) for g in gs])  # noqa: E731
    assert torch.allclose(flat(g_d, 0), -flat(g_dp, 0), atol=1e-6)
    norm0 = float(flat(g_d, 0).norm())
    clip, sigma, delta, n = norm0 / 20.0, 4.0, 1e-5, 6_000  # every gradient is clipped (norms > C)
    claimed = dpsgd_epsilon(sigma, 1.0, 1, delta)

    def vec(xs):
        return torch.cat([x.reshape(-1) for x in xs])

    def sampler(per, mech, s, seed, mid, u):
        gen = torch.Generator().manual_seed(seed)

        def draw(m):
            outs = (vec(mech(per, clip, s, gen)) for _ in range(m))
            return np.array([float((o - mid) @ u) / (sigma * clip) for o in outs])

        return draw

    thresholds = [-0.5, -0.25, 0.0, 0.25, 0.5]  # on T = ⟨out − mid, u⟩/(σC), fixed before sampling
    cases = [
        (dpo.clip_and_noise, sigma, True),
        (_no_clip, sigma, False),
        (dpo.clip_and_noise, sigma / 8, False),
    ]
    for k, (mech, s, should_pass) in enumerate(cases):
        # the noiseless outputs of the mechanism under test on D and D′ (known to the auditor in advance)
        s_d, s_dp = (
            vec(mech(g_d, clip, 0.0, torch.Generator())),
            vec(mech(g_dp, clip, 0.0, torch.Generator())),
        )
        if k == 0:
            assert float((s_d - s_dp).norm()) == pytest.approx(2 * clip, rel=1e-4)
        mid, u = (s_d + s_dp) / 2, (s_d - s_dp) / (s_d - s_dp).norm()
        res = audit_threshold(
            sampler(g_d, mech, s, 100 + k, mid, u),
            sampler(g_dp, mech, s, 200 + k, mid, u),
            n,
            ALPHA,
            thresholds=thresholds,
            claimed_epsilon=claimed,
            delta=delta,
        )
        assert res.passed is should_pass, (k, res.to_dict())


def test_signal_to_noise_ceiling_formula_and_bad_input():
    """B·√T/(σ·√d): the beyond-frontier sample-DP DPO (B = 8, T = 50, σ ≈ 0.507, d = 2 442 240 LoRA parameters
    of SmolLM2-135M at rank 8) is at ≈ 0.07; a full batch of 10⁴ pairs at rank 1 on one module is above 1."""
    assert dpo.signal_to_noise_ceiling(2_442_240, 0.507, 8, 50) == pytest.approx(0.0714, abs=5e-4)
    assert dpo.signal_to_noise_ceiling(100, 1.0, 10, 4) == pytest.approx(2.0)
    assert dpo.signal_to_noise_ceiling(34_560, 2.0, 10_000, 10) > 1
    for bad in [(0, 1.0, 8, 1), (10, 0.0, 8, 1), (10, 1.0, 0, 1), (10, 1.0, 8, 0)]:
        with pytest.raises(PrivacyParameterError, match="signal_to_noise_ceiling"):
            dpo.signal_to_noise_ceiling(*bad)
