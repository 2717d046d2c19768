"""Benchmark: the CPU cost of each ``reproduce beyond-frontier`` route's private fit as a function of the
number of private pairs n (issue 37: "CPU hours per route and n"), at ε = 8, one seed, under the frontier's
packaged configuration (``experiments/configs/beyond_frontier.toml``).

Usage:
  OMP_NUM_THREADS=1 nice python benchmarks/bench_frontier_routes.py [--ns 400,2000,8000] [--trm-ns 400]
      [--gen-prompts 32] [--policy-pairs 24] [--grpo-steps 3] [--out-json F] [--out-md F]

What is measured (CPU seconds by ``time.process_time`` with torch and BLAS pinned to one thread, so robust to
the load of a shared machine; wall seconds beside them):

* **Pair generation** (the frontier's own ``_generate_pairs``: two SmolLM2 completions per prompt, 16 new
  tokens, labelled by a Bradley–Terry draw from the MiniLM gold) on ``--gen-prompts`` pair prompts; the cost
  at n is that per-pair cost × n (extrapolated: generation is per prompt in batches of 32, linear in n).
* **Reward-model fits** (the frontier's ``routes._reward.fit_rm``, as every best-of-n/GRPO/PrivBoN cell calls
  it: featurising, the fit, saving the model and the eval/GRPO prompt-overlap check) at each n: the
  non-private ``MLE`` (the **baseline**; it is also PrivBoN's fit), ``DenseRR``, ``RRIHT``, ``SampleDPIHT``,
  ``DPSGDLinear`` (median of ``--repeats`` fits); the MiniLM ``TRM-label``/``TRM-sample`` at ``--trm-ns``
  only, and at the other n extrapolated by their step count ⌈epochs·n/batch⌉
  (:class:`~privalign.estimation.transformer.DPTransformerRM`) × the measured CPU per step.
* **Best-of-n evaluation** (scoring the 80 eval prompts × 16 reference samples with the fitted model, then the
  exact best-of-n law at every n of ``bon_ns``) and PrivBoN's exact law on the clipped MLE scores.
* **Policy routes** are not trained at scale: the CPU of an optimiser step is measured on ``--policy-pairs``
  pairs (DPO non-private / label-DP / sample-DP with the frontier's DPO settings on SmolLM2-135M; a GRPO step
  with its settings and the RRIHT reward model) and multiplied by the step count the frontier's own route
  classes give at n (``DPORoute.steps``: epochs·⌊n/batch⌋; ``PROPSRoute``: Σ over the stages of
  epochs·⌊n_s/batch⌋; ``DPPrefSynRoute``: epochs·⌊grpo_prompts/batch⌋, independent of n; ``GRPORoute``:
  ``grpo_steps``). These rows are marked *extrapolated*; checkpoint evaluations are excluded everywhere.

The pairs the fits see at n: the frontier's own pair prompts for n (``frontier._prompts``), with stand-in
completions (12-word windows of fit-part IMDb reviews, one from a positive and one from a negative review;
the positive one chosen with probability 0.75), because generating 8,000 pairs with SmolLM2 takes ≈ 1 h of
this machine. A fit's cost depends on n and the texts' lengths, which the stand-ins match (16 tokens ≈ 12
words); the reference samples are stand-ins of the same kind. Progress lines go to stderr; the JSON record and
a Markdown table are written to ``--out-json``/``--out-md`` after every n.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from privalign.experiments.base import RunContext  # noqa: E402

EPS = 8.0
LINEAR = ("MLE", "DenseRR", "RRIHT", "SampleDPIHT", "DPSGDLinear")
TRMS = ("TRM-label", "TRM-sample")
WORDS = 12


def log(msg: str) -> None:
    print(f"bench_frontier_routes [{time.strftime('%H:%M:%S')}]: {msg}", file=sys.stderr, flush=True)


def timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    """``(result, CPU s, wall s)`` of ``fn()``."""
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - w


def trm_steps(n: int, epochs: float, batch: int) -> int:
    """:class:`~privalign.estimation.transformer.DPTransformerRM`'s optimiser steps: ⌈epochs·n/batch⌉."""
    return int(math.ceil(epochs * n / batch))


