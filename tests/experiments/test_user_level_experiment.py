"""``beyond-user-level``'s two claims, decided on constructed records for each outcome, and the attacked
training set's construction (the two hypotheses differ only in the heavy annotator's labels)."""

from __future__ import annotations

import numpy as np
import pytest

from privalign.experiments.user_level import UTILITY_MARGIN, attack_verdict, utility_verdict


def _attack(variant: str, seed: int, bound: float, violation: bool) -> dict:
    return {
        "kind": "attack",
        "seed": seed,
        "variant": variant,
        "stated_epsilon": 1.0,
        "eps_lower_bound": bound,
        "violation": violation,
    }


def test_attack_verdict_holds_when_every_record_level_audit_exceeds_and_no_user_level_one_does():
    recs = [_attack("per-label", s, 3.0, True) for s in range(5)]
    recs += [_attack("user", s, 0.1, False) for s in range(5)]
    v, measured = attack_verdict(recs)
    assert v == "holds" and "5/5" in measured


def test_attack_verdict_does_not_hold_when_a_user_level_audit_finds_a_violation():
    recs = [_attack("per-label", s, 3.0, True) for s in range(5)]
    recs += [_attack("user", s, 0.1, False) for s in range(4)] + [_attack("user", 4, 1.3, True)]
    assert attack_verdict(recs)[0] == "does not hold"


def test_attack_verdict_is_inconclusive_without_power_or_replicates():
    weak = [_attack("per-label", s, 3.0, s != 2) for s in range(5)] + [
        _attack("user", s, 0.0, False) for s in range(5)
    ]
    assert attack_verdict(weak)[0] == "inconclusive"  # one seed's attack too weak to show the violation
    assert (
        attack_verdict([_attack("per-label", 0, 3.0, True), _attack("user", 0, 0.0, False)])[0]
        == "inconclusive"
    )
    assert attack_verdict([])[0] == "inconclusive"


def _util(seed: int, variant: str, acc: float, k=None, method="rr", eps=1.0) -> dict:
    return {
        "kind": "utility",
        "seed": seed,
        "method": method,
        "epsilon": eps,
        "variant": variant,
        "k": k,
        "accuracy": acc,
    }


def _pairs(diffs, base=0.6, method="rr", eps=1.0):
    out = []
    for s, d in enumerate(diffs):
        out += [_util(s, "group", base, method=method, eps=eps), _util(s, "user", base + d, 10, method, eps)]
        out.append(_util(s, "user", 0.9, 1, method, eps))  # another K: must not be read by the K = 10 rule
    return out


def test_utility_verdict_holds_when_every_cell_is_significantly_ahead():
    recs = _pairs([0.05, 0.06, 0.055, 0.052, 0.058]) + _pairs(
        [0.03, 0.035, 0.032, 0.031, 0.034], method="rr-iht"
    )
    v, measured = utility_verdict(recs, 10)
    assert v == "holds" and "rr-iht" in measured


def test_utility_verdict_does_not_hold_when_user_level_is_no_better():
    # significantly behind in one cell
    recs = _pairs([0.05, 0.06, 0.055, 0.052, 0.058]) + _pairs([-0.05, -0.06, -0.055, -0.05, -0.057], eps=4.0)
    assert utility_verdict(recs, 10)[0] == "does not hold"
    # equal within the margin, tightly: no better by more than the margin
    tight = _pairs([0.0005, -0.0004, 0.0002, 0.0, -0.0001])
    assert abs(np.mean([0.0005, -0.0004, 0.0002, 0.0, -0.0001])) < UTILITY_MARGIN
    assert utility_verdict(tight, 10)[0] == "does not hold"


def test_utility_verdict_is_inconclusive_when_noisy_or_unpaired():
    assert utility_verdict(_pairs([0.1, -0.05, 0.12, -0.04, 0.08]), 10)[0] == "inconclusive"
    assert utility_verdict(_pairs([0.1]), 10)[0] == "inconclusive"  # one seed: no interval
    assert (
        utility_verdict(_pairs([0.05, 0.06, 0.055]), 3)[0] == "inconclusive"
    )  # no user-level record at K = 3


@pytest.mark.parametrize("seed", [0, 3])
def test_attacked_sets_differ_only_in_the_heavy_annotators_labels(seed):
    from privalign.experiments.base import RunContext
    from privalign.experiments.user_level import _attack_data, _schema
    from privalign.experiments.user_level import _pairs as load_pairs

    cfg = {k: f.default for k, f in _schema().items()}
    cfg.update(
        contributions=[1, 40, 10, 6, 30, 2],
        n_test=100,
        n_features=128,
        attack_others=80,
        attack_heavy=20,
        seeds=4,
    )
    ctx = RunContext(run_dir=None)  # type: ignore[arg-type]
    data = load_pairs(cfg, ctx)
    att = _attack_data(cfg, seed, data)
    heavy = np.asarray(att["users"]) == -1
    assert heavy.sum() == 20
    assert np.array_equal(att["y_a"][~heavy], att["y_b"][~heavy])
    assert np.all(att["y_a"][heavy] != att["y_b"][heavy])  # every one of the heavy annotator's labels differs
