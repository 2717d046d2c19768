"""privalign.service: the private best-of-N HTTP service (OpenAI-compatible) with per-key privacy budgets.

Modules (imported lazily; FastAPI, SQLAlchemy and uvicorn are needed only here, extra ``serve``):

* :mod:`privalign.service.app`: ``create_app(cfg)`` (middleware, error handlers, routers);
* :mod:`privalign.service.pipeline`: the request path, reserve → generate → score → select → charge →
  respond, one module per step in :mod:`privalign.service.steps`; :mod:`privalign.service.state`:
  ``ServiceState``; :mod:`privalign.service.job`: the request, reservation and answer objects;
  :mod:`privalign.service.routes`: the HTTP routers;
  :mod:`privalign.service.schemas`: strict request schemas; :mod:`privalign.service.plan`: privacy
  parameter checks and the selection;
* :mod:`privalign.service.store`: ``SQLBudgetStore``, the ``BudgetStore`` of the privacy filters on SQLite
  or PostgreSQL (append-only ledger, reserve-before-run, reconciliation);
* :mod:`privalign.service.db`: the schema, exact ledger units, the schema upgrade;
  :mod:`privalign.service.keys`: API keys;
* :mod:`privalign.service.config`: the TOML config; :mod:`privalign.service.components`: reward model and
  generator; :mod:`privalign.service.metrics`; :mod:`privalign.service.server`: the uvicorn runner.

See ``docs/service.md``.
"""
