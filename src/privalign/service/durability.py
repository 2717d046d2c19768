"""Group commit for the ledger: many committed reservations, one disk flush, off the request's path.

A durable reservation used to wait, inside its own transaction, for one disk flush (SQLite
``synchronous=FULL``, PostgreSQL ``synchronous_commit = on``). With group commit the reservation is
committed **without** waiting for the flush (it is visible to every other transaction at once, so the
budget check stays serialised exactly as before), and handed to a :class:`GroupFlusher`, which runs one
flush at a time, each covering everything committed before it began: in a background thread while the
request goes on to generate, score and select, or in the waiting thread itself when nothing is left to
overlap. Before any answer leaves, the request waits for its ticket
(:meth:`GroupFlusher.wait`): the flush that covers its reservation must have completed.

Why one flush covers a batch: every item handed to :meth:`GroupFlusher.submit` was committed before it
was handed over, and a batch is taken (under the lock) before its flush starts, so each item of the batch
was committed before the flush began.

* SQLite (WAL mode, ``synchronous=NORMAL``): a commit ``write()``\\ s its frames to the ``-wal`` file; the
  flush is ``fdatasync`` of that file (its data and its size), which makes every frame written before it
  durable (the frames carry checksums; recovery replays the WAL up to the last complete commit). If the
  WAL file was checkpointed and removed in between, the checkpoint already synced the database file
  (SQLite syncs the database after each checkpoint in ``NORMAL`` mode); the database file is synced again
  anyway.
* PostgreSQL (``synchronous_commit = off`` for the reserve): the flush is one autocommit statement that
  writes a transactional WAL message (``pg_logical_emit_message``, which assigns a transaction id) and
  commits with ``synchronous_commit = on``, so the server flushes its WAL up to that commit record, past
  the commit record of every transaction it could see. The same statement counts the batch's
  ``reserve`` rows: a row it sees was committed before it, so its commit record precedes the flush's; a row
  it does not see was lost (the server crashed and recovered between the reserve and the flush), and that
  request fails instead of answering.

A flush that fails, or a wait that times out, raises :class:`DurabilityError`: the request then answers
without releasing anything (its reservation stays, charged at the reserved cost, fail closed).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["DurabilityError", "GroupFlusher", "Ticket", "sqlite_wal_flush"]

log = logging.getLogger("privalign.service")


class DurabilityError(Exception):
    """A reservation could not be confirmed on disk (the flush failed or the wait timed out)."""


class Ticket:
    """One submitted item; :meth:`GroupFlusher.wait` returns once a flush covering it has completed."""

    __slots__ = ("item", "done", "error", "taken")

    def __init__(self, item: Any) -> None:
        self.item = item
        self.done = threading.Event()
        self.error: str | None = None
        self.taken = False  # in a batch whose flush has started


class GroupFlusher:
    """Group commit with one flush at a time: a flush covers every item submitted before it began.

    A flush is started either by the background thread (``submit(..., background=True)``, so that it
    overlaps the caller's next steps) or by a waiter (leader/follower: a :meth:`wait` whose item is not in
    a running flush, while no flush runs, takes every queued item and flushes them itself, with no thread
    hand-over). Items submitted while a flush runs go into the next one.

    Args:
      flush: ``flush(items) -> failed``: make every item (already committed) durable; returns the
        items that could not be confirmed (an empty collection if all are durable). An exception fails
        the whole batch.
      name: thread name.
    """

    def __init__(self, flush: Callable[[list[Any]], Iterable[Any]], *, name: str = "privalign-flush") -> None:
        self._flush = flush
        self._name = name
        self._cv = threading.Condition()
        self._queue: list[Ticket] = []
        self._flushing = False
        self._thread: threading.Thread | None = None
        self._closed = False
        self.flushes = 0  # number of flushes done (tests and benchmarks read it)
        self.items = 0  # number of items made durable

    def submit(self, item: Any, *, background: bool = True) -> Ticket:
        """Hand over an item **already committed**. ``background``: have the background thread start a
        flush as soon as none is running (the caller goes on meanwhile); else the flush starts when
        someone waits."""
        t = Ticket(item)
        with self._cv:
            if self._closed:
                raise DurabilityError("the flusher is closed")
            self._queue.append(t)
            if background:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
                self._cv.notify_all()
        return t

    def wait(self, ticket: Ticket, timeout: float | None = None) -> None:
        """Block until a flush covering ``ticket`` has completed (flushing it here if no flush is running).

        Raises:
          DurabilityError: the flush failed, the item was not confirmed, or ``timeout`` (seconds) passed.
        """
        end = None if timeout is None else time.monotonic() + timeout
        while not ticket.done.is_set():
            batch = None
            with self._cv:
                if not ticket.done.is_set() and not ticket.taken and not self._flushing:
                    batch = self._take()
            if batch is not None:
                self._do(batch)
                continue
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise DurabilityError(f"the reservation was not confirmed on disk within {timeout:.3g} s")
            # Woken when a flush ends (the item may then be covered, or the next flush may be ours to run).
            with self._cv:
                if not ticket.done.is_set() and (ticket.taken or self._flushing):
                    self._cv.wait(left)
        if ticket.error is not None:
            raise DurabilityError(ticket.error)

    def close(self) -> None:
        """Flush what is queued and stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            th = self._thread
        if th is not None:
            th.join(timeout=30)

    def _take(self) -> list[Ticket]:
        """(Lock held.) Take every queued item into a batch and mark a flush as running."""
        batch, self._queue = self._queue, []
        for t in batch:
            t.taken = True
        self._flushing = True
        return batch

    def _do(self, batch: list[Ticket]) -> None:
        try:
            failed = set(self._flush([t.item for t in batch]) or ())
            err = None
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter of the batch
            failed, err = set(), f"the flush to disk failed ({type(exc).__name__}: {exc})"
            log.error("ledger flush failed: %s", err)
        for t in batch:
            if err is not None:
                t.error = err
            elif t.item in failed:
                t.error = "the reservation was lost before it reached the disk (database restarted?)"
        with self._cv:
            self._flushing = False
            self.flushes += 1
            self.items += len(batch)
            for t in batch:
                t.done.set()
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while (not self._queue or self._flushing) and not self._closed:
                    self._cv.wait()
                if not self._queue:  # closed and drained
                    return
                if self._flushing:  # closed while a waiter flushes: wait for it, then drain
                    self._cv.wait()
                    continue
                batch = self._take()
            self._do(batch)


def sqlite_wal_flush(db_path: str) -> Callable[[list[Any]], Iterable[Any]]:
    """The flush of a SQLite database in WAL mode: ``fdatasync`` of its ``-wal`` file (the database file
    instead, if the WAL file does not exist: it was checkpointed and removed)."""

    def flush(_items: list[Any]) -> Iterable[Any]:
        for path in (db_path + "-wal", db_path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fdatasync(fd)  # the data and the size of a grown file: what recovery reads
            finally:
                os.close(fd)
            if path.endswith("-wal"):
                return ()
        return ()

    return flush
