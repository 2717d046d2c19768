"""A positive control for reward hacking on real text: a pool re-scored with a *planted* proxy bonus.

``proxy′ = proxy + bonus · 1[text has FEATURE]`` where FEATURE is a rare, real textual feature of the
generated candidates that the gold reward does not reward (e.g. a word repeated three times in a row, hit by
a few candidates in a thousand). With a bonus larger than the proxy's spread, best-of-N picks a feature
candidate as soon as N draws one (N·p ≳ 1), and its gold is that of an ordinary candidate: the gold falls at
large N *by construction*. The control shows that the pipeline, the verdict rules and the four selectors
detect hacking on real text, at no generation cost. It says nothing about whether best-of-N over-optimises
a natural proxy: every pool written here carries ``pool_kind = "planted-real"`` in its manifest, and every
verdict on it says "planted real text".

Texts, gold rewards and everything else are copied unchanged; the source pool is never modified. The bonus
is public configuration, given by the user (never computed from the scores).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from privalign.errors import PrivacyParameterError

__all__ = ["PLANTED_FEATURES", "feature_hits", "plant_hack"]

#: Planted features: name → (regular expression, plain-words description). Searched case-insensitively.
PLANTED_FEATURES: dict[str, tuple[str, str]] = {
    "repeated-word": (r"\b(\w+)\b(?:\W+\1\b){2,}", "a word repeated three or more times in a row"),
    "allcaps-word": (r"(?-i:\b[A-Z]{5,}\b)", "a word of five or more capital letters"),
    "semicolon": (r";", "a semicolon"),
    "hashtag": (r"#\w", "a hashtag (# followed by a word character)"),
}


def feature_hits(texts: list[str], feature: str) -> list[bool]:
    """Whether each text has the planted ``feature`` (a key of :data:`PLANTED_FEATURES`)."""
    if feature not in PLANTED_FEATURES:
        raise PrivacyParameterError(
            f"The 'feature' parameter must be one of {sorted(PLANTED_FEATURES)}. Got {feature!r} instead."
        )
    rx = re.compile(PLANTED_FEATURES[feature][0], re.IGNORECASE)
    return [rx.search(t) is not None for t in texts]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def plant_hack(
    pool: str | os.PathLike, out: str | os.PathLike, *, feature: str, bonus: float
) -> dict[str, Any]:
    """Write ``out`` = ``pool`` with ``proxy_reward += bonus`` on every candidate that has ``feature``;
    returns the manifest (also written next to ``out``, with ``pool_kind = "planted-real"``).

    Raises:
      PrivacyParameterError: an unknown feature, a bonus that is not a positive finite number, ``out``
        equal to ``pool`` or not ``.jsonl[.gz]`` (before anything is read or written).
      DataFormatError: a candidate without a proxy reward, or no candidate with the feature.
    """
    from privalign.data.pools import read_pool, write_pool
    from privalign.errors import DataFormatError
    from privalign.pipeline.build_pool import (
        _versions,
        git_info,
        manifest_path,
        public_manifest,
        write_manifest,
    )

    src, out = Path(pool), Path(out)
    if feature not in PLANTED_FEATURES:
        raise PrivacyParameterError(
            f"The 'feature' parameter must be one of {sorted(PLANTED_FEATURES)}. Got {feature!r} instead."
        )
    if not (isinstance(bonus, (int, float)) and math.isfinite(bonus) and bonus > 0):
        raise PrivacyParameterError(f"The 'bonus' parameter must be a positive finite number. Got {bonus!r}.")
    if not (out.name.endswith(".jsonl") or out.name.endswith(".jsonl.gz")):
        raise PrivacyParameterError(
            f"The 'out' parameter must end in .jsonl or .jsonl.gz. Got {str(out)!r} instead."
        )
    if out.resolve() == src.resolve():
        raise PrivacyParameterError(
            f"The 'out' parameter must differ from the 'pool' parameter (the source is never overwritten). "
            f"Got {str(out)!r}."
        )
    if not src.is_file():
        raise FileNotFoundError(f"The 'pool' parameter names a file that does not exist: {str(src)!r}")
    t0 = time.time()
    records = read_pool(src)
    new, hits, total = [], 0, 0
    for i, rec in enumerate(records):
        flags = feature_hits([r.text for r in rec.responses], feature)
        resp = []
        for j, (r, hit) in enumerate(zip(rec.responses, flags)):
            if r.proxy_reward is None or not math.isfinite(r.proxy_reward):
                raise DataFormatError(
                    f"{src}: prompt {i + 1}, field 'responses[{j}].proxy_reward' is missing"
                )
            resp.append(dataclasses.replace(r, proxy_reward=r.proxy_reward + bonus) if hit else r)
        hits += sum(flags)
        total += len(flags)
        new.append(dataclasses.replace(rec, responses=tuple(resp)))
    if hits == 0:
        raise DataFormatError(f"{src}: no candidate has the feature {feature!r}: nothing to plant")
    src_mp = manifest_path(src)
    src_manifest = (
        public_manifest(json.loads(src_mp.read_text(encoding="utf-8"))) if src_mp.is_file() else None
    )
    old_meta = dict(records[0].meta or {})
    write_pool(
        out,
        new,
        meta={
            k: v
            for k, v in {
                "proxy_reward": f"{old_meta.get('proxy_reward', 'proxy')} + planted:{feature}",
                "true_reward": old_meta.get("true_reward"),
                "rescored_from": src.name,
            }.items()
            if v is not None
        },
    )
    proxy_name = (src_manifest or {}).get("proxy_reward") or old_meta.get("proxy_reward") or "proxy"
    manifest = {
        "format": "privalign-pool-manifest/1",
        "pool": out.name,
        "pool_kind": "planted-real",
        "planted": {
            "feature": feature,
            "description": PLANTED_FEATURES[feature][1],
            "regex": PLANTED_FEATURES[feature][0],
            "bonus": float(bonus),
            "rule": "proxy' = proxy + bonus x 1[text has the feature]; the gold reward is unchanged",
            "candidates_with_feature": hits,
            "rate": hits / total,
        },
        "rescored_from": {"pool": src.name, "sha256": _sha256(src), "manifest": src_manifest},
        "proxy_reward": f"{proxy_name} + planted:{feature}",
        "true_reward": (src_manifest or {}).get("true_reward") or old_meta.get("true_reward"),
        "rescored": ["proxy_reward"],
        "num_prompts": len(new),
        "num_candidates": total,
        "seconds_this_run": round(time.time() - t0, 1),
        "versions": _versions(),
        "git": git_info(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_manifest(out, manifest)
    return public_manifest(manifest)
