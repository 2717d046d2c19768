"""Scored candidate pools: the JSON Lines format of spec-inference-time §5.3 (+ ``true_reward``, ``meta``).

One JSON object per line, one line per prompt::

    {"prompt": str, "choices": [str, ...]?, "subject": str?, "gt_answer": str?,
     "responses": [{"text": str, "proxy_reward": float,
                    "is_correct": bool?, "true_reward": float?, "predicted_answer": str|null?}, ...],
     "meta": {...}?}

* ``proxy_reward`` (the reward model's score r̂) is required and finite.
* The true reward is ``true_reward`` when present, else ``float(is_correct)``; a response may have
  neither (then only proxy-reward metrics are available).
* ``meta`` (optional, per line) records the generator id, reward-model id, sampling parameters, seed
  entropy and ``format_version``; files without it are accepted unchanged.
* Files ending in ``.gz`` are gzip-compressed. Reading streams line by line; every defect raises
  :class:`~privalign.errors.DataFormatError` naming the file, the line and the field.

The authors' documented variants are accepted and counted (:class:`ReadStats`, recorded in run manifests):
``is_correct`` given as 0/1 is coerced to false/true; a response whose ``proxy_reward`` is null (unscored)
is skipped, and a prompt left without responses is skipped; a file holding one JSON array of prompt objects
(instead of one object per line) is read as well.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privalign.errors import DataFormatError

__all__ = [
    "FORMAT_VERSION",
    "Response",
    "PoolRecord",
    "ScoredPool",
    "ReadStats",
    "iter_pool",
    "read_pool",
    "write_pool",
    "pool_manifest_path",
    "declared_score_range",
]

FORMAT_VERSION = "privalign-pool/1"


@dataclass(frozen=True)
class Response:
    """One scored candidate."""

    text: str
    proxy_reward: float
    is_correct: bool | None = None
    true_reward: float | None = None
    predicted_answer: str | None = None

    @property
    def true_value(self) -> float:
        """``true_reward`` if set, else ``float(is_correct)``, else NaN."""
        if self.true_reward is not None:
            return float(self.true_reward)
        if self.is_correct is not None:
            return float(self.is_correct)
        return math.nan

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"text": self.text, "proxy_reward": self.proxy_reward}
        for k in ("is_correct", "true_reward", "predicted_answer"):
            v = getattr(self, k)
            if v is not None or k == "predicted_answer" and self.is_correct is not None:
                d[k] = v
        return d


@dataclass(frozen=True)
class PoolRecord:
    """One prompt with its scored candidates (one line of a pool file)."""

    prompt: str
    responses: tuple[Response, ...]
    gt_answer: str | None = None
    choices: tuple[str, ...] | None = None
    subject: str | None = None
    meta: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def proxy(self) -> np.ndarray:
        return np.array([r.proxy_reward for r in self.responses], dtype=np.float64)

    @property
    def true(self) -> np.ndarray:
        return np.array([r.true_value for r in self.responses], dtype=np.float64)

    def to_dict(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"prompt": self.prompt}
        if self.choices is not None:
            d["choices"] = list(self.choices)
        if self.subject is not None:
            d["subject"] = self.subject
        if self.gt_answer is not None:
            d["gt_answer"] = self.gt_answer
        d.update(self.extra)
        d["responses"] = [r.to_dict() for r in self.responses]
        m = dict(self.meta or {})
        if meta:
            m.update(meta)
        if m:
            m.setdefault("format_version", FORMAT_VERSION)
            d["meta"] = m
        return d


@dataclass
class ReadStats:
    """What a read changed: counts of coerced values and skipped responses/prompts (all zero for a file in
    the canonical schema). ``to_dict()`` goes into run manifests."""

    prompts_read: int = 0
    responses_read: int = 0
    is_correct_coerced: int = 0
    responses_skipped_null_proxy: int = 0
    prompts_skipped_no_scored_response: int = 0
    json_array_file: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def describe(self) -> str:
        """One sentence on what was changed, or "" if nothing was."""
        parts = []
        if self.is_correct_coerced:
            parts.append(f"coerced {self.is_correct_coerced} 'is_correct' values from 0/1 to false/true")
        if self.responses_skipped_null_proxy:
            parts.append(f"skipped {self.responses_skipped_null_proxy} responses with a null 'proxy_reward'")
        if self.prompts_skipped_no_scored_response:
            parts.append(
                f"skipped {self.prompts_skipped_no_scored_response} prompts left without a scored response"
            )
        return "; ".join(parts)


def _open(path: Path, mode: str):
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


@contextlib.contextmanager
def _decoding(path: Path) -> Iterator[None]:
    """Name the file when its bytes cannot be read as (gzip-compressed) UTF-8 text: a corrupt or truncated
    ``.gz``, a plain file named ``.gz``, binary data."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error, UnicodeDecodeError) as exc:
        kind = "gzip-compressed UTF-8 text" if path.suffix == ".gz" else "UTF-8 text"
        raise DataFormatError(
            f"{path}: field '<file>' cannot be read as {kind} ({type(exc).__name__}: {exc})"
        ) from None


