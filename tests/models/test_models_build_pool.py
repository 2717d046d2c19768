"""The pool builder: end to end (CLI, tiny local model), resume after kill -9, torn last lines, refusal of a
foreign work file, retries after a mid-batch failure, text-hygiene counts, and the Ray backend's
equivalence with the local one."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _models_helpers import make_tiny_causal_lm

from privalign.cli import main as cli_main
from privalign.data.datasets import Example
from privalign.data.pools import read_pool
from privalign.errors import PrivacyParameterError
from privalign.models.generators import Completion
from privalign.pipeline.build_pool import PoolConfig, build_pool, manifest_path, work_path


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return make_tiny_causal_lm(tmp_path_factory.mktemp("tinylm"), hidden=64, layers=2)


def _cli_args(model: Path, out: Path, *, n=4, num_prompts=3, batch=3, extra=()):
    return [
        "build-pool",
        "--dataset",
        "imdb",
        "--model",
        str(model),
        "--n",
        str(n),
        "--num-prompts",
        str(num_prompts),
        "--max-new-tokens",
        "5",
        "--batch-size",
        str(batch),
        "--proxy-reward",
        "vader",
        "--true-reward",
        "clean",
        "--seed",
        "5",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def _lines(path: Path) -> list[dict]:
    op = gzip.open if path.suffix == ".gz" else open
    with op(path, "rt", encoding="utf-8") as fh:
        return [json.loads(x) for x in fh]


def test_cli_end_to_end_tiny(tiny_lm, tmp_path, capsys):
    out = tmp_path / "pool.jsonl.gz"
    assert cli_main(_cli_args(tiny_lm, out, extra=["--json"])) == 0
    manifest = json.loads(capsys.readouterr().out)
    recs = read_pool(out)  # engineer C's reader accepts it
    assert len(recs) == 3 and all(len(r.responses) == 4 for r in recs)
    assert all(0 <= x.proxy_reward <= 1 and 0 <= x.true_reward <= 1 for r in recs for x in r.responses)
    assert [r.meta["prompt_index"] for r in recs] == [0, 1, 2]
    m = json.loads(manifest_path(out).read_text())
    assert m == json.loads(json.dumps(manifest, default=str))
    assert m["num_candidates"] == 12 and m["config"]["seed"] == 5 and "commit" in m["git"]
    assert set(m["counts"]) == {"empty", "non_utf8", "over_long", "hit_max_new_tokens"}
    assert m["versions"]["transformers"] and m["generator"]["sampling"]["max_new_tokens"] == 5
    assert not work_path(out).exists()
    # deterministic: the same command again gives the same pool, and a shorter pool is a prefix
    out2 = tmp_path / "again.jsonl.gz"
    capsys.readouterr()
    assert cli_main(_cli_args(tiny_lm, out2, num_prompts=2)) == 0
    assert (
        "capacity reading:" in capsys.readouterr().err
    )  # the build's report says whether it can show hacking
    a, b = _lines(out), _lines(out2)
    assert [r["responses"] for r in a[:2]] == [r["responses"] for r in b]


def test_cli_bad_input_is_refused_before_work(tiny_lm, tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert cli_main(_cli_args(tiny_lm, out, extra=[])[:-2] + ["--out", str(tmp_path / "p.txt")]) == 2
    assert "must end in .jsonl" in capsys.readouterr().err
    assert (
        cli_main([*_cli_args(tiny_lm, out)[:13], "--proxy-reward", "nonsense", *_cli_args(tiny_lm, out)[15:]])
        == 2
    )
    assert "'--proxy-reward' option must be one of" in capsys.readouterr().err  # the flag
    assert not out.exists() and not work_path(out).exists()


@pytest.mark.slow  # 170-290 s on the 2-core box (kills and resumes a CLI subprocess twice)
def test_resume_after_kill_matches_uninterrupted_run(tiny_lm, tmp_path):
    # small batches: many generate() calls per prompt, so the kill lands between prompts, not after the end
    n, num, batch = 24, 6, 2
    ref = tmp_path / "ref.jsonl"
    assert cli_main(_cli_args(tiny_lm, ref, n=n, num_prompts=num, batch=batch)) == 0
    out = tmp_path / "killed.jsonl"
    cmd = [sys.executable, "-m", "privalign", *_cli_args(tiny_lm, out, n=n, num_prompts=num, batch=batch)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wp = work_path(out)
    deadline = time.time() + 600
    killed_after = None
    while time.time() < deadline and proc.poll() is None:
        if (
            wp.exists() and wp.read_text(encoding="utf-8", errors="replace").count("\n") >= 3
        ):  # header + 2 prompts
            os.kill(proc.pid, signal.SIGKILL)
            killed_after = wp.read_text(encoding="utf-8", errors="replace").count("\n") - 1
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert killed_after is not None, "the builder finished before it could be killed; enlarge the run"
    assert not out.exists()
    # simulate a torn write on top of the kill
    with open(wp, "a", encoding="utf-8") as fh:
        fh.write('{"prompt": "torn')
    assert cli_main(_cli_args(tiny_lm, out, n=n, num_prompts=num, batch=batch)) == 0
    got, want = _lines(out), _lines(ref)
    idx = [r["meta"]["prompt_index"] for r in got]
    assert idx == list(range(num))  # no duplicates, no losses, in order
    assert [r["responses"] for r in got] == [r["responses"] for r in want]
    assert json.loads(manifest_path(out).read_text())["resumed_prompts"] >= 2


def _config(**kw) -> PoolConfig:
    base = dict(
        dataset="unit",
        n=3,
        seed=1,
        generator={"kind": "fake"},
        proxy_reward="vader",
        true_reward="none",
        num_prompts=3,
    )
    base.update(kw)
    return PoolConfig(**base)


class _FlakyGenerator:
    """Fails on the first attempt at prompt 1 (a mid-batch fault), then works; yields tricky texts."""

    model_id, params = "flaky", None

    def __init__(self, fail_times=1):
        self.fail_times = fail_times
        self.calls = 0

    def generate(self, prompts, n, *, seed, prompt_indices=None):
        self.calls += 1
        i = prompt_indices[0]
        if i == 1 and self.fail_times > 0:
            self.fail_times -= 1
            raise RuntimeError("CUDA-like failure in the middle of a batch")
        texts = ["", "bad \ud800 surrogate", "x" * 50][:n]
        return [
            [
                Completion(text=t, num_tokens=3, finish_reason="length" if k == 2 else "stop")
                for k, t in enumerate(texts)
            ]
        ]

    def describe(self):
        return {"backend": "fake"}


def test_retry_after_mid_batch_failure_and_hygiene_counts(tmp_path):
    from privalign.models.scorers import VaderScorer

    ex = [Example(prompt=f"p{i}") for i in range(3)]
    out = tmp_path / "p.jsonl.gz"
    gen = _FlakyGenerator(fail_times=1)
    m = build_pool(_config(max_chars=20), ex, out, generator=gen, proxy=VaderScorer(), progress=False)
    assert gen.calls == 4  # 3 prompts + 1 retry
    assert m["counts"] == {"empty": 3, "non_utf8": 3, "over_long": 3, "hit_max_new_tokens": 3}
    texts = [r["text"] for rec in _lines(out) for r in rec["responses"]]
    assert "bad \ufffd surrogate" in texts and all(len(t) <= 20 for t in texts)


def test_failure_after_retries_stops_cleanly_and_rerun_resumes(tmp_path):
    from privalign.models.scorers import VaderScorer

    ex = [Example(prompt=f"p{i}") for i in range(3)]
    out = tmp_path / "p.jsonl"
    with pytest.raises(RuntimeError, match="CUDA-like"):
        build_pool(
            _config(),
            ex,
            out,
            generator=_FlakyGenerator(fail_times=5),
            proxy=VaderScorer(),
            max_retries=1,
            progress=False,
        )
    assert not out.exists()
    assert len(_lines(work_path(out))) == 2  # header + prompt 0 kept
    gen = _FlakyGenerator(fail_times=0)
    m = build_pool(_config(), ex, out, generator=gen, proxy=VaderScorer(), progress=False)
    assert gen.calls == 2 and m["resumed_prompts"] == 1
    assert [r["meta"]["prompt_index"] for r in _lines(out)] == [0, 1, 2]


def test_work_file_of_another_configuration_is_refused(tmp_path):
    from privalign.models.scorers import VaderScorer

    ex = [Example(prompt=f"p{i}") for i in range(3)]
    out = tmp_path / "p.jsonl"
    with pytest.raises(RuntimeError):
        build_pool(
            _config(),
            ex,
            out,
            generator=_FlakyGenerator(fail_times=9),
            proxy=VaderScorer(),
            max_retries=0,
            progress=False,
        )
    with pytest.raises(PrivacyParameterError, match="different pool configuration"):
        build_pool(
            _config(seed=2), ex, out, generator=_FlakyGenerator(0), proxy=VaderScorer(), progress=False
        )


@pytest.mark.ray
def test_ray_backend_equals_local_backend(tiny_lm, tmp_path):
    local = tmp_path / "local.jsonl"
    ray_out = tmp_path / "ray.jsonl"
    assert cli_main(_cli_args(tiny_lm, local, n=4, num_prompts=3)) == 0
    args = _cli_args(tiny_lm, ray_out, n=4, num_prompts=3, extra=["--backend", "ray", "--ray-num-cpus", "2"])
    assert cli_main(args) == 0
    a, b = _lines(local), _lines(ray_out)
    assert [r["responses"] for r in a] == [r["responses"] for r in b]
    assert [r["meta"]["prompt_index"] for r in b] == [0, 1, 2]
    assert json.loads(manifest_path(ray_out).read_text())["backend"] == "ray"


def test_bon_selection_law_matches_brute_force(rng):
    import itertools

    import numpy as np

    from privalign.pipeline.analysis import _expected_true, bon_selection_law

    m = 7
    for N in range(1, m + 1):
        law = bon_selection_law(m, N)
        assert law.sum() == pytest.approx(1.0) and np.all(law[: N - 1] == 0)
    proxy, true = rng.permutation(m).astype(float), rng.normal(size=m)
    for N in (1, 3, 7):
        brute = np.mean(
            [true[list(c)][np.argmax(proxy[list(c)])] for c in itertools.combinations(range(m), N)]
        )
        assert _expected_true(proxy, true, N) == pytest.approx(brute, rel=1e-12)


class _CountingGenerator:
    """Deterministic fake generator that counts its calls (one per prompt)."""

    model_id, params = "counting", None

    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at = 0, fail_at

    def generate(self, prompts, n, *, seed, prompt_indices=None):
        self.calls += 1
        i = prompt_indices[0]
        if i == self.fail_at:
            raise ValueError("the generator failed before any prompt finished")
        return [[Completion(text=f"prompt {i} candidate {j} seed {seed}", num_tokens=5) for j in range(n)]]

    def describe(self):
        return {"backend": "counting"}


def test_finished_pool_is_not_regenerated(tmp_path):
    from privalign.models.scorers import VaderScorer

    ex = [Example(prompt=f"p{i}") for i in range(4)]
    out = tmp_path / "p.jsonl.gz"
    g1 = _CountingGenerator()
    m1 = build_pool(_config(num_prompts=2), ex, out, generator=g1, proxy=VaderScorer(), progress=False)
    assert g1.calls == 2 and len(m1["pool_sha256"]) == 64
    before = (out.read_bytes(), out.stat().st_mtime_ns)
    g2 = _CountingGenerator()
    m2 = build_pool(_config(num_prompts=2), ex, out, generator=g2, proxy=VaderScorer(), progress=False)
    assert g2.calls == 0 and m2["reused"] is True  # the same command again: nothing regenerated or rewritten
    assert (out.read_bytes(), out.stat().st_mtime_ns) == before
    # more prompts: the finished ones are reused, only the new ones are generated
    g3 = _CountingGenerator()
    m3 = build_pool(_config(num_prompts=4), ex, out, generator=g3, proxy=VaderScorer(), progress=False)
    assert g3.calls == 2 and m3["resumed_prompts"] == 2
    assert [r["meta"]["prompt_index"] for r in _lines(out)] == [0, 1, 2, 3]
    # a pool edited after it was built (hash mismatch) is not trusted: it is rebuilt
    with gzip.open(out, "wt", encoding="utf-8") as fh:
        fh.write("")
    g4 = _CountingGenerator()
    build_pool(_config(num_prompts=4), ex, out, generator=g4, proxy=VaderScorer(), progress=False)
    assert g4.calls == 4 and len(_lines(out)) == 4


def test_failed_start_leaves_no_work_file_and_corrected_command_runs(tmp_path):
    from privalign.models.scorers import VaderScorer

    ex = [Example(prompt=f"p{i}") for i in range(2)]
    out = tmp_path / "p.jsonl"
    with pytest.raises(ValueError, match="before any prompt"):
        build_pool(
            _config(num_prompts=2),
            ex,
            out,
            generator=_CountingGenerator(fail_at=0),
            proxy=VaderScorer(),
            max_retries=0,
            progress=False,
        )
    assert not work_path(out).exists() and not out.exists()
    m = build_pool(
        _config(num_prompts=2, seed=9),
        ex,
        out,
        generator=_CountingGenerator(),
        proxy=VaderScorer(),
        progress=False,
    )
    assert m["num_prompts"] == 2
    # a header-only work file left by an older version (another configuration, no finished prompt) does not
    # block
    out2 = tmp_path / "q.jsonl"
    work_path(out2).write_text(json.dumps({"_header": "0123456789abcdef"}) + "\n", encoding="utf-8")
    build_pool(
        _config(num_prompts=2), ex, out2, generator=_CountingGenerator(), proxy=VaderScorer(), progress=False
    )
    assert len(_lines(out2)) == 2


def test_cli_bad_model_leaves_nothing_that_blocks_the_corrected_command(tiny_lm, tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    args = _cli_args(tiny_lm, out)
    bad = [*args]
    bad[bad.index("--model") + 1] = str(tmp_path / "no-such-model")
    assert cli_main(bad) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "Traceback" not in err
    assert not work_path(out).exists()
    assert cli_main(args) == 0 and len(read_pool(out)) == 3