def extrapolate(per_unit_cpu: float, units: int) -> float:
    """The cost of ``units`` steps (or pairs) at the measured CPU per unit."""
    return float(per_unit_cpu) * int(units)


class StubBench:
    """The services a route needs from the frontier (:class:`privalign.experiments.routes.base.Bench`), over
    a pairs file and stand-in reference samples."""

    def __init__(self, cfg: dict, run_dir: Path, pairs: dict, ref: dict, method: str, family: str) -> None:
        self.cfg, self.run_dir, self._pairs, self._ref = cfg, run_dir, pairs, ref
        self.cache: dict = {}
        self.cell = {"route": f"{family}:{method}@{EPS:g}", "family": family, "method": method,
                     "epsilon": EPS, "seed_index": 0}  # fmt: skip

    def pairs(self) -> dict:
        return self._pairs

    def reference(self) -> dict:
        return self._ref

    def base(self) -> tuple:
        raise RuntimeError("the benchmark's bench lends no base policy")

    def seed(self, key: str, k: int | None = None) -> np.random.SeedSequence:
        from privalign.experiments.frontier import route_seed

        return route_seed(self.cfg["seed"], key, 0 if k is None else k)

    def pending(self, what: str) -> None:
        return None

    def records_dir(self) -> Path:
        return self.run_dir / "records"

    def progress(self, total: int) -> Callable[[int], None]:
        return lambda step: None


