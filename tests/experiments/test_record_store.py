"""The run's record store (:mod:`privalign.experiments.record_store`): identity-checked reuse, a prior folder
copied in on a hit, nothing written by ``find``; and the records committed under ``docs/results`` are found
by it and summarise to the committed ``summary.json`` (no model is loaded)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from privalign.experiments.base import RunContext
from privalign.experiments.record_store import RecordStore, identity, repo_path
from privalign.paths import repo_root

RESULTS = repo_root() / "docs" / "results"


def test_identity_is_the_sha256_of_canonical_json():
    import hashlib

    obj = {"b": [1, 2.5], "a": None, "p": Path("x")}
    want = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
    assert identity(obj) == want == identity(dict(reversed(list(obj.items()))))
    assert identity({**obj, "a": 0}) != want


def test_get_reuses_only_a_matching_identity_and_copies_from_the_prior(tmp_path):
    prior = tmp_path / "prior"
    (prior / "r").mkdir(parents=True)
    (prior / "r" / "good.json").write_text(json.dumps({"identity": "i1", "v": 1}))
    (prior / "r" / "stale.json").write_text(json.dumps({"identity": "old", "v": 2}))
    (prior / "r" / "torn.json").write_text('{"identity": "i1", "v"')
    store = RecordStore(tmp_path / "run" / "records", prior)
    assert store.find("r/good.json", "i1") == {"identity": "i1", "v": 1}
    assert not (tmp_path / "run").exists()  # find writes nothing
    assert store.get("r/stale.json", "i1") is None
    assert store.get("r/torn.json", "i1") is None
    assert store.get("r/absent.json", "i1") is None
    assert store.get("r/good.json", "i1") == {"identity": "i1", "v": 1}
    assert json.loads(store.path("r/good.json").read_text()) == {"identity": "i1", "v": 1}  # copied in
    assert not store.path("r/stale.json").exists()
    # this run's copy wins over the prior's, and without a prior only this run counts
    store.put("r/stale.json", {"v": 3}, "i1")
    assert store.get("r/stale.json", "i1") == {"identity": "i1", "v": 3}
    assert RecordStore(tmp_path / "run" / "records").get("r/good.json", "i1") == {"identity": "i1", "v": 1}
    assert RecordStore(tmp_path / "elsewhere").get("r/good.json", "i1") is None


def test_put_writes_the_identity_atomically(tmp_path):
    store = RunContext(run_dir=tmp_path).records("evals")
    rec = store.put("p/step-000050.json", {"gold": 0.5, "identity": "ignored"}, "abc")
    assert rec == {"gold": 0.5, "identity": "abc"}
    assert json.loads((tmp_path / "evals" / "p" / "step-000050.json").read_text()) == rec
    assert [p.name for p in (tmp_path / "evals" / "p").iterdir()] == ["step-000050.json"]  # no .tmp left


def test_the_context_resolves_the_prior_from_the_checkout():
    store = RunContext(run_dir=Path("/nowhere")).records(
        "records", prior="docs/results/beyond-frontier/records"
    )
    assert (
        store.prior
        == repo_path("docs/results/beyond-frontier/records")
        == RESULTS / "beyond-frontier" / "records"
    )
    assert RunContext(run_dir=Path("/nowhere")).records("records", prior="").prior is None


# ---------------------------------------------------------------------------------------------------------
# the committed records
# ---------------------------------------------------------------------------------------------------------


def _close(a, b, path=""):
    """Differences between two JSON values (floats to 1e-9 relative: the bootstrap draws are the same)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only one side" for k in set(a) ^ set(b)]
        return out + [d for k in set(a) & set(b) for d in _close(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, int | float) and isinstance(b, int | float)
        return [] if ok and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def _records_only(name: str, prior_key: str, prior: str, ctx: RunContext) -> tuple[list[dict], dict]:
    from privalign.experiments.registry import get_experiment
    from privalign.experiments.runner import cell_seed, resolve_config

    exp = get_experiment(name)
    cfg = resolve_config(exp, None, False, {"records_only": True, prior_key: prior})
    recs: list[dict] = []
    for i, cell in enumerate(exp.cells(cfg, ctx)):
        if cell["cell"] == "data":  # the private pairs' cell (not committed): its fields are compared apart
            continue
        got = exp.run_cell(cell, cfg, ctx, cell_seed(cfg["seed"], i))
        recs += got
        if cell["cell"] == "reference":  # p2-rlhf's policies read the reference from results.jsonl
            (ctx.run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
    return recs, exp.summarize(recs, cfg)


def test_committed_frontier_records_are_found_and_summarise_to_the_committed_summary(tmp_path):
    from privalign.experiments import frontier as fr
    from privalign.experiments.registry import get_experiment
    from privalign.experiments.runner import resolve_config

    pytest.importorskip("vaderSentiment")  # the full config's second gold (alt_gold = "vader")
    committed = json.loads((RESULTS / "beyond-frontier" / "summary.json").read_text())
    ctx = RunContext(run_dir=tmp_path)
    cfg = resolve_config(get_experiment("beyond-frontier"), None, False, {})
    # the records' identities hash the public configuration that generates the pairs, never the pairs: the
    # pairs themselves (not committed) are not needed, only their number (DPO's step schedule)
    ctx.cache["pairs"] = {
        "data_identity": identity({k: cfg.get(k) for k in fr._DATA_KEYS}),
        "pairs": SimpleNamespace(prompts=[None] * cfg["n_pairs"]),
    }
    prior = "docs/results/beyond-frontier/records"
    ref = json.loads((RESULTS / "beyond-frontier" / "records" / "reference.json").read_text())
    assert ctx.records("records", prior=prior).find("reference.json", ref["identity"]) is not None
    recs, summary = _records_only("beyond-frontier", "prior_results", prior, ctx)
    curves = [r for r in recs if r.get("kind") == "frontier"]
    assert {r["route"] for r in curves} == {c["route"] for c in committed["curves"]}
    data_fields = {"reference_gold", "data"}  # from the data cell (the private pairs' metadata)
    drop = {"experiment", "title", "paper", "quick", *data_fields}
    mine = {k: v for k, v in summary.items() if k not in data_fields}
    assert _close(mine, {k: v for k, v in committed.items() if k not in drop}) == []
    # the committed files were copied into this run (the store's prior), not rewritten
    copied = sorted(p.relative_to(ctx.run_dir / "records") for p in (ctx.run_dir / "records").rglob("*.json"))
    assert copied and all((RESULTS / "beyond-frontier" / "records" / p).is_file() for p in copied)
    for p in copied:
        assert (ctx.run_dir / "records" / p).read_bytes() == (
            RESULTS / "beyond-frontier" / "records" / p
        ).read_bytes()


def test_committed_p2_rlhf_evals_are_found_and_summarise_to_the_committed_summary(tmp_path):
    committed = json.loads((RESULTS / "p2-rlhf" / "summary.json").read_text())
    ctx = RunContext(run_dir=tmp_path)
    recs, summary = _records_only("p2-rlhf", "prior_evals", "docs/results/p2-rlhf/evals", ctx)
    assert [r for r in recs if r.get("kind") == "pending"] == []
    assert len([r for r in recs if r.get("kind") == "policy"]) == len(committed["table"])
    drop = {"experiment", "title", "paper", "quick"}
    assert _close(summary, {k: v for k, v in committed.items() if k not in drop}) == []
