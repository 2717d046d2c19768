"""The columnar pool cache: same pool as the JSONL reader, bit for bit, for every accepted variant;
same errors; memory-mapped on later reads; rebuilt when the file changes."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from privalign.alignment.synthetic import make_synthetic_pool
from privalign.data.pool_cache import pool_cache_entry, read_scored_pool
from privalign.data.pools import ReadStats, ScoredPool, write_pool
from privalign.errors import DataFormatError


def _same(a: ScoredPool, b: ScoredPool) -> None:
    assert a.proxy.shape == b.proxy.shape and a.proxy.dtype == b.proxy.dtype == np.float64
    assert np.array_equal(a.proxy, b.proxy, equal_nan=True) and np.array_equal(a.true, b.true, equal_nan=True)
    assert np.array_equal(a.counts, b.counts) and a.prompts == b.prompts


def _variants():
    rng = np.random.default_rng(0)
    recs = []
    for i in range(5):
        resp = [
            {
                "text": f"r{j}",
                "proxy_reward": float(rng.normal()),
                "is_correct": bool(rng.random() < 0.4),
                "predicted_answer": "A",
            }
            for j in range(7 + i)
        ]  # ragged
        recs.append({"prompt": f"q{i}", "choices": ["a", "b"], "gt_answer": "A", "responses": resp})
    recs[1]["responses"][2]["is_correct"] = 1  # 0/1 (coerced, counted)
    recs[2]["responses"][0]["proxy_reward"] = None  # unscored (skipped, counted)
    recs[3]["responses"][1] = {"text": "t", "proxy_reward": 3, "true_reward": 0.25}  # int proxy, true_reward
    recs[4]["responses"][0]["proxy_reward"] = 7  # an int
    recs.append({"prompt": "none scored", "responses": [{"text": "x", "proxy_reward": None}]})
    return recs


@pytest.mark.parametrize("form", ["jsonl", "json_array", "gz"])
def test_same_pool_and_stats_as_the_reader(tmp_path, form):
    recs = _variants()
    if form == "json_array":
        path = tmp_path / "p.json"
        path.write_text(json.dumps(recs))
    elif form == "gz":
        path = tmp_path / "p.jsonl.gz"
        write_pool(path, [r for r in recs[:1]] + [recs[4]])
    else:
        path = tmp_path / "p.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    s0, s1, s2 = ReadStats(), ReadStats(), ReadStats()
    ref = ScoredPool.read(path, stats=s0)
    cold = read_scored_pool(path, stats=s1, cache_dir=tmp_path / "c")
    warm = read_scored_pool(path, stats=s2, cache_dir=tmp_path / "c")
    _same(ref, cold)
    _same(ref, warm)
    assert s0.to_dict() == s1.to_dict() == s2.to_dict()
    assert isinstance(warm.proxy.base, np.memmap) and not warm.proxy.flags.writeable


def test_synthetic_pool_round_trip(tmp_path):
    pool = make_synthetic_pool(4, 300, random_state=1)
    path = tmp_path / "s.jsonl"
    write_pool(path, pool.to_records())
    _same(ScoredPool.read(path), read_scored_pool(path, cache_dir=tmp_path / "c"))


@pytest.mark.parametrize(
    "line, where",
    [
        ('{"prompt": "q", "responses": [{"text": "a", "proxy_reward": true}]}', "responses[0].proxy_reward"),
        (
            '{"prompt": "q", "responses": [{"text": "a", "proxy_reward": 1.0, "is_correct": 2}]}',
            "responses[0].is_correct",
        ),
        ('{"prompt": "q", "responses": [{"text": "a"}]}', "responses[0].proxy_reward"),
        (
            '{"prompt": "q", "responses": [{"text": "a", "proxy_reward": Infinity}]}',
            "responses[0].proxy_reward",
        ),
        ('{"prompt": "q", "responses": [{"text": "a", "proxy_reward": 1e999}]}', "responses[0].proxy_reward"),
        ('{"prompt": 3, "responses": []}', "prompt"),
        ('{"prompt": "q", "choices": "abc", "responses": [{"text": "a", "proxy_reward": 1.0}]}', "choices"),
        ('{"prompt": "q", "responses": [1]}', "responses[0]"),
        ("not json", "<line>"),
    ],
)
def test_same_errors_and_nothing_cached(tmp_path, line, where):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"prompt": "ok", "responses": [{"text": "a", "proxy_reward": 0.5, "is_correct": true}]}\n'
        + line
        + "\n"
    )
    with pytest.raises(DataFormatError) as ref:
        ScoredPool.read(path)
    with pytest.raises(DataFormatError) as got:
        read_scored_pool(path, cache_dir=tmp_path / "c")
    assert str(got.value) == str(ref.value) and f"bad.jsonl:2: field '{where}'" in str(got.value)
    assert not (tmp_path / "c").exists() or not any(p.name[0] != "." for p in (tmp_path / "c").iterdir())


def test_missing_and_empty(tmp_path):
    with pytest.raises(FileNotFoundError, match="pool file not found"):
        read_scored_pool(tmp_path / "nope.jsonl", cache_dir=tmp_path / "c")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataFormatError, match="the pool is empty"):
        read_scored_pool(tmp_path / "e.jsonl", cache_dir=tmp_path / "c")


def test_rebuilt_when_the_pool_changes(tmp_path):
    path = tmp_path / "p.jsonl"
    write_pool(path, make_synthetic_pool(2, 10, random_state=0).to_records())
    first = pool_cache_entry(path, cache_dir=tmp_path / "c")
    a = read_scored_pool(path, cache_dir=tmp_path / "c")
    assert first.is_dir()
    time.sleep(0.01)
    write_pool(path, make_synthetic_pool(3, 10, random_state=1).to_records())  # atomic replace
    second = pool_cache_entry(path, cache_dir=tmp_path / "c")
    b = read_scored_pool(path, cache_dir=tmp_path / "c")
    assert second != first and second.is_dir() and not first.exists()  # the stale entry is removed
    assert a.proxy.shape[0] == 2 and b.proxy.shape[0] == 3
    _same(ScoredPool.read(path), b)
    # an in-place edit that keeps size and mtime still changes the ctime, hence the entry
    st = path.stat()
    text = path.read_text()
    path.write_text(text.replace('"prompt-0"', '"prompt-X"'))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    c = read_scored_pool(path, cache_dir=tmp_path / "c")
    assert c.prompts[0] == "prompt-X"
