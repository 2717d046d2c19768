"""``privalign serve --config FILE``: run the private best-of-N HTTP service."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="Run the OpenAI-compatible private best-of-N service.",
        description="Run the OpenAI-compatible private best-of-N service (FastAPI + uvicorn). "
        "Keys are managed with 'privalign keys'. See docs/service.md.",
    )
    p.add_argument("--config", required=True, help="TOML config file (see configs/serve.example.toml).")
    p.add_argument("--host", default=None, help="Override [server].host.")
    p.add_argument("--port", type=int, default=None, help="Override [server].port.")
    p.add_argument("--print-openapi", action="store_true", help="Print the OpenAPI schema as JSON and exit.")
    p.add_argument("--check", action="store_true", help="Validate the config, open the database, print a summary and exit.")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from privalign.service.config import load_config

    cfg = load_config(args.config)
    if args.print_openapi or args.check:
        from privalign.service.app import create_app

        app = create_app(cfg)
        if args.print_openapi:
            print(json.dumps(app.openapi()))
        else:
            st = app.state.service
            print(json.dumps({"config": cfg.source, "database": st.engine.dialect.name, "methods": list(cfg.privacy.allowed_methods),
                              "reward_model": cfg.reward_model.kind, "generator": cfg.generator.kind}))
        return 0
    from privalign.service.server import run

    print(f"privalign: serving on http://{args.host or cfg.server.host}:{cfg.server.port if args.port is None else args.port}", file=sys.stderr)
    run(cfg, host=args.host, port=args.port)
    return 0
