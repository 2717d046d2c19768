"""Scored pools as the paper-1 experiments name them (config key ``pool``): ``"synthetic"``, ``"shipped"``
(the IMDb SmolLM2 pool under ``pools/``, else synthetic, labelled) or a pool file; the evaluation prompts and
the disjoint calibration prompts that follow them.

Reading only: nothing here is private. The synthetic pool itself is drawn by
:func:`privalign.alignment.synthetic.make_synthetic_pool` (a layer above), so its caller builds it.
"""

from __future__ import annotations

from pathlib import Path

from privalign.data.pools import ScoredPool

__all__ = ["SHIPPED_POOL", "first_prompts", "resolve_pool_spec", "split_scored_pool"]

#: The shipped real pool, relative to the repository root.
SHIPPED_POOL = ("pools", "imdb-smollm2.jsonl.gz")


def resolve_pool_spec(spec: str) -> tuple[str, Path | None]:
    """``("synthetic", None)``, ``("synthetic-fallback", None)`` (``"shipped"`` but the shipped pool is
    absent) or ``("file", path)``; a named file that does not exist raises ``FileNotFoundError`` naming the
    config key ``pool``."""
    from privalign.paths import repo_root

    if spec == "synthetic":
        return "synthetic", None
    if spec == "shipped":
        p = repo_root().joinpath(*SHIPPED_POOL)
        return ("file", p) if p.is_file() else ("synthetic-fallback", None)
    p = Path(spec).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"Pool file not found: {p} (config key 'pool').")
    return "file", p


def first_prompts(pool: ScoredPool, k: int) -> ScoredPool:
    """The first ``k`` prompts of ``pool`` (all of it when it has at most ``k``)."""
    if pool.proxy.shape[0] <= k:
        return pool
    return ScoredPool(pool.proxy[:k], pool.true[:k], pool.counts[:k], pool.prompts[:k])


def split_scored_pool(pool: ScoredPool, n_eval: int, n_calib: int) -> tuple[ScoredPool, ScoredPool | None]:
    """``(evaluation pool, calibration pool or None)``: the first ``n_eval`` prompts are evaluated, the next
    ``n_calib`` (disjoint) only calibrate or tune free choices; the pool itself when it has no more than
    ``n_eval`` prompts and no calibration part is asked for."""

    def part(a: int, b: int) -> ScoredPool:
        return ScoredPool(
            pool.proxy[a:b], pool.true[a:b], pool.counts[a:b], pool.prompts[a:b] if pool.prompts else ()
        )

    if n_calib == 0 and pool.proxy.shape[0] <= n_eval:
        return pool, None
    return part(0, n_eval), (part(n_eval, n_eval + n_calib) if n_calib else None)
