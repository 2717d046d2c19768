"""CTranslate2 CPU knobs on the build-pool workload: compute type, batch size, intra-op threads.

Every configuration is a ``CTranslate2Generator`` (``reseed="block"``, as ``privalign build-pool`` uses it)
that generates ``--n`` candidates for each of ``--prompts`` consecutive HH-RLHF prompts
(``privalign.pipeline.hh``, chat template, T = 1, top-k 50, ``--tokens`` new tokens). Configurations run in
rounds, interleaved (round r runs every configuration once) to spread machine noise; the baseline is the first
configuration (build-pool's default: int8, ``--batch`` candidates per call, ``--threads`` threads), and each
configuration's median new-tokens/s is reported with its ratio to the baseline. Load averages before and after
are printed.

Usage: python benchmarks/bench_ct2_knobs.py [--n 64] [--prompts 2] [--tokens 16] [--rounds 3] [--batch 64]
       [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main(argv: list[str] | None = None) -> dict:
    from privalign.models.generators import CTranslate2Generator, SamplingParams
    from privalign.pipeline.hh import hh_prompts

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    b, t = args.batch, args.threads
    configs = [
        ("int8", b, t),
        ("int8_float32", b, t),
        ("float32", b, t),
        ("int8", max(b // 4, 1), t),
        ("int8", b * 4, t),
        ("int8", b, 1),
    ]
    prompts = [e.prompt for e in hh_prompts(args.rounds * args.prompts)]
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0, top_k=50)
    load0 = os.getloadavg()
    t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    gens = {
        c: CTranslate2Generator(
            params=params,
            batch_size=c[1],
            chat_template=True,
            num_threads=c[2],
            compute_type=c[0],
            reseed="block",
            progress=False,
        )
        for c in configs
    }
    rates: dict = {c: [] for c in configs}
    for r in range(args.rounds):
        idx = list(range(r * args.prompts, (r + 1) * args.prompts))
        for c, g in gens.items():
            s = time.perf_counter()
            rows = g.generate([prompts[i] for i in idx], args.n, seed=0, prompt_indices=idx)
            rates[c].append(sum(x.num_tokens for row in rows for x in row) / (time.perf_counter() - s))
    base = statistics.median(rates[configs[0]])
    res = {
        "start_utc": t0,
        "end_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "n": args.n,
        "prompts_per_round": args.prompts,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "configs": [],
    }
    for c in configs:
        m = statistics.median(rates[c])
        res["configs"].append(
            {
                "compute_type": c[0],
                "batch": c[1],
                "threads": c[2],
                "tok_s_median": round(m, 1),
                "tok_s_all": [round(x, 1) for x in rates[c]],
                "ratio_to_first": round(m / base, 2),
            }
        )
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
