"""The pool builder on Ray Data: ``map_batches`` with actor pools for generation and for scoring.

Each pending prompt is one row ``{"prompt_index": i}``. A pool of generator actors (each builds the
generator once from the JSON spec, :func:`privalign.pipeline.steps.make_generator`) turns rows into
completions with exactly the per-candidate seeds of the local backend; a pool of scorer actors scores them
and builds the record. The driver appends finished records to the same work file as the local backend, so
resume, completion markers and the final pool are shared, and the same seed gives the same pool as the local
backend (tested with ``ray.init(address="local", num_cpus=2)``).

**Scaling out.** To use an existing cluster, start the driver on a node of it and pass
``--backend ray --ray-address auto`` (or ``ray://head:10001`` for Ray Client); raise ``--ray-concurrency`` to
the number of generator actors wanted, and give them GPUs with ``ray_options={"num_gpus": 1}``. With vLLM
servers already running, use ``--generator openai --base-url http://vllm-host:8000/v1``: each generator actor
is then an HTTP client, and the cluster only fans out requests and scoring. ``--generator vllm`` runs vLLM
inside each actor (one GPU per actor).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from privalign.models._resources import require

__all__ = ["run_ray"]


class _GenerateActor:
    def __init__(self, gen_spec: dict, seed: int, n: int, prompts: list[str]) -> None:
        from privalign.pipeline.steps import make_generator

        spec = dict(gen_spec)
        spec["progress"] = False
        self.gen = make_generator(spec)
        self.seed, self.n, self.prompts = seed, n, prompts

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        import json

        idxs = [int(i) for i in batch["prompt_index"]]
        comps = self.gen.generate(
            [self.prompts[i] for i in idxs], self.n, seed=self.seed, prompt_indices=idxs
        )
        payload = [json.dumps([[c.text, c.num_tokens, c.finish_reason] for c in cs]) for cs in comps]
        return {
            "prompt_index": np.asarray(idxs, dtype=np.int64),
            "completions": np.asarray(payload, dtype=object),
        }


class _ScoreActor:
    def __init__(self, proxy: str, true: str, examples: list, max_chars: int) -> None:
        from privalign.pipeline.steps import make_scorer

        self.proxy, self.true = make_scorer(proxy), make_scorer(true)
        self.examples, self.max_chars = examples, max_chars

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        import json

        from privalign.models.generators import Completion
        from privalign.pipeline.steps import score_prompt

        recs = []
        for i, payload in zip(batch["prompt_index"], batch["completions"]):
            comps = [Completion(text=t, num_tokens=k, finish_reason=f) for t, k, f in json.loads(payload)]
            rec, _ = score_prompt(self.examples[int(i)], int(i), comps, self.proxy, self.true, self.max_chars)
            recs.append(json.dumps(rec, ensure_ascii=False))
        return {
            "prompt_index": np.asarray(batch["prompt_index"], dtype=np.int64),
            "record": np.asarray(recs, dtype=object),
        }


def run_ray(
    config,
    examples,
    todo: list[int],
    writer,
    *,
    address: str = "local",
    num_cpus: int | None = None,
    concurrency: int = 1,
    score_concurrency: int = 1,
    num_gpus: float = 0,
    max_retries: int = 2,
    progress: bool = True,
) -> dict[str, Any]:
    """Generate and score the prompts ``todo`` on Ray Data; append finished records through ``writer``.

    A Ray instance already initialised by the caller is reused; otherwise ``ray.init(address=address,
    num_cpus=num_cpus)`` is called (and shut down at the end). ``address="local"`` always starts a new
    local instance (never another host).
    """
    import json

    ray = require("ray", purpose="the Ray pool-building backend")
    require("ray.data", purpose="the Ray pool-building backend")
    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = {"address": address, "include_dashboard": False, "log_to_driver": False}
        if num_cpus is not None:
            kw["num_cpus"] = num_cpus
        ray.init(**kw)
        started = True
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = bool(progress)
        prompts = [ex.prompt for ex in examples]
        ds = ray.data.from_items(
            [{"prompt_index": int(i)} for i in todo], override_num_blocks=max(1, len(todo))
        )
        ds = ds.map_batches(
            _GenerateActor,
            fn_constructor_kwargs={
                "gen_spec": config.generator,
                "seed": config.seed,
                "n": config.n,
                "prompts": prompts,
            },
            batch_size=1,
            concurrency=concurrency,
            num_gpus=num_gpus or None,
            max_restarts=max_retries,
            max_task_retries=max_retries,
        )
        ds = ds.map_batches(
            _ScoreActor,
            fn_constructor_kwargs={
                "proxy": config.proxy_reward,
                "true": config.true_reward,
                "examples": list(examples),
                "max_chars": config.max_chars,
            },
            batch_size=1,
            concurrency=score_concurrency,
        )
        for row in ds.iter_rows():
            writer.append(json.loads(row["record"]))
    finally:
        if started:
            ray.shutdown()
    print(f"build-pool[ray]: {len(todo)} prompts done", file=sys.stderr)
    return {
        "backend": "ray",
        "address": address,
        "concurrency": concurrency,
        "generator_spec": config.generator,
    }
