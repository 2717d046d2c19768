"""Benchmark: p2-rlhf's two costs on the CPU — a GRPO step (TRL GRPO + LoRA r=16 on SmolLM2-135M-Instruct,
1 prompt × 4 samples × 16 new tokens) and a checkpoint evaluation (``privalign.experiments.rlhf.
_evaluate_policy``: sampling with log-probabilities, KL to the reference, MiniLM gold, win rate, best-of-N) —
for two source trees in the same run: this checkout ("after") and a baseline tree ("before", e.g. made by
``git archive``), each in its own process.

Usage:
  python benchmarks/bench_grpo_step.py --before-src DIR [--steps 6] [--eval-prompts 16] [--eval-samples 2]
                                       [--rounds 1] [--threads 1] [--base smollm2|HFDIR] [--out FILE.json]

  DIR: a source tree with ``src/privalign`` (``git archive COMMIT | tar -x -C DIR``).

Both sides load the same base model (``--base smollm2``: read from the GGUF once by the parent and saved as
an HF directory that both load), the same RR-IHT reward model (ε = 8, fitted once by the parent on held-out
IMDb pairs), the same train prompts (p2-rlhf's: IMDb openings 0..) and eval prompts (offset 64, the first
``--eval-prompts`` of p2-rlhf's 64), and the shipped reference record
(``docs/results/p2-rlhf/evals/reference.json``, its first ``--eval-prompts`` rows) for win rate and best-of-N.
A side runs ``--steps`` GRPO steps and then evaluates the live (LoRA-wrapped) policy at the last step, as the
experiment's checkpoint callback does. Reported per side: CPU and wall seconds of each GRPO step (the first
step is reported but left out of the median: it includes warm-up), of the evaluation, and the ratios
before/after. With one torch thread, CPU seconds measure the work done whatever the load (memory-bandwidth
contention from other processes still shows); wall seconds depend on the load. ``--rounds`` alternates
before/after that many times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "results" / "p2-rlhf" / "evals" / "reference.json"
GOLD = ROOT / "pools" / "imdb-gold-minilm-logreg.json"


def _side(args: argparse.Namespace) -> dict:
    """One side in this process (``PYTHONPATH`` selects the source tree); returns its record."""
    import torch

    torch.set_num_threads(args.threads)
    from transformers import TrainerCallback

    import privalign
    from privalign.experiments.base import RunContext
    from privalign.experiments.rlhf import _evaluate_policy
    from privalign.models.scorers import LinearRewardScorer
    from privalign.rlhf.prompts import imdb_rl_prompts
    from privalign.rlhf.rewards import PrivateReward
    from privalign.rlhf.train import AlignConfig, align_policy, load_base_model

    base = load_base_model(args.base)
    base[0].eval()
    reward = PrivateReward(args.reward)
    prompts, info = imdb_rl_prompts(64)
    ev_prompts, _ = imdb_rl_prompts(64, offset=64)
    ev_prompts = ev_prompts[: args.eval_prompts]
    ref = json.loads(Path(args.reference).read_text(encoding="utf-8"))
    ref = {"gold": ref["gold"][: args.eval_prompts], "texts": ref["texts"][: args.eval_prompts]}
    cfg = {
        "seed": 42,
        "eval_samples": args.eval_samples,
        "max_new_tokens": 16,
        "n_bootstrap": 2000,
        "bon_ns": [1, 2, 4, 8, 16],
    }
    ctx = RunContext(run_dir=Path(args.tmp))
    ctx.cache["data"] = {"eval_prompts": ev_prompts, "gold": LinearRewardScorer.load(GOLD)}
    ctx.cache["base"] = base
    steps: list[dict] = []
    evals: list[dict] = []

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.cpu, self.wall = time.process_time(), time.perf_counter()

        def on_step_end(self, a, state, control, model=None, **kw):
            cpu, wall = time.process_time(), time.perf_counter()
            steps.append({"step": int(state.global_step), "cpu": cpu - self.cpu, "wall": wall - self.wall})
            if state.global_step == args.steps:
                rec = _evaluate_policy(model, cfg, ctx, {"reward": reward}, ref, args.steps)
                model.train()
                evals.append(
                    {
                        "cpu": time.process_time() - cpu,
                        "wall": time.perf_counter() - wall,
                        "kl": rec["kl"],
                        "gold_mean": rec["gold_mean"],
                        "mean_tokens": rec["mean_tokens"],
                    }
                )
            self.cpu, self.wall = time.process_time(), time.perf_counter()

    acfg = AlignConfig(
        steps=args.steps,
        beta=0.05,
        learning_rate=1e-4,
        num_generations=4,
        prompts_per_step=1,
        max_new_tokens=16,
        lora_rank=16,
        lora_alpha=32.0,
        seed=1234,
        save_steps=10**6,
    )
    align_policy(
        reward,
        prompts,
        info,
        Path(args.tmp) / "run",
        acfg,
        base=base,
        save_policy=False,
        progress=False,
        callbacks=[Timer()],
    )
    return {
        "privalign": str(Path(privalign.__file__).resolve().parents[1]),
        "steps": steps,
        "eval": evals[0],
        "load1": os.getloadavg()[0],
    }


def _prepare(args: argparse.Namespace, tmp: Path) -> tuple[str, str]:
    """The base model directory and the reward model file both sides load."""
    from _rlhf_common import fit_imdb_rriht_reward

    rm = fit_imdb_rriht_reward(tmp)
    base = args.base
    if base == "smollm2":
        import torch

        torch.set_num_threads(args.threads)
        from privalign.rlhf.train import load_base_model

        m, tok, _ = load_base_model("smollm2")
        base = str(tmp / "base")
        m.save_pretrained(base, safe_serialization=True)
        tok.save_pretrained(base)
    return base, str(rm)


def _summary(rec: dict) -> dict:
    later = rec["steps"][1:] or rec["steps"]
    return {
        "step_cpu_median": statistics.median(s["cpu"] for s in later),
        "step_wall_median": statistics.median(s["wall"] for s in later),
        "first_step_cpu": rec["steps"][0]["cpu"],
        "eval_cpu": rec["eval"]["cpu"],
        "eval_wall": rec["eval"]["wall"],
        "eval_kl": rec["eval"]["kl"],
        "eval_gold_mean": rec["eval"]["gold_mean"],
        "load1_end": rec["load1"],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-src", required=False, help="baseline source tree (holds src/privalign)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--eval-prompts", type=int, default=16)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--base", default="smollm2")
    ap.add_argument("--reference", default=str(REFERENCE))
    ap.add_argument("--out", default=None)
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reward", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        print("RESULT " + json.dumps(_side(args)), flush=True)
        return
    if not args.before_src or not (Path(args.before_src) / "src" / "privalign").is_dir():
        ap.error(f"--before-src must be a source tree holding src/privalign. Got {args.before_src!r}.")
    tmp = Path(tempfile.mkdtemp(prefix="bench_grpo_step_"))
    t0 = time.perf_counter()
    base, rm = _prepare(args, tmp)
    sides = {"before": str(Path(args.before_src).resolve() / "src"), "after": str(ROOT / "src")}
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for name, src in sides.items():
            d = tmp / f"{name}-{r}"
            d.mkdir()
            cmd = [sys.executable, str(Path(__file__).resolve()), "--side", "--base", base, "--reward", rm]
            cmd += ["--tmp", str(d), "--steps", str(args.steps), "--threads", str(args.threads)]
            cmd += ["--eval-prompts", str(args.eval_prompts), "--eval-samples", str(args.eval_samples)]
            cmd += ["--reference", args.reference]
            env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": str(args.threads)}
            print(
                f"[{time.strftime('%H:%M:%S')}] {name} round {r + 1}, load {os.getloadavg()}", file=sys.stderr
            )
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                sys.stderr.write(p.stderr[-4000:])
                raise SystemExit(f"side {name} failed (exit {p.returncode})")
            rec = json.loads(line[len("RESULT ") :])
            if not rec["privalign"].startswith(src):
                raise SystemExit(f"side {name} imported privalign from {rec['privalign']}, not {src}")
            runs[name].append(rec)
            print(json.dumps({name: _summary(rec)}), file=sys.stderr)
    summ = {k: [_summary(r) for r in v] for k, v in runs.items()}

    def med(side: str, key: str) -> float:
        return statistics.median(s[key] for s in summ[side])

    ratios = {
        f"{k}_before_over_after": med("before", k) / med("after", k)
        for k in ("step_cpu_median", "step_wall_median", "eval_cpu", "eval_wall")
    }
    out = {
        "config": {k: v for k, v in vars(args).items() if k not in ("side", "reward", "tmp")},
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "loadavg_end": os.getloadavg(),
        "seconds_total": time.perf_counter() - t0,
        "summary": summ,
        "ratios": ratios,
        "runs": runs,
    }
    print(json.dumps({"summary": summ, "ratios": ratios}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
