"""Pool-builder generation throughput vs calling ``model.generate`` directly (same model, batch, settings).

Baseline: ``model.generate(do_sample=True, top_k=K, temperature=T, max_new_tokens=M, min_new_tokens=M)`` on
the same batch (global torch RNG, no per-candidate seeding). Candidate: ``TransformersGenerator.generate``
(what the pool builder calls), with per-candidate ``torch.Generator`` sampling, ``min_new_tokens`` not set
(so a row may stop early at EOS; generated tokens are counted, not assumed). Rounds alternate A/B to
spread machine noise over both; the ratio of medians is reported.

Usage: python benchmarks/bench_models_generation.py [--batch 64] [--tokens 12] [--rounds 3] [--model smollm2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    import torch

    from privalign.models.generators import SamplingParams, TransformersGenerator

    g = TransformersGenerator(
        args.model,
        params=SamplingParams(max_new_tokens=args.tokens, top_k=50),
        batch_size=args.batch,
        progress=False,
    )
    prompt = "I rented this movie last night and"
    enc = g.tokenizer([prompt] * args.batch, return_tensors="pt")
    enc = {k: enc[k] for k in ("input_ids", "attention_mask")}

    def direct() -> tuple[float, int]:
        t = time.perf_counter()
        with torch.inference_mode():
            out = g.model.generate(
                **enc,
                do_sample=True,
                top_k=50,
                temperature=1.0,
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
                pad_token_id=g.pad_token_id,
            )
        dt = time.perf_counter() - t
        return dt, int((out.shape[1] - enc["input_ids"].shape[1]) * args.batch)

    def builder(r: int) -> tuple[float, int]:
        t = time.perf_counter()
        comps = g.generate([prompt], args.batch, seed=1000 + r)[0]
        dt = time.perf_counter() - t
        return dt, sum(c.num_tokens for c in comps)

    direct()  # warm-up
    a_rates, b_rates = [], []
    for r in range(args.rounds):
        dt, n = direct()
        a_rates.append(n / dt)
        dt, n = builder(r)
        b_rates.append(n / dt)
    res = {
        "model": g.model_id,
        "batch_size": args.batch,
        "max_new_tokens": args.tokens,
        "rounds": args.rounds,
        "torch_threads": torch.get_num_threads(),
        "direct_generate_tok_s_median": round(statistics.median(a_rates), 1),
        "pool_builder_tok_s_median": round(statistics.median(b_rates), 1),
        "ratio_builder_over_direct": round(statistics.median(b_rates) / statistics.median(a_rates), 3),
        "direct_all": [round(x, 1) for x in a_rates],
        "builder_all": [round(x, 1) for x in b_rates],
    }
    print(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
