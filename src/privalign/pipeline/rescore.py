"""Re-score an existing pool with other proxy and/or true rewards, without generating anything again.

Generation is the expensive part of a pool; the reward models are what over-optimisation experiments vary.
:func:`rescore_pool` reads a pool, replaces the ``proxy_reward`` and/or ``true_reward`` of every candidate
with the named scorers (the same names as ``build-pool``: ``vader``, ``linear:PATH``, ``hf:DIR``, verifiers…),
and writes a new pool atomically plus a manifest that records the source pool (name, SHA-256, its own
manifest if present) and the scorers. Texts, prompts and everything else are copied unchanged; the source
pool is never modified.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from privalign.errors import PrivacyParameterError

__all__ = ["rescore_pool"]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def rescore_pool(
    pool: str | os.PathLike,
    out: str | os.PathLike,
    *,
    proxy_reward: str | None = None,
    true_reward: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Write ``out`` = ``pool`` with the named reward(s) recomputed; returns the manifest (also written).

    Raises:
      PrivacyParameterError: neither reward given, ``out`` equal to ``pool`` or not ``.jsonl[.gz]``, a bad
        reward name (before anything is read or written).
      DataFormatError: a scorer returned a non-finite value (nothing is written).
    """
    from tqdm.auto import tqdm

    from privalign.data.pools import read_pool, write_pool
    from privalign.pipeline.build_pool import (
        _versions,
        git_info,
        manifest_path,
        public_manifest,
        write_manifest,
    )
    from privalign.pipeline.steps import check_reward_name, make_scorer, reward_fields, score_texts

    src, out = Path(pool), Path(out)
    if proxy_reward is None and true_reward is None:
        raise PrivacyParameterError(
            "The 'proxy_reward' parameter or the 'true_reward' parameter (or both) must be given: there is "
            "nothing to re-score."
        )
    if not (out.name.endswith(".jsonl") or out.name.endswith(".jsonl.gz")):
        raise PrivacyParameterError(
            f"The 'out' parameter must end in .jsonl or .jsonl.gz. Got {str(out)!r} instead."
        )
    if out.resolve() == src.resolve():
        raise PrivacyParameterError(
            "The 'out' parameter must differ from the 'pool' parameter (the source is never overwritten). "
            f"Got {str(out)!r}."
        )
    if proxy_reward is not None:
        check_reward_name(proxy_reward, "proxy_reward")
    if true_reward is not None:
        check_reward_name(true_reward, "true_reward")
    if src.is_dir():
        raise PrivacyParameterError(f"The 'pool' parameter names a directory, not a pool file: {str(src)!r}")
    if not src.is_file():
        raise FileNotFoundError(f"The 'pool' parameter names a file that does not exist: {str(src)!r}")
    records = read_pool(src)
    proxy = make_scorer(proxy_reward) if proxy_reward is not None else None
    true = make_scorer(true_reward) if true_reward is not None else None
    t0 = time.time()
    new = []
    for i, rec in enumerate(tqdm(records, desc="rescore-pool", unit="prompt", disable=not progress)):
        texts = [r.text for r in rec.responses]
        pr, tr = score_texts(texts, rec.prompt, rec.gt_answer, proxy, true, i)
        resp = []
        for j, r in enumerate(rec.responses):
            upd = reward_fields(r.text, None if pr is None else pr[j], None if tr is None else tr[j], true)
            if tr is not None and not hasattr(true, "predict"):
                upd["predicted_answer"], upd["is_correct"] = None, None  # a verifier's fields do not survive
            resp.append(dataclasses.replace(r, **upd))
        new.append(dataclasses.replace(rec, responses=tuple(resp)))
    src_manifest_path = manifest_path(src)
    src_manifest = (
        public_manifest(json.loads(src_manifest_path.read_text(encoding="utf-8")))
        if src_manifest_path.is_file()
        else None
    )
    old_meta = dict(records[0].meta or {})
    run_meta = {
        k: v
        for k, v in {
            "proxy_reward": proxy_reward or old_meta.get("proxy_reward"),
            "true_reward": true_reward or old_meta.get("true_reward"),
            "rescored_from": src.name,
        }.items()
        if v is not None
    }
    write_pool(out, new, meta=run_meta)
    manifest = {
        "format": "privalign-pool-manifest/1",
        "pool": out.name,
        "rescored_from": {"pool": src.name, "sha256": _sha256(src), "manifest": src_manifest},
        "proxy_reward": proxy_reward or (src_manifest or {}).get("proxy_reward"),
        "true_reward": true_reward or (src_manifest or {}).get("true_reward"),
        "rescored": [
            k for k, v in (("proxy_reward", proxy_reward), ("true_reward", true_reward)) if v is not None
        ],
        "scorers": {
            "proxy": proxy.describe() if proxy is not None and hasattr(proxy, "describe") else None,
            "true": true.describe() if true is not None and hasattr(true, "describe") else None,
        },
        "num_prompts": len(new),
        "num_candidates": sum(len(r.responses) for r in new),
        "seconds_this_run": round(time.time() - t0, 1),
        "versions": _versions(),
        "git": git_info(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_manifest(out, manifest)
    return public_manifest(manifest)