def _fail(path, lineno, fld, msg):
    raise DataFormatError(f"{path}:{lineno}: field '{fld}' {msg}")


def _real(v, path, lineno, fld) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        _fail(path, lineno, fld, f"must be a finite number; got {v!r}")
    return float(v)


def _opt_str(v, path, lineno, fld):
    if v is not None and not isinstance(v, str):
        _fail(path, lineno, fld, f"must be a string or null; got {v!r}")
    return v


def _parse(obj: Any, path, lineno: int, stats: ReadStats | None = None) -> PoolRecord | None:
    if not isinstance(obj, dict):
        _fail(path, lineno, "<line>", f"must be a JSON object; got {type(obj).__name__}")
    if not isinstance(obj.get("prompt"), str):
        _fail(path, lineno, "prompt", f"is required and must be a string; got {obj.get('prompt')!r}")
    resp = obj.get("responses")
    if not isinstance(resp, list) or not resp:
        _fail(path, lineno, "responses", f"is required and must be a non-empty list; got {resp!r:.80}")
    out = []
    for j, r in enumerate(resp):
        f = f"responses[{j}]"
        if not isinstance(r, dict):
            _fail(path, lineno, f, f"must be an object; got {r!r:.80}")
        text = r.get("text", "")
        if not isinstance(text, str):
            _fail(path, lineno, f + ".text", f"must be a string; got {text!r:.80}")
        if "proxy_reward" not in r:
            _fail(path, lineno, f + ".proxy_reward", "is required")
        if (
            r["proxy_reward"] is None and stats is not None
        ):  # unscored response (authors' variant): skip, count
            stats.responses_skipped_null_proxy += 1
            continue
        pr = _real(r["proxy_reward"], path, lineno, f + ".proxy_reward")
        ic = r.get("is_correct")
        if stats is not None and not isinstance(ic, bool) and isinstance(ic, int) and ic in (0, 1):
            ic = bool(ic)  # 0/1 (authors' variant)
            stats.is_correct_coerced += 1
        if ic is not None and not isinstance(ic, bool):
            _fail(path, lineno, f + ".is_correct", f"must be true, false, 0, 1 or null; got {ic!r}")
        tr = r.get("true_reward")
        tr = None if tr is None else _real(tr, path, lineno, f + ".true_reward")
        pa = _opt_str(r.get("predicted_answer"), path, lineno, f + ".predicted_answer")
        out.append(Response(text, pr, ic, tr, pa))
    choices = obj.get("choices")
    if choices is not None and (
        not isinstance(choices, list) or not all(isinstance(c, str) for c in choices)
    ):
        _fail(path, lineno, "choices", f"must be a list of strings; got {choices!r:.80}")
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        _fail(path, lineno, "meta", f"must be an object; got {meta!r:.80}")
    known = {"prompt", "responses", "choices", "subject", "gt_answer", "meta"}
    if stats is not None:
        stats.responses_read += len(resp)
        if not out:
            stats.prompts_skipped_no_scored_response += 1
            return None
    return PoolRecord(
        prompt=obj["prompt"],
        responses=tuple(out),
        gt_answer=_opt_str(obj.get("gt_answer"), path, lineno, "gt_answer"),
        choices=None if choices is None else tuple(choices),
        subject=_opt_str(obj.get("subject"), path, lineno, "subject"),
        meta=meta,
        extra={k: v for k, v in obj.items() if k not in known},
    )