def standin_texts(k: int, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """``k`` (positive, negative) 12-word windows of fit-part IMDb reviews (never a held-out review, whose
    opening may be an eval/GRPO prompt; never a review's first 10 words, which may be a pair prompt)."""
    from privalign.data.datasets import imdb_split, load_imdb

    texts, labels = load_imdb()
    _, fit = imdb_split()
    pos, neg = fit[labels[fit] == 1], fit[labels[fit] == 0]

    def window(i: int) -> str:
        w = texts[i].split()
        s = int(rng.integers(10, max(11, len(w) - WORDS)))
        return " ".join(w[s : s + WORDS])

    return [window(int(i)) for i in rng.choice(pos, k)], [window(int(i)) for i in rng.choice(neg, k)]


def build_pairs(cfg: dict, n: int, path: Path, rng: np.random.Generator) -> dict:
    """The frontier's pair prompts for n with stand-in completions, written and loaded as the frontier
    does."""
    from privalign.data.preferences_io import load_jsonl_pairs
    from privalign.experiments.frontier import _prompts

    pr = _prompts({**cfg, "n_pairs": n})
    pos, neg = standin_texts(n, rng)
    first = rng.random(n) < 0.75
    with path.open("w", encoding="utf-8") as fh:
        for k, (p, a, b, f) in enumerate(zip(pr["pairs"], pos, neg, first)):
            ch, rj = (a, b) if f else (b, a)
            fh.write(json.dumps({"prompt": p, "chosen": ch, "rejected": rj, "prompt_id": k}) + "\n")
    return {**pr, "path": path, "pairs": load_jsonl_pairs(path)}


def row(
    route: str, kind: str, n: int | None, cpu: float, wall: float | None, how: str, **extra: object
) -> dict:
    return {"route": route, "kind": kind, "n": n, "cpu_s": cpu, "wall_s": wall, "how": how, **extra}


def measure_generation(cfg: dict, args: argparse.Namespace, tmp: Path) -> dict:
    from privalign.experiments.base import RunContext
    from privalign.experiments.frontier import _base, _generate_pairs, _prompts

    ctx = RunContext(run_dir=tmp)
    _, cpu_load, wall_load = timed(lambda: _base(cfg, ctx))
    log(f"base policy loaded: {cpu_load:.0f} CPU s, {wall_load:.0f} s wall")
    prompts = _prompts({**cfg, "n_pairs": args.gen_prompts})["pairs"]
    _, cpu, wall = timed(lambda: _generate_pairs(cfg, ctx, prompts, tmp / "gen" / "pairs.jsonl"))
    per = cpu / len(prompts)
    log(f"generated {len(prompts)} real pairs: {cpu:.1f} CPU s ({per:.2f} per pair), {wall:.0f} s")
    return {"ctx": ctx, "per_pair_cpu": cpu / len(prompts), "per_pair_wall": wall / len(prompts),
            "cpu": cpu, "wall": wall, "pairs": len(prompts), "load_cpu": cpu_load}  # fmt: skip


def fit_rows(
    cfg: dict, n: int, data: dict, ref: dict, tmp: Path, trm: bool, reps: int
) -> tuple[list[dict], dict]:
    """Every reward-model fit at n, its best-of-n evaluation, PrivBoN's law; the RRIHT fit (for GRPO)."""
    from privalign.alignment.priv_bon import privbon_scale
    from privalign.experiments.routes import _reward
    from privalign.experiments.routes.bon import _BoN
    from privalign.experiments.routes.privbon import _Law

    rows: list[dict] = []
    keep: dict = {}
    for method in (*LINEAR, *(TRMS if trm else ())):
        eps = None if method == "MLE" else EPS
        cpus, walls = [], []
        for rep in range(1 if method in TRMS else reps):  # a fresh cache each time: a full fit
            bench = StubBench(cfg, tmp / f"n{n}-{method}-{rep}", data, ref, method, "bon")
            bench.run_dir.mkdir(parents=True, exist_ok=True)
            rm, cpu, wall = timed(partial(_reward.fit_rm, method, eps, 0, bench))
            cpus.append(cpu)
            walls.append(wall)
        cpu, wall = float(np.median(cpus)), float(np.median(walls))
        kind = "non-private" if eps is None else _reward.RM_KINDS[method]
        extra: dict[str, object] = {"cpu_s_each": cpus}
        if method in TRMS:
            extra["steps"] = trm_steps(n, cfg["trm_epochs"], cfg["trm_batch"])
        rows.append(row(f"fit {method}", kind, n, cpu, wall, "measured", **extra))
        log(f"n={n} fit {method}: {cpu:.1f} CPU s, {wall:.1f} s wall")
        xs = [int(x) for x in cfg["bon_ns"]]
        gold = np.asarray(ref["gold"], float)

        def bon(rm: dict = rm, bench: StubBench = bench, xs: list[int] = xs, gold: np.ndarray = gold) -> None:
            sel = _BoN(_reward.ref_scores(rm, bench))
            for x in xs:
                sel.expected(gold, x)
                sel.kl(x)

        _, cpu, wall = timed(bon)
        rows.append(row(f"best-of-n eval {method}", kind, n, cpu, wall, "measured"))
        if method == "MLE":
            B = float(cfg["privbon_bound"])

            def privbon(
                rm: dict = rm,
                bench: StubBench = bench,
                B: float = B,
                xs: list[int] = xs,
                gold: np.ndarray = gold,
            ) -> None:
                u = np.clip(_reward.ref_scores(rm, bench), -B, B) + B
                law = _Law(u, privbon_scale(EPS, 2 * B))
                for x in xs:
                    law.expected(gold, x)
                    law.kl(x)

            _, cpu, wall = timed(privbon)
            rows.append(row("PrivBoN law (MLE scores)", "per-answer", n, cpu, wall, "measured"))
        if method == "RRIHT":
            keep["RRIHT"] = rm
    return rows, keep


def policy_steps(cfg: dict, base: tuple, data: dict, args: argparse.Namespace, tmp: Path, rm: dict) -> dict:
    """CPU per optimiser step of DPO (none/label/sample) and GRPO, and DPPrefSyn's features per pair."""
    import copy

    from transformers import TrainerCallback

    from privalign.data.preferences_io import load_jsonl_pairs
    from privalign.experiments.routes.dpo import dpo_config
    from privalign.rlhf.dpo import train_dpo
    from privalign.rlhf.dpprefsyn import preference_differences
    from privalign.rlhf.train import AlignConfig, _third_party_quiet, align_policy

    model, tok, _ = base
    sub = tmp / "policy-pairs.jsonl"
    lines = Path(data["path"]).read_text(encoding="utf-8").splitlines()[: args.policy_pairs]
    sub.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pairs = load_jsonl_pairs(sub)
    out: dict = {}
    for method in ("none", "label", "sample"):
        stamps: list[float] = []
        c0 = time.process_time()
        with _third_party_quiet():
            train_dpo(
                pairs,
                dpo_config(method, None if method == "none" else EPS, cfg),
                model=copy.deepcopy(model),
                tokenizer=tok,
                rng=np.random.default_rng(0),
                progress=lambda t, n, stamps=stamps: stamps.append(time.process_time()),
            )
        gaps = np.diff(stamps)
        out[f"dpo:{method}"] = {"step_cpu": float(np.median(gaps)), "steps_timed": int(gaps.size),
                                "setup_and_first_step_cpu": stamps[0] - c0}  # fmt: skip
        log(f"DPO {method}: {out[f'dpo:{method}']['step_cpu']:.1f} CPU s per step ({gaps.size} timed)")
    _, cpu, _ = timed(
        lambda: preference_differences(model, tok, pairs, max_length=int(cfg["dpo_max_length"]))
    )
    out["dpprefsyn:features_per_pair_cpu"] = cpu / len(pairs.prompts)
    log(f"DPPrefSyn features: {cpu / len(pairs.prompts):.2f} CPU s per pair")
    cpus: list[float] = []

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.c = time.process_time()

        def on_step_end(self, a: object, state: object, control: object, **kw: object) -> None:
            cpus.append(time.process_time() - self.c)
            self.c = time.process_time()

    acfg = AlignConfig(
        steps=args.grpo_steps,
        beta=cfg["grpo_beta"],
        learning_rate=cfg["grpo_lr"],
        num_generations=cfg["num_generations"],
        prompts_per_step=1,
        max_new_tokens=cfg["max_new_tokens"],
        lora_rank=cfg["grpo_lora_rank"],
        lora_alpha=2.0 * cfg["grpo_lora_rank"],
        seed=1234,
        save_steps=10**6,
    )
    align_policy(
        rm["reward"],
        data["grpo"],
        data["grpo_info"],
        tmp / "grpo",
        acfg,
        base=base,
        overlap_check=rm["overlap"],
        save_policy=False,
        progress=False,
        callbacks=[Timer()],
    )
    later = cpus[1:] or cpus
    out["grpo"] = {"step_cpu": float(np.median(later)), "steps_timed": len(cpus), "first_step_cpu": cpus[0]}
    log(f"GRPO: {out['grpo']['step_cpu']:.1f} CPU s per step (median of steps 2..{len(cpus)})")
    return out


def route_steps(cfg: dict, data: dict, tmp: Path) -> dict[str, int]:
    """The frontier's own step counts at this n (each route class's ``steps``: its last checkpoint)."""
    from privalign.experiments.routes.dpo import DPORoute
    from privalign.experiments.routes.dpprefsyn import DPPrefSynRoute
    from privalign.experiments.routes.grpo import GRPORoute
    from privalign.experiments.routes.props import PROPSRoute

    ref = {"texts": [], "gold": []}
    out: dict[str, int] = {}
    for key, route, fam, method in (
        ("dpo:none", DPORoute(), "dpo", "none"),
        ("dpo:label", DPORoute(), "dpo", "label"),
        ("dpo:sample", DPORoute(), "dpo", "sample"),
        ("props", PROPSRoute(), "props", "dpo"),
        ("dpprefsyn", DPPrefSynRoute(), "dpprefsyn", "dpo"),
        ("grpo", GRPORoute(), "grpo", "RRIHT"),
    ):
        bench = StubBench(cfg, tmp, data, ref, method, fam)
        if method == "none":
            bench.cell["epsilon"] = None
        out[key] = max(route.steps(bench))
    return out


def fmt(v: float) -> str:
    """Three significant figures below 100, whole numbers (thousands separated) above."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def table(rows: list[dict], ns: list[int], base_cpu: dict[int, float]) -> str:
    """Route × n: CPU s and the ratio to the same n's MLE fit; ᵉ marks an extrapolated cell."""
    names = list(dict.fromkeys(r["route"] for r in rows))
    head = "| route | privacy | " + " | ".join(f"n = {n:,}: CPU s (× MLE fit)" for n in ns) + " |"
    lines = [head, "|" + "---|" * (len(ns) + 2)]
    for name in names:
        rs = {r["n"]: r for r in rows if r["route"] == name}
        kind = next(iter(rs.values()))["kind"]
        cells = []
        for n in ns:
            r = rs.get(n)
            if r is None:
                cells.append("not run")
                continue
            mark = "" if r["how"] == "measured" else " ᵉ"
            cells.append(f"{fmt(r['cpu_s'])}{mark} ({fmt(r['cpu_s'] / base_cpu[n])}×)")
        lines.append(f"| {name} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def policy_rows(n: int, per_step: dict, steps: dict[str, int]) -> list[dict]:
    """The policy routes' rows at n: the route's step count at n × the measured CPU per step."""
    rows: list[dict] = []
    for key, label, kind in (
        ("dpo:none", "DPO training", "non-private"),
        ("dpo:label", "label-DP DPO training", "label-DP"),
        ("dpo:sample", "sample-DP DPO training", "sample-DP"),
    ):
        c = per_step[key]["step_cpu"]
        rows.append(row(label, kind, n, extrapolate(c, steps[key]), None, "extrapolated",
                        formula=f"{steps[key]} steps × {c:.2f} CPU s"))  # fmt: skip
    c = per_step["dpo:label"]["step_cpu"]
    k = steps["props"]
    rows.append(
        row("PROPS training (DPO steps)", "label-DP", n, extrapolate(c, k), None, "extrapolated",
            formula=f"{k} steps × {c:.2f} CPU s")
    )  # fmt: skip
    c, f = per_step["dpo:none"]["step_cpu"], per_step["dpprefsyn:features_per_pair_cpu"]
    k = steps["dpprefsyn"]
    rows.append(
        row("DPPrefSyn (features of n pairs + DPO steps)", "sample-DP", n,
            extrapolate(f, n) + extrapolate(c, k), None, "extrapolated",
            formula=f"{f:.3f} CPU s/pair × n + {k} steps × {c:.2f}")
    )  # fmt: skip
    c = per_step["grpo"]["step_cpu"]
    rows.append(row("GRPO training (RM fit excluded)", "as its RM", n,
                    extrapolate(c, steps["grpo"]), None, "extrapolated",
                    formula=f"{steps['grpo']} steps × {c:.2f} CPU s"))  # fmt: skip
    return rows


def write_report(
    args: argparse.Namespace,
    argv: list[str] | None,
    started: str,
    load0: tuple[float, float, float],
    gen: dict | None,
    per_step: dict,
    rows: list[dict],
    ns: list[int],
    base_cpu: dict[int, float],
) -> str:
    """Write the JSON record and the Markdown table of the n done so far (after every n: a run that stops
    keeps what it measured); returns the table."""
    report = {
        "command": "OMP_NUM_THREADS=1 nice python benchmarks/bench_frontier_routes.py "
        + " ".join(argv or sys.argv[1:]),
        "started_utc": started,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "load_average_start": load0,
        "load_average_end": os.getloadavg(),
        "epsilon": EPS,
        "baseline": "fit MLE (non-private linear Bradley–Terry, the frontier's fit_rm)",
        "generation": None if gen is None else {k: v for k, v in gen.items() if k != "ctx"},
        "policy_step_cpu": per_step,
        "rows": rows,
    }
    md = table(rows, ns, base_cpu)
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.out_md:
        Path(args.out_md).write_text(md + "\n", encoding="utf-8")
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="400,2000,8000")
    ap.add_argument("--repeats", type=int, default=3, help="linear fits: median of this many fits")
    ap.add_argument("--trm-ns", default="400,2000", help="n at which the MiniLM reward models are fitted")
    ap.add_argument("--gen-prompts", type=int, default=32)
    ap.add_argument("--policy-pairs", type=int, default=24, help="pairs for the DPO step timing (3 steps)")
    ap.add_argument("--grpo-steps", type=int, default=3)
    ap.add_argument("--no-policy", action="store_true", help="skip the SmolLM2 parts (generation, steps)")
    ap.add_argument("--out-json", default=None)
    ap.add_argument("--out-md", default=None)
    ap.add_argument("--from-json", default=None, help="only redraw the table of an earlier --out-json")
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.ns.split(",")]
    if args.from_json:
        rec = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        base = {r["n"]: r["cpu_s"] for r in rec["rows"] if r["route"] == "fit MLE"}
        md = table(rec["rows"], sorted(base), base)
        if args.out_md:
            Path(args.out_md).write_text(md + "\n", encoding="utf-8")
        print(md)
        return 0
    trm_ns = [int(x) for x in args.trm_ns.split(",") if x]
    import torch

    torch.set_num_threads(1)
    from privalign.experiments.config import load_config, packaged_config_path
    from privalign.experiments.frontier import _gold, _schema

    cfg = load_config(packaged_config_path("beyond_frontier"), _schema())
    cfg["n_pairs"] = max(ns)
    load0 = os.getloadavg()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    rng = np.random.default_rng(20261206)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        gen = None
        if not args.no_policy:
            gen = measure_generation(cfg, args, tmp)
            ctx = gen["ctx"]
        else:
            from privalign.experiments.base import RunContext

            ctx = RunContext(run_dir=tmp)
        gold = _gold(cfg, ctx)
        from privalign.experiments.frontier import _prompts

        ev = _prompts({**cfg, "n_pairs": 1})["eval"]
        m = int(cfg["reference_samples"])
        pos, neg = standin_texts(len(ev) * m // 2, rng)
        texts = [t for pair in zip(pos, neg) for t in pair]
        ref_texts = [texts[i * m : (i + 1) * m] for i in range(len(ev))]
        ref = {"texts": ref_texts, "gold": np.asarray(gold.score(texts), float).reshape(len(ev), m)}
        base_cpu: dict[int, float] = {}
        md = ""
        per_step: dict[str, float] = {}
        trm_per_step: dict[str, float] = {}
        for n in ns:
            data = build_pairs(cfg, n, tmp / f"pairs-{n}.jsonl", rng)
            log(f"n={n}: stand-in pairs built")
            r, keep = fit_rows(cfg, n, data, ref, tmp, n in trm_ns, args.repeats)
            rows += r
            base_cpu[n] = next(x["cpu_s"] for x in r if x["route"] == "fit MLE")
            for x in r:
                if x["route"] in (f"fit {t}" for t in TRMS):
                    trm_per_step[x["route"]] = x["cpu_s"] / x["steps"]
            if gen is not None:
                g = gen["per_pair_cpu"]
                rows.append(
                    row("pair generation (SmolLM2 + MiniLM gold)", "public", n, extrapolate(g, n),
                        gen["per_pair_wall"] * n, "extrapolated", formula=f"{g:.3f} CPU s/pair × n")
                )  # fmt: skip
            if not per_step and gen is not None:
                per_step = policy_steps(cfg, _base_of(cfg, ctx), data, args, tmp, keep["RRIHT"])
            steps = route_steps(cfg, data, tmp)
            if per_step:
                rows += policy_rows(n, per_step, steps)
            if n not in trm_ns:
                for t in TRMS:
                    if f"fit {t}" in trm_per_step:
                        s = trm_steps(n, cfg["trm_epochs"], cfg["trm_batch"])
                        c = trm_per_step[f"fit {t}"]
                        rows.append(
                            row(f"fit {t}", _kind(t), n, extrapolate(c, s), None, "extrapolated",
                                formula=f"{s} steps × {c:.2f} CPU s")
                        )  # fmt: skip
            log(f"n={n} done")
            done = [m for m in ns if m in base_cpu]
            md = write_report(args, argv, started, load0, gen, per_step, rows, done, base_cpu)
    print(md)
    return 0


def _kind(method: str) -> str:
    from privalign.experiments.routes._reward import RM_KINDS

    return RM_KINDS[method]


def _base_of(cfg: dict, ctx: RunContext) -> tuple:
    from privalign.experiments.frontier import _base

    return _base(cfg, ctx)


if __name__ == "__main__":
    raise SystemExit(main())
