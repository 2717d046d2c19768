"""Pinned outputs: ``run_protocol`` and ``select_batch`` for fixed seeds are bit-identical to the engine
before issue 18's speed work (hashes computed at commit 39270e8, before any change, and asserted after).

The hash covers every float's ``repr`` (JSON), so any change of the laws, the random stream or the privacy
events fails the test. Checked identical with OPENBLAS_NUM_THREADS = 1 and 2.
"""

import hashlib
import json

import numpy as np
import pytest

from privalign.alignment import BestOfN, InferenceTimePessimism, PrivBoN, PrivITP
from privalign.alignment.simulation import MethodSpec, run_protocol
from privalign.alignment.synthetic import make_synthetic_pool

SPECS = [
    MethodSpec("bon"),
    MethodSpec("itp", beta=0.05),
    MethodSpec("privbon", epsilon=8.0),
    MethodSpec("privbon", sigma=0.0),
    MethodSpec("privitp", beta=0.05, sigma_x=0.2, sigma_z=0.1),
]


def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def test_run_protocol_pinned():
    pool = make_synthetic_pool(6, 256, random_state=3)
    res = run_protocol(
        pool, SPECS, n_grid=[1, 2, 8, 32, 128], replicates=7, random_state=11, progress=False, per_prompt=True
    )
    res.pop("seconds")
    got = {m["name"]: _h(m) for m in res["methods"]}
    assert got == {
        "BoN": "d6503e81a8b25c8d",
        "ITP β=0.05": "553561049f628d80",
        "PrivBoN ε=8": "3478b4ae53929d22",
        "PrivBoN σ=0": "f8039a91ee88c0eb",
        "PrivITP β=0.05 σx=0.2 σz=0.1": "afd98e14da3017bd",
    }
    assert _h(res) == "61e1acaf912e29ae"


def test_run_protocol_pinned_blocks_and_early_stop():
    """N past the 256-position scan block, chunked replicates (``max_chunk``), early-stopped λ̃ nodes."""
    pool = make_synthetic_pool(3, 1100, random_state=4)
    res = run_protocol(
        pool, SPECS, n_grid=[4, 300, 512], replicates=5, random_state=12, progress=False, max_chunk=20_000
    )
    res.pop("seconds")
    assert _h(res) == "2e416efd476d63c9"


@pytest.mark.parametrize(
    "sel, digest",
    [
        (BestOfN(), "e7ee0e3e786606cb"),
        (InferenceTimePessimism(0.05), "da0f92651b7caf81"),
        (PrivBoN(2.0), "5706d2d66b2835c1"),
        (PrivITP(0.05, sigma_x=0.3, sigma_z=0.2), "9478dd6e4937400e"),
    ],
    ids=["bon", "itp", "privbon", "privitp"],
)
def test_select_batch_pinned(sel, digest):
    gen = np.random.default_rng(5)
    a, b = gen.uniform(0, 1, (40, 64)), gen.uniform(0, 1, (40, 64))
    out = sel.select_batch(a, rng=np.random.default_rng(9), pool_b_scores=b)
    d = {
        "idx": out.indices.tolist(),
        "diag": {k: np.asarray(v).tolist() for k, v in sorted(out.diagnostics.items())},
        "ev": [out.events[i].to_dict() for i in range(len(out))],
        "wc": out.worst_case_event.to_dict(),
    }
    assert _h(d) == digest
