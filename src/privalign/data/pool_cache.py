"""A columnar cache of scored pools: the JSONL file is parsed once, then read back memory-mapped.

:func:`read_scored_pool` returns the same :class:`~privalign.data.pools.ScoredPool` as
``ScoredPool.read(path)`` (same arrays, bit for bit; same :class:`~privalign.data.pools.ReadStats`), but

* the first read streams the file without building a ``Response`` object per candidate (a fast path that
  checks each line's types in bulk; any line it is not sure about goes through the validating parser, so
  errors and coercions are exactly those of :func:`~privalign.data.pools.iter_pool`), and writes
  ``proxy.npy``, ``true.npy``, ``counts.npy`` and ``meta.json`` (prompts, read statistics, the source's
  identity) into ``<user cache>/pools/<key>/``;
* later reads memory-map the ``.npy`` files (``numpy.load(mmap_mode="r")``): nothing is parsed, and the
  arrays are paged in on use.

Peak memory of a first read: one parsed line and one row (each row's scores are streamed to flat temporary
files, then laid out as NaN-padded ``.npy`` files with buffered writes), plus the prompt strings; the score
arrays are never held in memory.

Invalidation: the key hashes the pool's resolved path, size, ``mtime_ns``, ``ctime_ns`` and inode. Any
write to the file, a rename over it (as :func:`~privalign.data.pools.write_pool` does) or a ``touch``
changes the ctime (which user code cannot set back), so a changed pool is never served from a stale
entry; older entries of the same path are removed when a new one is written. The cache directory is
``$PRIVALIGN_CACHE_DIR`` (else ``$XDG_CACHE_HOME/privalign``, else ``~/.cache/privalign``), subfolder
``pools``; pass ``cache_dir`` to use another. Entries are written atomically (temporary folder + rename).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from privalign.data.pools import (
    ReadStats,
    ScoredPool,
    _decoding,
    _open,
    _parse,
    iter_json_lines,
    iter_pool,
)
from privalign.errors import DataFormatError

__all__ = ["CACHE_FORMAT", "read_scored_pool", "pool_cache_entry"]

CACHE_FORMAT = "privalign-pool-cache/1"


def _identity(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {
        "path": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "inode": st.st_ino,
    }


def pool_cache_entry(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder that holds (or would hold) the columns of the pool file ``path`` as it is now."""
    path = Path(path).resolve()
    ident = _identity(path)
    root = _root(cache_dir)
    head = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    tail = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return root / f"{head}-{tail}"


def _root(cache_dir) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from privalign.paths import user_cache_dir

    return user_cache_dir() / "pools"


def read_scored_pool(
    path: str | os.PathLike, *, stats: ReadStats | None = None, cache_dir: str | os.PathLike | None = None
) -> ScoredPool:
    """Read a pool file through the columnar cache (build the entry on first use).

    Args:
      path: The pool file (any variant :func:`~privalign.data.pools.iter_pool` accepts).
      stats: Filled with what the (first) read coerced or skipped, as :meth:`ScoredPool.read` does.
      cache_dir: Cache root (default ``<user cache>/pools``).

    Returns:
      A :class:`ScoredPool` whose ``proxy``, ``true`` and ``counts`` are read-only views of memory-mapped
      ``.npy`` files.

    Raises:
      FileNotFoundError, DataFormatError: as :meth:`ScoredPool.read` (nothing is cached for a bad file).
    """
    path = Path(path)
    if path.is_dir():
        raise DataFormatError(f"{path}: field '<file>' is a directory, not a pool file")
    if not path.is_file():
        raise FileNotFoundError(f"pool file not found: {path}")
    entry = pool_cache_entry(path, cache_dir=cache_dir)
    meta = _load_meta(entry)
    if meta is None:
        _build(path, entry)
        meta = _load_meta(entry)
        if meta is None:  # pragma: no cover - the entry was removed between write and read
            raise DataFormatError(f"{path}: field '<cache>' could not be read back from {entry}")
    if stats is not None:
        for k, v in meta["stats"].items():
            setattr(stats, k, v)
    arrays = [
        np.asarray(np.load(entry / f"{name}.npy", mmap_mode="r")) for name in ("proxy", "true", "counts")
    ]
    return ScoredPool(arrays[0], arrays[1], arrays[2], tuple(meta["prompts"]))


