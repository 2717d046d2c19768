"""Scored-pool JSONL(.gz) format: round trip, optional meta, streaming validation naming line and field."""

import gzip
import json

import numpy as np
import pytest

from privalign.data.pools import PoolRecord, Response, ScoredPool, iter_pool, read_pool, write_pool
from privalign.errors import DataFormatError

AUTHORS_LINE = {
    "prompt": "Q?",
    "choices": ["a", "b", "c", "d"],
    "subject": "college_mathematics",
    "gt_answer": "B",
    "responses": [
        {"text": "The answer is B", "predicted_answer": "B", "is_correct": True, "proxy_reward": 1.5},
        {"text": "...", "predicted_answer": None, "is_correct": False, "proxy_reward": -0.2},
    ],
}


def test_reads_authors_schema_unchanged(tmp_path):
    p = tmp_path / "pool.jsonl"
    p.write_text(json.dumps(AUTHORS_LINE) + "\n")
    (rec,) = read_pool(p)
    assert rec.gt_answer == "B" and rec.choices == ("a", "b", "c", "d") and rec.meta is None
    assert np.array_equal(rec.true, [1.0, 0.0]) and np.array_equal(rec.proxy, [1.5, -0.2])


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_round_trip_with_meta(tmp_path, suffix):
    recs = [
        PoolRecord(f"p{i}", tuple(Response(f"r{j}", float(j), true_reward=0.5 * j) for j in range(3 + i)))
        for i in range(4)
    ]
    p = tmp_path / ("pool" + suffix)
    assert write_pool(p, recs, meta={"generator": "g", "seed_entropy": "123"}) == 4
    back = list(iter_pool(p))
    assert [r.prompt for r in back] == [r.prompt for r in recs]
    assert back[2].meta["format_version"] == "privalign-pool/1" and back[2].meta["generator"] == "g"
    assert np.array_equal(back[3].true, [0, 0.5, 1.0, 1.5, 2.0, 2.5])
    if suffix.endswith(".gz"):
        with gzip.open(p, "rt") as fh:
            assert json.loads(fh.readline())["prompt"] == "p0"
    pool = ScoredPool.read(p)  # ragged → NaN padded
    assert pool.proxy.shape == (4, 6) and list(pool.counts) == [3, 4, 5, 6] and np.isnan(pool.proxy[0, 3])
    sub, keep = pool.restrict(5)
    assert list(keep) == [2, 3]


@pytest.mark.parametrize(
    "line,where",
    [
        ("{not json", "2: field '<line>'"),
        (json.dumps({"responses": []}), "2: field 'prompt'"),
        (json.dumps({"prompt": "x", "responses": []}), "2: field 'responses'"),
        (json.dumps({"prompt": "x", "responses": [{"text": "a"}]}), "responses[0].proxy_reward' is required"),
        (
            json.dumps({"prompt": "x", "responses": [{"text": "a", "proxy_reward": "high"}]}),
            "responses[0].proxy_reward",
        ),
        (
            json.dumps({"prompt": "x", "responses": [{"text": "a", "proxy_reward": 1, "is_correct": "yes"}]}),
            "responses[0].is_correct",
        ),
        (
            json.dumps(
                {"prompt": "x", "responses": [{"text": "a", "proxy_reward": 1, "true_reward": float("nan")}]}
            ),
            "responses[0].true_reward",
        ),
        (
            json.dumps({"prompt": "x", "responses": [{"text": "a", "proxy_reward": 1}], "meta": 3}),
            "field 'meta'",
        ),
    ],
)
def test_malformed_lines_name_line_and_field(tmp_path, line, where):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(AUTHORS_LINE) + "\n" + line + "\n")
    with pytest.raises(DataFormatError) as ei:
        read_pool(p)
    assert where in str(ei.value) and str(p) in str(ei.value)


def test_empty_and_missing(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n")
    with pytest.raises(DataFormatError, match="empty"):
        read_pool(p)
    with pytest.raises(FileNotFoundError):
        read_pool(tmp_path / "nope.jsonl")


def test_write_is_atomic(tmp_path):
    p = tmp_path / "out.jsonl"
    write_pool(p, [AUTHORS_LINE])
    before = p.read_text()
    with pytest.raises(DataFormatError):
        write_pool(p, [AUTHORS_LINE, {"prompt": "x", "responses": "nope"}])
    assert p.read_text() == before and len(list(tmp_path.iterdir())) == 1
