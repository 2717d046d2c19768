"""Alembic environment: runs on the connection handed over in ``config.attributes["connection"]``
(:func:`privalign.service.migrations.upgrade`), inside the caller's transaction. Batch mode is on so that
SQLite can change column types (copy-and-recreate)."""

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "privalign's migrations run through privalign.service.migrations.upgrade(connection); "
        "privalign serve and privalign keys call it at start-up"
    )
context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