def iter_json_lines(fh: Any, first: str, path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed object)`` of each non-blank line of the open JSONL stream ``fh``, whose first
    character ``first`` was already read; the one JSONL line loop of the pool readers (``iter_pool`` and the
    columnar cache's builder).

    Raises:
      DataFormatError: a line is not valid JSON (message: ``FILE:LINE: field '<line>' ...``).
    """
    lines = (first + line if k == 0 else line for k, line in enumerate(fh))
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}:{lineno}: field '<line>' is not valid JSON ({exc.msg})") from None


def iter_pool(path: str | os.PathLike, *, stats: ReadStats | None = None) -> Iterator[PoolRecord]:
    """Stream the records of a pool file (``.jsonl``, ``.jsonl.gz``, or one JSON array), validating each.

    Args:
      path: the pool file.
      stats: filled with the counts of coerced and skipped values (see :class:`ReadStats`).

    Raises:
      FileNotFoundError: no such file.
      DataFormatError: a malformed line (message: ``FILE:LINE: field 'F' ...``).
    """
    path = Path(path)
    if path.is_dir():
        raise DataFormatError(f"{path}: field '<file>' is a directory, not a pool file")
    if not path.is_file():
        raise FileNotFoundError(f"pool file not found: {path}")
    stats = stats if stats is not None else ReadStats()
    with _open(path, "r") as fh, _decoding(path):
        first = fh.read(1)
        while first and first.isspace():
            first = fh.read(1)
        if first == "[":  # one JSON array of prompt objects
            try:
                arr = json.loads(first + fh.read())
            except json.JSONDecodeError as exc:
                raise DataFormatError(
                    f"{path}:{exc.lineno}: field '<file>' is not a valid JSON array ({exc.msg})"
                ) from None
            stats.json_array_file = True
            for i, obj in enumerate(arr, start=1):
                rec = _parse(obj, path, i, stats)
                if rec is not None:
                    stats.prompts_read += 1
                    yield rec
            return
        for lineno, obj in iter_json_lines(fh, first, path):
            rec = _parse(obj, path, lineno, stats)
            if rec is not None:
                stats.prompts_read += 1
                yield rec


def read_pool(path: str | os.PathLike, *, stats: ReadStats | None = None) -> list[PoolRecord]:
    """Read a whole pool; an empty pool is an error."""
    recs = list(iter_pool(path, stats=stats))
    if not recs:
        raise DataFormatError(f"{path}: field '<file>' must contain at least one prompt; the pool is empty")
    return recs


def write_pool(
    path: str | os.PathLike, records: Iterable[PoolRecord | dict], *, meta: dict[str, Any] | None = None
) -> int:
    """Write records atomically (temp file + rename: nothing partial is left on error).

    Args:
      path: Destination (``.gz`` suffix → gzip).
      records: :class:`PoolRecord` objects or dicts of the schema (dicts are validated).
      meta: Merged into each line's ``meta`` (``format_version`` is added).

    Returns:
      The number of records written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=path.name, suffix=".tmp" + (".gz" if path.suffix == ".gz" else "")
    )
    os.close(fd)
    n = 0
    try:
        with _open(Path(tmp), "w") as fh:
            for i, rec in enumerate(records, start=1):
                parsed = _parse(rec, "<records>", i) if isinstance(rec, dict) else rec
                assert parsed is not None  # _parse returns None only when given ReadStats
                fh.write(json.dumps(parsed.to_dict(meta), ensure_ascii=False) + "\n")
                n += 1
        # mkstemp creates 0600 files; give the pool the usual permissions (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def pool_manifest_path(pool: str | os.PathLike) -> Path:
    """``POOL.jsonl.gz`` → ``POOL.manifest.json`` (beside it; what ``build-pool`` writes)."""
    pool = Path(pool)
    name = pool.name
    for suf in (".jsonl.gz", ".jsonl", ".json.gz", ".json", ".gz"):
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    return pool.with_name(name + ".manifest.json")


