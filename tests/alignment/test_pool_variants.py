"""Issue 16, problem 7: "use any pool".

* The authors' documented pool variants are read (``is_correct`` as 0/1, null ``proxy_reward``, one JSON array
  file) and what was coerced or skipped is counted, in the run manifest too.
* A reproduce config with only ``pool = FILE`` (relative to the config file) runs: N up to what the pool
  supports.
* ``simulate`` parses ``--score-range -4,16`` and reports what it clips.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from privalign.cli import main
from privalign.data.pools import ReadStats, ScoredPool
from privalign.errors import DataFormatError


def _records(n_prompts=6, n=20, seed=0):
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n_prompts):
        resp = []
        for j in range(n):
            ok = int(rng.random() < 0.4)
            resp.append({"text": f"r{j}", "proxy_reward": float(rng.normal() + ok), "is_correct": ok})  # 0/1
        resp[0]["proxy_reward"] = None  # an unscored response
        recs.append({"prompt": f"q{i}", "gt_answer": "A", "responses": resp})
    recs.append(
        {"prompt": "all unscored", "responses": [{"text": "x", "proxy_reward": None, "is_correct": 1}]}
    )
    return recs


def test_authors_variants_are_read_and_counted(tmp_path):
    recs = _records()
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in recs))
    arr = tmp_path / "p.json"
    arr.write_text(json.dumps(recs, indent=1))
    for path, is_array in ((jsonl, False), (arr, True)):
        st = ReadStats()
        pool = ScoredPool.read(path, stats=st)
        assert pool.proxy.shape[0] == 6 and list(pool.counts) == [19] * 6
        assert st.is_correct_coerced == 6 * 19 and st.responses_skipped_null_proxy == 7
        assert st.prompts_skipped_no_scored_response == 1 and st.json_array_file is is_array
        assert set(np.unique(pool.true[np.isfinite(pool.true)])) <= {0.0, 1.0}
        assert "coerced 114 'is_correct'" in st.describe()


def test_strict_values_still_fail_and_name_the_field(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(
        json.dumps({"prompt": "q", "responses": [{"text": "a", "proxy_reward": 1.0, "is_correct": 2}]}) + "\n"
    )
    with pytest.raises(DataFormatError, match=r"bad.jsonl:1: field 'responses\[0\].is_correct'"):
        ScoredPool.read(p)


def test_simulate_reports_read_counts_and_clipping_and_parses_negative_ranges(tmp_path, capsys):
    p = tmp_path / "p.json"
    p.write_text(json.dumps(_records(n=40)))
    rc = main(
        [
            "simulate",
            "--pool",
            str(p),
            "--methods",
            "bon,privbon",
            "--replicates",
            "2",
            "--score-range",
            "-1,1",
            "--out",
            str(tmp_path / "s"),
            "--no-progress",
            "--json",
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    out = json.loads(cap.out)
    assert (
        out["pool_read"]["responses_skipped_null_proxy"] == 7
        and out["pool_read"]["is_correct_coerced"] == 6 * 39
    )
    assert out["max_n"] == 32  # 39 candidates per prompt: the largest power of two the pool supports
    assert out["transform"] == "global_z" and 0 < out["clipped_fraction"] < 1
    assert "are clipped" in cap.err and "skipped 7 responses" in cap.err
    assert (
        main(
            [
                "simulate",
                "--pool",
                str(p),
                "--methods",
                "bon",
                "--replicates",
                "2",
                "--score-range",
                "-4,16",
                "--out",
                str(tmp_path / "s2"),
                "--no-progress",
                "--json",
            ]
        )
        == 0
    )


def test_reproduce_with_only_a_relative_pool_uses_what_the_pool_supports(tmp_path, monkeypatch, capsys):
    cfgdir = tmp_path / "cfg"
    cfgdir.mkdir()
    (cfgdir / "mypool.json").write_text(json.dumps(_records(n_prompts=4, n=40)))
    (cfgdir / "my.toml").write_text(
        'pool = "mypool.json"\nreplicates = 2\nmethods = ["BoN", "PrivBoN"]\nmc_draws = 2\n'
        'transform = "global_z"\nscore_low = -3.0\nscore_high = 3.0\nsensitivity = 6.0\n'
    )
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)  # the pool path must resolve against the config file, not the working directory
    rc = main(
        [
            "reproduce",
            "p1-scaling",
            "--config",
            str(cfgdir / "my.toml"),
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    man = json.loads((tmp_path / "run" / "manifest.json").read_text())
    pool_in = man["inputs"]["pool"]
    assert pool_in["path"] == str((cfgdir / "mypool.json").resolve())
    assert (
        pool_in["read"]["is_correct_coerced"] == 4 * 39
        and pool_in["read"]["responses_skipped_null_proxy"] == 5
    )
    rows = [
        json.loads(ln) for ln in (tmp_path / "run" / "results.jsonl").read_text().splitlines() if ln.strip()
    ]
    assert max(r["N"] for r in rows if "N" in r) == 32  # 39 candidates: N up to 2^5, not the default 2^12
