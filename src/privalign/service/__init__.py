"""privalign.service: the private best-of-N HTTP service (OpenAI-compatible) with per-key privacy budgets.

Modules (imported lazily; FastAPI, SQLAlchemy and uvicorn are needed only here, extra ``serve``):

* :mod:`privalign.service.app`: ``create_app(cfg)``, the routes and the request flow;
* :mod:`privalign.service.store`: ``SQLBudgetStore``, the ``BudgetStore`` of the privacy filters on SQLite
  or PostgreSQL (append-only ledger, reserve-before-run, reconciliation);
* :mod:`privalign.service.db`: the schema; :mod:`privalign.service.keys`: API keys;
* :mod:`privalign.service.config`: the TOML config; :mod:`privalign.service.components`: reward model and
  generator; :mod:`privalign.service.metrics`; :mod:`privalign.service.server`: the uvicorn runner.

See ``docs/service.md``.
"""
