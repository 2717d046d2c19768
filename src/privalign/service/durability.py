"""Group commit for the ledger: many committed reservations, one disk flush, off the request's path.

A durable reservation used to wait, inside its own transaction, for one disk flush (SQLite
``synchronous=FULL``, PostgreSQL ``synchronous_commit = on``). With group commit the reservation is
committed **without** waiting for the flush (it is visible to every other transaction at once, so the
budget check stays serialised exactly as before), and handed to a :class:`GroupFlusher`: one background
thread per store that flushes everything committed so far in one go, while the request goes on to
generate, score and select. Before any answer leaves, the request waits for its ticket
(:meth:`GroupFlusher.wait`): the flush that covers its reservation must have completed.

Why one flush covers a batch: every item handed to :meth:`GroupFlusher.submit` was committed before it
was handed over, and a batch is taken (under the lock) before its flush starts, so each item of the batch
was committed before the flush began.

* SQLite (WAL mode, ``synchronous=NORMAL``): a commit ``write()``\\ s its frames to the ``-wal`` file; the
  flush is ``fsync`` of that file, which makes every frame written before it durable (the frames carry
  checksums; recovery replays the WAL up to the last complete commit). If the WAL file was checkpointed
  and removed in between, the checkpoint already synced the database file (SQLite syncs the database
  after each checkpoint in ``NORMAL`` mode); the database file is synced again anyway.
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
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["DurabilityError", "GroupFlusher", "Ticket", "sqlite_wal_flush"]

log = logging.getLogger("privalign.service")


class DurabilityError(Exception):
    """A reservation could not be confirmed on disk (the flush failed or the wait timed out)."""


class Ticket:
    """One submitted item; :meth:`GroupFlusher.wait` returns once a flush covering it has completed."""

    __slots__ = ("item", "done", "error")

    def __init__(self, item: Any) -> None:
        self.item = item
        self.done = threading.Event()
        self.error: str | None = None


class GroupFlusher:
    """Leader thread for group commit: flushes, in one call of ``flush``, every item submitted since
    the previous flush began.

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
        self._thread: threading.Thread | None = None
        self._closed = False
        self.flushes = 0  # number of flushes done (tests and benchmarks read it)
        self.items = 0  # number of items made durable

    def submit(self, item: Any) -> Ticket:
        """Hand over an item **already committed**; the flush starts as soon as the thread is free."""
        t = Ticket(item)
        with self._cv:
            if self._closed:
                raise DurabilityError("the flusher is closed")
            self._queue.append(t)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()
        return t

    @staticmethod
    def wait(ticket: Ticket, timeout: float | None = None) -> None:
        """Block until a flush covering ``ticket`` has completed.

        Raises:
          DurabilityError: the flush failed, the item was not confirmed, or ``timeout`` (seconds) passed.
        """
        if not ticket.done.wait(timeout):
            raise DurabilityError(f"the reservation was not confirmed on disk within {timeout:.3g} s")
        if ticket.error is not None:
            raise DurabilityError(ticket.error)

    def close(self) -> None:
        """Flush what is queued and stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
            th = self._thread
        if th is not None:
            th.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:  # closed and drained
                    return
                batch, self._queue = self._queue, []
            try:
                failed = set(self._flush([t.item for t in batch]) or ())
                err = None
            except BaseException as exc:  # noqa: BLE001 - reported to every waiter of the batch
                failed, err = None, f"the flush to disk failed ({type(exc).__name__}: {exc})"
                log.error("ledger flush failed: %s", err)
            for t in batch:
                if err is not None:
                    t.error = err
                elif t.item in failed:  # type: ignore[operator]
                    t.error = "the reservation was lost before it reached the disk (database restarted?)"
            self.flushes += 1
            self.items += len(batch)
            for t in batch:
                t.done.set()


def sqlite_wal_flush(db_path: str) -> Callable[[list[Any]], Iterable[Any]]:
    """The flush of a SQLite database in WAL mode: ``fsync`` of its ``-wal`` file (the database file
    instead, if the WAL file does not exist: it was checkpointed and removed)."""

    def flush(_items: list[Any]) -> Iterable[Any]:
        for path in (db_path + "-wal", db_path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if path.endswith("-wal"):
                return ()
        return ()

    return flush
