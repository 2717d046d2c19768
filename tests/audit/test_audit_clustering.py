"""Audits of DP-PCA and DP k-means (DPPrefSyn's private stages) on worst-case neighbours, each with its
negative control (privalign.audit.clustering): the correct mechanism passes (ε̂ ≤ claimed ε; false-positive
probability ≤ ALPHA by Clopper–Pearson + Bonferroni) and the broken one, claiming the same guarantee, is
caught (ε̂ > claimed ε). At 20,000 draws per side the broken variants' ε̂ was 4.6 (no_clip, claim 1.0) and
1.5 (sensitivity_ignored, claim 0.74) at seed 1 (50,000 draws), far above their claims."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from privalign.audit.clustering import BROKEN_CLUSTERING, clustering_setup

pytestmark = pytest.mark.statistical

ALPHA = 1e-4
CASES = [
    ("dp_pca-(2,0)_vs_(0,2)-eps1-delta1e-2", "dp_pca", {"epsilon": 1.0, "delta": 1e-2}),
    ("dp_kmeans-(1,0)_vs_(-1,0)-eps2-delta1e-2", "dp_kmeans", {"epsilon": 2.0, "delta": 1e-2}),
]


def _audit(mechanism, kwargs, seed, broken=None):
    rng = np.random.default_rng([seed, zlib.crc32(str(broken).encode())])
    return clustering_setup(mechanism, rng=rng, broken=broken, **kwargs).run(20_000, ALPHA)


@pytest.mark.parametrize("name, mechanism, kwargs", CASES, ids=[c[0] for c in CASES])
def test_clustering_audit_passes_correct_and_catches_broken(name, mechanism, kwargs, seed):
    good = _audit(mechanism, kwargs, seed)
    assert good.passed, f"correct {mechanism} flagged: {good.to_dict()}"
    for variant in BROKEN_CLUSTERING[mechanism]:
        bad = _audit(mechanism, kwargs, seed, broken=variant)
        assert not bad.passed, f"broken {mechanism} ({variant}) not caught: {bad.to_dict()}"
        assert bad.claimed_epsilon == good.claimed_epsilon
