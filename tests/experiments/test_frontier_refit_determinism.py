"""A frontier reward-model fit depends on the pairs, the configuration and the seed only (issue 37 item 2).

A refit of a committed selector route can differ from its record only if the regenerated private pairs differ
(docs/rlhf.md, "Refitting from the records"): the fit itself must not depend on the process (hash seed), the
BLAS/OpenMP thread count or the order the fits run in. Here every linear reward model of the frontier is
fitted from the same synthetic pairs in two processes that differ in all three; the saved models must be
bit-identical (a hard equality: no α).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import hashlib, json, sys
from pathlib import Path
from types import SimpleNamespace
import numpy as np
from privalign.data.preferences_io import load_jsonl_pairs
from privalign.experiments.frontier import EXPERIMENTS, route_seed
from privalign.experiments.config import load_config, packaged_config_path
from privalign.experiments.routes import _reward

run_dir, order = Path(sys.argv[1]), sys.argv[2].split(",")
cfg = load_config(packaged_config_path("beyond_frontier"), EXPERIMENTS["beyond-frontier"].schema)
cfg = {**cfg, "n_features": 256}
path = run_dir / "pairs.jsonl"
pairs = load_jsonl_pairs(path)
d = {"pairs": pairs, "path": path, "eval": ["held-out prompt one"], "grpo": ["held-out prompt two"]}


class B:
    cell = {"seed_index": 0}
    cache = {}

    def __init__(self):
        self.cfg, self.run_dir = cfg, run_dir / "out"

    def pairs(self):
        return d

    def seed(self, key, k=None):
        return route_seed(cfg["seed"], key, 0 if k is None else k)

    def pending(self, what):
        pass


out = {}
for m in order:
    rm = _reward.fit_rm(m, None if m == "MLE" else 2.0, 0, B())
    saved = json.loads(Path(rm["path"]).read_text())
    saved.pop("metadata")  # the pairs file's path: differs between the two runs by design
    out[m] = hashlib.sha256(json.dumps(saved, sort_keys=True).encode()).hexdigest()
print(json.dumps(out, sort_keys=True))
"""


def _pairs_file(path: Path, n: int = 120) -> None:
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(60)]
    with path.open("w", encoding="utf-8") as fh:
        for k in range(n):
            p, c, r = (" ".join(rng.choice(words, 6)) for _ in range(3))
            fh.write(
                json.dumps({"prompt": f"prompt {k}: {p}", "chosen": c, "rejected": r, "prompt_id": k}) + "\n"
            )


def _fit(run_dir: Path, order: list[str], threads: int, hash_seed: int) -> dict:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONHASHSEED": str(hash_seed),
    }
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run_dir), ",".join(order)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_linear_reward_model_fits_are_identical_across_processes_threads_and_order(tmp_path):
    methods = ["RRIHT", "DenseRR", "SampleDPIHT", "DPSGDLinear", "MLE"]
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        _pairs_file(tmp_path / sub / "pairs.jsonl")
    a = _fit(tmp_path / "a", methods, threads=1, hash_seed=1)
    b = _fit(tmp_path / "b", methods[::-1], threads=2, hash_seed=2)
    assert set(a) == set(methods)
    assert a == b
