"""Alembic migrations of the service's ledger schema, shipped inside the package.

Revisions (``versions/``):

* ``0001`` (base): the version-1 schema, float amounts, stored answers without expiry (the first
  released schema). :func:`privalign.service.migrations.versions.v0001_float_ledger.v1_metadata` is the one
  definition of that schema (the upgrade tests build a version-1 ledger with it).
* ``0002``: amounts become exact integer units (grants rounded down, costs rounded up, cached totals
  recomputed from the converted rows), stored answers get an expiry, and the ``privalign_schema``
  version table (version 2) is added. On SQLite the column type changes use Alembic's batch mode
  (copy-and-recreate).
* ``0003``: ``api_keys.user_name`` (budgets shared by the keys of a user); existing keys get ``NULL``
  and keep their own budgets; version 3.

:func:`upgrade` runs at start-up (:func:`privalign.service.db.create_schema`) inside the caller's
transaction, under its lock (PostgreSQL advisory lock, SQLite ``BEGIN IMMEDIATE``):

* a database with an ``alembic_version`` table is upgraded to ``head``;
* a ledger from before Alembic is stamped with the revision its tables match (``0002`` if it has the
  ``privalign_schema`` table, else ``0001``) and upgraded to ``head``;
* an empty database gets the current tables (:data:`privalign.service.db.metadata`, created by
  :func:`privalign.service.db.create_schema`) and is stamped ``head`` (:func:`stamp_head`).

For operators: ``alembic -x url=DB_URL -c <package>/migrations/alembic.ini upgrade head`` is not needed:
``privalign serve`` (and ``privalign keys``) upgrade at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["HEAD", "upgrade", "is_empty", "stamp_head", "current_revision", "alembic_config"]

#: The newest revision.
HEAD = "0003"
_HERE = Path(__file__).resolve().parent


def alembic_config(connection: Any):
    """An Alembic ``Config`` for the shipped scripts that runs on ``connection`` (no ini file)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE))
    cfg.attributes["connection"] = connection
    return cfg


def current_revision(connection: Any) -> str | None:
    """The revision recorded in ``alembic_version`` (``None`` if the table is absent or empty)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def _command():
    try:
        from alembic import command
    except ImportError:
        from privalign.errors import MissingDependencyError

        raise MissingDependencyError(
            "The service's database migrations need Alembic: pip install 'privalign[serve]'."
        ) from None
    return command


def is_empty(connection: Any, *, schema: str | None = None) -> bool:
    """Whether the database holds neither a ledger nor an Alembic version table."""
    from sqlalchemy import inspect

    insp = inspect(connection)
    return not (
        insp.has_table("alembic_version", schema=schema) or insp.has_table("principals", schema=schema)
    )


def stamp_head(connection: Any) -> None:
    """Record :data:`HEAD` for a database just created from the current tables."""
    _command().stamp(alembic_config(connection), "head")


def upgrade(connection: Any, *, schema: str | None = None) -> str:
    """Bring an existing ledger on ``connection`` to :data:`HEAD`, in the caller's transaction (see the
    module docstring; an empty database is created by :func:`privalign.service.db.create_schema`).
    Returns ``"upgraded"`` or ``"current"``."""
    from sqlalchemy import inspect

    command = _command()
    insp = inspect(connection)
    cfg = alembic_config(connection)
    if insp.has_table("alembic_version", schema=schema):
        if current_revision(connection) == HEAD:
            return "current"
        command.upgrade(cfg, "head")
        return "upgraded"
    if not insp.has_table("principals", schema=schema):
        raise ValueError(
            "The database holds no privalign ledger to upgrade; "
            "privalign.service.db.create_schema creates one."
        )
    # A ledger from before Alembic: stamp the revision its tables match, then upgrade.
    command.stamp(cfg, "0002" if insp.has_table("privalign_schema", schema=schema) else "0001")
    command.upgrade(cfg, "head")
    return "upgraded"