def _load_meta(entry: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if meta.get("format") == CACHE_FORMAT else None


def _rows_of(obj: Any, path: Path, lineno: int, stats: ReadStats):
    """``(prompt, proxy row, true row)`` of one parsed line, or None for a skipped prompt. Bulk type checks
    first; anything else goes through the validating parser (same errors, coercions and counts)."""
    resp = obj.get("responses") if type(obj) is dict else None
    if (
        type(resp) is list
        and resp
        and type(obj.get("prompt")) is str
        and all(type(r) is dict for r in resp)
        and _plain_prompt_fields(obj)
    ):
        proxy = [r.get("proxy_reward") for r in resp]
        correct = [r.get("is_correct") for r in resp]
        if (
            all(type(v) is float or type(v) is int for v in proxy)
            and all(type(v) is bool for v in correct)
            and all(
                r.get("true_reward") is None
                and type(r.get("text", "")) is str
                and (r.get("predicted_answer") is None or type(r.get("predicted_answer")) is str)
                for r in resp
            )
        ):
            try:
                p = np.array(proxy, dtype=np.float64)
            except OverflowError:  # an integer beyond float range: the validating parser reports it
                p = None
            if p is not None and np.isfinite(p).all():
                stats.responses_read += len(resp)
                return obj["prompt"], p, np.array(correct, dtype=np.float64)
    rec = _parse(obj, path, lineno, stats)
    return None if rec is None else (rec.prompt, rec.proxy, rec.true)


def _plain_prompt_fields(obj: dict) -> bool:
    ch = obj.get("choices")
    return (
        (ch is None or (type(ch) is list and all(type(c) is str for c in ch)))
        and (obj.get("meta") is None or type(obj.get("meta")) is dict)
        and all(obj.get(k) is None or type(obj.get(k)) is str for k in ("gt_answer", "subject"))
    )


def _iter_rows(path: Path, stats: ReadStats):
    with _open(path, "r") as fh, _decoding(path):
        first = fh.read(1)
        while first and first.isspace():
            first = fh.read(1)
        if first == "[":  # one JSON array: the validating reader (rare variant)
            fh.close()
            for rec in iter_pool(path, stats=stats):
                yield rec.prompt, rec.proxy, rec.true
            return
        for lineno, obj in iter_json_lines(fh, first, path):
            row = _rows_of(obj, path, lineno, stats)
            if row is not None:
                stats.prompts_read += 1
                yield row


def _build(path: Path, entry: Path) -> None:
    """Parse ``path`` once, streaming each row's scores to flat temporary files, then lay them out as
    NaN-padded ``(prompts, width)`` ``.npy`` files with plain buffered writes: memory holds one parsed line
    and one padded row at a time (plus the prompt strings), never the score arrays."""
    stats = ReadStats()
    ident = _identity(path.resolve())
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-" + entry.name))
    try:
        prompts, counts = [], []
        with open(tmp / "proxy.bin", "wb") as fp, open(tmp / "true.bin", "wb") as ft:
            for prompt, p, t in _iter_rows(path, stats):
                prompts.append(prompt)
                counts.append(p.size)
                fp.write(np.ascontiguousarray(p, dtype=np.float64).tobytes())
                ft.write(np.ascontiguousarray(t, dtype=np.float64).tobytes())
        if not prompts:
            raise DataFormatError(
                f"{path}: field '<file>' must contain at least one prompt; the pool is empty"
            )
        counts_arr = np.array(counts)
        width = int(counts_arr.max())
        for name in ("proxy", "true"):
            _layout(tmp / f"{name}.bin", tmp / f"{name}.npy", counts, width)
            (tmp / f"{name}.bin").unlink()
        np.save(tmp / "counts.npy", counts_arr)
        meta = {
            "format": CACHE_FORMAT,
            "source": ident,
            "stats": stats.to_dict(),
            "prompts": prompts,
            "shape": [len(prompts), width],
        }
        (tmp / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
        for old in entry.parent.glob(entry.name.split("-")[0] + "-*"):  # stale entries of this path
            if old != entry and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, entry)
        except OSError:  # another process wrote the same entry first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _layout(flat: Path, out: Path, counts: list[int], width: int) -> None:
    """Write the ``.npy`` of shape ``(len(counts), width)``: row i = the next ``counts[i]`` doubles of
    ``flat``, padded with NaN."""
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.float64)),
        "fortran_order": False,
        "shape": (len(counts), width),
    }
    pad = np.full(width, math.nan)
    with open(flat, "rb") as src, open(out, "wb") as dst:
        np.lib.format.write_array_header_1_0(dst, header)
        if all(c == width for c in counts):  # rectangular: the flat file is the matrix
            shutil.copyfileobj(src, dst, 1 << 20)
            return
        for c in counts:
            dst.write(src.read(8 * c))
            dst.write(pad[: width - c].tobytes())
