"""The committed VADER-labeller run of beyond-frontier (issue 37 item 2): its summary recomputes from its
records (and the MiniLM-labeller run's, the second labeller), with nothing fitted."""

from __future__ import annotations

import json

import numpy as np

from privalign.experiments import frontier as fr
from privalign.experiments.base import RunContext

# ---------------------------------------------------------------------------------------------------------
# the committed VADER-labeller run: its summary recomputes from its records
# ---------------------------------------------------------------------------------------------------------


def _close(a, b, path="", tol=1e-9):
    """Paths where two JSON trees differ (numbers within ``tol``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: missing" for k in set(a) ^ set(b)]
        return out + [d for k in set(a) & set(b) for d in _close(a[k], b[k], f"{path}.{k}", tol)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _close(x, y, f"{path}[{i}]", tol)]
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return [] if abs(a - b) <= tol * max(1.0, abs(b)) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def test_committed_vader_records_summarise_to_the_committed_summary(tmp_path):
    """records_only over docs/results/beyond-frontier-vader/records (and the MiniLM run's records, the second
    labeller): every recorded (route, seed) is found by identity, nothing is fitted, and the summary — per
    judge comparisons and the lead verdict included — is the committed one."""
    from pathlib import Path
    from types import SimpleNamespace

    from privalign.experiments.config import load_config, packaged_config_path

    root = Path(__file__).resolve().parents[2] / "docs" / "results" / "beyond-frontier-vader"
    committed = json.loads((root / "summary.json").read_text(encoding="utf-8"))
    exp = fr.EXPERIMENTS["beyond-frontier"]
    cfg = {**load_config(packaged_config_path("beyond_frontier_vader"), exp.schema), "records_only": True}
    ctx = RunContext(run_dir=tmp_path)
    # the identities hash the public configuration that generates the pairs (labeller included), never the
    # pairs: only their number is needed
    ctx.cache["pairs"] = {
        "data_identity": fr.data_identity(cfg),
        "pairs": SimpleNamespace(prompts=[None] * cfg["n_pairs"]),
    }
    recs = []
    for i, cell in enumerate(exp.cells(cfg, ctx)):
        if cell["route"] != "data":
            recs += exp.run_cell(cell, cfg, ctx, np.random.SeedSequence(0, spawn_key=(i,)))
    pending = sorted(f"{r['route']} seed={r['seed_index']}" for r in recs if r["kind"] == "pending")
    assert pending == sorted(committed.get("pending", []))
    summary = json.loads(json.dumps(exp.summarize(recs, cfg), default=float))
    drop = {"experiment", "title", "paper", "quick", "config", "reference_gold", "data"}
    assert (
        _close(
            {k: v for k, v in summary.items() if k not in drop},
            {k: v for k, v in committed.items() if k not in drop},
        )
        == []
    )
