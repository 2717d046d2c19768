"""Who labels the private pairs and who judges the routes of ``beyond-frontier`` (issue 37 item 2).

* A **labeller** draws each private pair's Bradley–Terry label, ``P(a ≻ b) = σ(s·(ℓ(a) − ℓ(b)))``, from its
  logit ``ℓ`` (the MiniLM and n-gram golds: ``logit P(positive)``; VADER: its compound score c ∈ [−1, 1])
  at a temperature ``s`` (``labeller_scale``), chosen so that every labeller's labels are about as noisy:
  :func:`match_scale` finds the ``s`` whose mean ``|P − ½|`` on *public* pairs (base-policy completions of
  public IMDb openings that are neither evaluation nor GRPO prompts, :func:`public_pairs`) equals the MiniLM
  gold's at ``s = 1``.
* A **judge** scores a route's selected texts; every route is judged by every judge of ``judges`` on the
  same selection (one selection, several scorings).
* Each labeller, judge and route declares its **backbone** (the pretrained text encoder its scores come
  from; ``None``: none shared with anything here): "route X leads" is only said where it holds under the
  labellers whose backbone X does not share (:func:`independent`).

Privacy:
  Nothing here touches private data except the labeller's draw, which *creates* the private labels (the
  data owner's act, before any mechanism); the scale is matched on public texts only.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "JUDGES",
    "LABELLERS",
    "MINILM",
    "NGRAM",
    "Scorer",
    "independent",
    "label_noise",
    "labeller_logits",
    "match_scale",
    "public_pairs",
]

#: the backbones (a judge's or a route's reward model's text encoder)
MINILM = "all-MiniLM-L6-v2"
NGRAM = "hashed word n-grams"


@dataclass(frozen=True)
class Scorer:
    """A labeller or judge: its name, its backbone (``None``: no encoder shared with any route) and, for
    the shipped golds, the repository file it loads."""

    name: str
    backbone: str | None
    what: str
    path: str = ""

    def load(self) -> Callable[[Sequence[str]], np.ndarray]:
        """``texts → scores`` (P(positive) for the golds, VADER's (c + 1)/2 ∈ [0, 1])."""
        if self.path:
            from privalign.experiments.record_store import repo_path
            from privalign.models.scorers import LinearRewardScorer

            gold = LinearRewardScorer.load(repo_path(self.path))
            return lambda texts: np.asarray(gold.score(list(texts)), float)
        from privalign.models.scorers import VaderScorer

        vader = VaderScorer()
        return lambda texts: np.asarray(vader.score(list(texts)), float)


#: every labeller and judge by name
LABELLERS: dict[str, Scorer] = {
    "minilm": Scorer("minilm", MINILM, "MiniLM gold P(positive)", "pools/imdb-gold-minilm-logreg.json"),
    "vader": Scorer("vader", None, "VADER compound c (judge: (c + 1)/2)"),
    "ngram": Scorer("ngram", NGRAM, "n-gram gold P(positive)", "pools/imdb-gold-ngram-logreg.json"),
}
JUDGES = LABELLERS


def labeller_logits(name: str, scores: np.ndarray) -> np.ndarray:
    """A labeller's logit ℓ from its scores (:meth:`Scorer.load`): ``logit P`` for the golds, the compound
    ``c = 2u − 1`` for VADER."""
    u = np.asarray(scores, float)
    if name == "vader":
        return 2.0 * u - 1.0
    p = np.clip(u, 1e-6, 1 - 1e-6)
    return np.log(p) - np.log1p(-p)


def label_noise(diff: np.ndarray, scale: float) -> float:
    """Mean ``|σ(s·Δℓ) − ½|`` over pairs: 0 is a coin flip, ½ a deterministic label."""
    return float(np.mean(np.abs(1.0 / (1.0 + np.exp(-scale * np.asarray(diff, float))) - 0.5)))


def match_scale(diff: np.ndarray, target: float) -> float:
    """The temperature ``s`` with ``label_noise(diff, s) = target`` (monotone in s; bisection to 1e-6
    relative).

    Raises:
      ValueError: ``target`` outside ``[0, ½)`` or not reachable (every Δℓ = 0).
    """
    d = np.asarray(diff, float)
    if not 0 <= target < 0.5 or not np.any(d != 0):
        raise ValueError(f"labeller_scale: cannot match a label noise of {target!r} on these pairs.")
    lo, hi = 0.0, 1.0
    while label_noise(d, hi) < target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if label_noise(d, mid) < target else (lo, mid)
        if hi - lo <= 1e-6 * hi:
            break
    return (lo + hi) / 2


def public_pairs(pool: Path, exclude: Sequence[str], per_prompt: int = 32) -> list[tuple[str, str]]:
    """Public pairs for the scale match: consecutive candidates (2j, 2j + 1) of each prompt of an IMDb pool
    (base-policy completions of public openings), skipping prompts in ``exclude`` (the evaluation and GRPO
    prompts) and blank or equal texts; ``per_prompt`` pairs per prompt at most."""

    def norm(t: str) -> str:
        return " ".join(str(t).split())

    skip = {norm(p) for p in exclude}
    out: list[tuple[str, str]] = []
    with gzip.open(pool, "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if norm(row["prompt"]) in skip:
                continue
            texts = [r["text"] for r in row["responses"]]
            k = 0
            for a, b in zip(texts[0::2], texts[1::2]):
                if k < per_prompt and a.strip() and b.strip() and a.strip() != b.strip():
                    out.append((a, b))
                    k += 1
    return out


def independent(route_backbone: str | None, labeller: str) -> bool:
    """Whether a route with backbone ``route_backbone`` shares none with ``labeller`` (a route without a
    backbone shares none)."""
    lb = LABELLERS[labeller].backbone
    return route_backbone is None or lb is None or route_backbone != lb