def declared_score_range(pool: str | os.PathLike) -> tuple[float, float, str] | None:
    """The public range of the pool's proxy scores that its manifest declares, ``(low, high, why)``, or
    ``None`` (no manifest, or none declared).

    The key is ``proxy_score_range``: ``{"low": L, "high": H, "why": "…"}``, a bound of the *reward model*
    chosen without looking at the pool's scores (e.g. for an unbounded Bradley–Terry logit), so clipping
    the scores into it is a data-independent map. The shipped HH pools declare ``[-4, 4]``.

    Raises:
      DataFormatError: the manifest declares a malformed range (not finite, or low ≥ high).
    """
    path = pool_manifest_path(pool)
    if not path.is_file():
        return None
    try:
        declared = json.loads(path.read_text(encoding="utf-8")).get("proxy_score_range")
    except (OSError, ValueError, AttributeError):
        return None
    if declared is None:
        return None
    try:
        low, high = float(declared["low"]), float(declared["high"])
    except (KeyError, TypeError, ValueError):
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise DataFormatError(
            f'{path}: field \'proxy_score_range\' must be {{"low": L, "high": H}} with finite L < H; '
            f"got {declared!r}"
        )
    return low, high, str(declared.get("why", ""))


@dataclass(frozen=True)
class ScoredPool:
    """Dense arrays view of a pool: ``proxy`` and ``true`` of shape (prompts, max candidates), NaN-padded
    for ragged pools; ``counts[p]`` = number of candidates of prompt p."""

    proxy: np.ndarray
    true: np.ndarray
    counts: np.ndarray
    prompts: tuple[str, ...] = ()

    @classmethod
    def from_records(cls, records: Iterable[PoolRecord]) -> ScoredPool:
        recs = list(records)
        if not recs:
            raise DataFormatError("field '<pool>' must contain at least one prompt; the pool is empty")
        c = max(len(r.responses) for r in recs)
        proxy = np.full((len(recs), c), np.nan)
        true = np.full((len(recs), c), np.nan)
        for i, r in enumerate(recs):
            proxy[i, : len(r.responses)] = r.proxy
            true[i, : len(r.responses)] = r.true
        return cls(proxy, true, np.array([len(r.responses) for r in recs]), tuple(r.prompt for r in recs))

    @classmethod
    def from_arrays(cls, proxy, true=None) -> ScoredPool:
        proxy = np.asarray(proxy, dtype=np.float64)
        true = np.full_like(proxy, np.nan) if true is None else np.asarray(true, dtype=np.float64)
        if proxy.ndim != 2 or true.shape != proxy.shape:
            raise DataFormatError(
                f"field 'proxy'/'true' must be 2-D arrays of the same shape; got {proxy.shape}, {true.shape}"
            )
        counts = np.sum(np.isfinite(proxy), axis=1)
        return cls(proxy, true, counts)

    @classmethod
    def read(cls, path: str | os.PathLike, *, stats: ReadStats | None = None) -> ScoredPool:
        """Read a pool file (any accepted variant; ``stats`` receives what was coerced or skipped)."""
        return cls.from_records(iter_pool(path, stats=stats))

    @property
    def has_true(self) -> bool:
        m = np.isfinite(self.proxy)
        return bool(np.all(np.isfinite(self.true[m])))

    def restrict(self, min_candidates: int) -> tuple[ScoredPool, np.ndarray]:
        """The prompts with at least ``min_candidates`` candidates (the documented skip rule), all their
        candidates kept. Returns the sub-pool and the kept prompt indices."""
        keep = np.flatnonzero(self.counts >= min_candidates)
        width = int(self.counts[keep].max()) if keep.size else 0
        sub = ScoredPool(
            self.proxy[keep][:, :width],
            self.true[keep][:, :width],
            self.counts[keep],
            tuple(self.prompts[i] for i in keep) if self.prompts else (),
        )
        return sub, keep

    def to_records(self) -> list[PoolRecord]:
        out = []
        for i in range(self.proxy.shape[0]):
            k = int(self.counts[i])
            resp = tuple(
                Response(
                    "",
                    float(self.proxy[i, j]),
                    true_reward=None if not np.isfinite(self.true[i, j]) else float(self.true[i, j]),
                )
                for j in range(k)
            )
            out.append(PoolRecord(self.prompts[i] if self.prompts else f"prompt-{i}", resp))
        return out
