"""``privalign serve [--config FILE] [--reward-model PATH]``: run the private best-of-N HTTP service."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    from privalign.cli._args import port

    p = subparsers.add_parser(
        "serve",
        help="Run the OpenAI-compatible private best-of-N service.",
        description="Run the OpenAI-compatible private best-of-N service (FastAPI + uvicorn; needs 'pip "
        "install privalign[serve]'). Without --config it starts on embedded defaults: a SQLite ledger in the "
        "user's data directory ($PRIVALIGN_HOME, else $XDG_DATA_HOME/privalign, else "
        "~/.local/share/privalign), the shipped HH-RLHF reward model and the local SmolLM2 generator (loaded "
        "on the first generating request). Keys are managed with 'privalign keys'. See docs/service.md.",
    )
    p.add_argument(
        "--config",
        default=None,
        help="TOML config file (see configs/serve.example.toml); default: the embedded defaults.",
    )
    p.add_argument(
        "--reward-model",
        default=None,
        metavar="PATH",
        help="Serve this reward-model file (as written by 'privalign fit-reward --out'); overrides "
        "[reward_model].",
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="Database URL (sqlite:///FILE or postgresql+psycopg://...); overrides [database].url.",
    )
    p.add_argument(
        "--generator",
        default=None,
        choices=["transformers", "ctranslate2", "none"],
        help="Override [generator].kind: the local SmolLM2 through transformers (the default), through "
        "CTranslate2 int8 (about 2-3x the tokens/s on CPU; extra fast-cpu), or none (only /v1/select). The "
        "section's sampling options are kept between the two local kinds and dropped otherwise.",
    )
    p.add_argument("--host", default=None, help="Override [server].host.")
    p.add_argument("--port", type=port, default=None, help="Override [server].port (0..65535).")
    p.add_argument(
        "--preload",
        action="store_true",
        help="Load the generator (e.g. SmolLM2) before serving, so the first generating request does not "
        "spend its deadline ([limits].request_timeout_s) on loading the model.",
    )
    p.add_argument("--print-openapi", action="store_true", help="Print the OpenAPI schema as JSON and exit.")
    p.add_argument(
        "--check",
        action="store_true",
        help="Validate the config, check that the host and port can be listened on, open the database "
        "(read-only) and the reward model, print a JSON summary and exit. Writes nothing: a ledger that does "
        "not exist yet is reported, not created.",
    )
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from privalign.service.config import config_with_overrides, default_config
    from privalign.service.server import (
        check_listen,
        check_service,
        ensure_ledger_folder,
        open_app,
        preload_generator,
    )

    cfg = config_with_overrides(
        args.config,
        reward_model=args.reward_model,
        db=args.db,
        generator=args.generator,
        host=args.host,
        port=args.port,
    )
    if args.print_openapi:  # the schema needs no ledger: an in-memory one, so that nothing is written
        app = open_app(replace(cfg, database=replace(cfg.database, url="sqlite://", schema="")))
        print(json.dumps(app.openapi()))
        return 0
    check_listen(cfg.server.host, cfg.server.port)  # serve binds before it prints a URL; --check too
    if args.check:  # writes nothing anywhere: the database is opened read-only, no folder or file is made
        print(json.dumps(check_service(cfg)))
        return 0
    ensure_ledger_folder(cfg)
    from privalign.service.server import run

    app = open_app(cfg)  # fail here (one line) rather than inside uvicorn
    if args.preload and app.state.service.generator is not None:
        import time

        t0 = time.perf_counter()
        print(f"privalign serve: loading the generator ({cfg.generator.kind}) ...", file=sys.stderr)
        preload_generator(app, cfg)
        print(f"privalign serve: generator ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    base = f"http://{cfg.server.host}:{cfg.server.port}"
    if args.config and args.db is None:
        db_flag = f"--config {args.config} "
    elif args.db is None and cfg.database.url == default_config().database.url:
        db_flag = ""  # `privalign keys` defaults to this ledger
    else:
        db_flag = f"--db {cfg.database.url} "
    print(
        f"privalign serve: serving on {base} (config: {cfg.source}; ledger: {cfg.database.url}; "
        f"reward model: {cfg.reward_model.options.get('path') or cfg.reward_model.kind}; "
        f"generator: {cfg.generator.kind})",
        file=sys.stderr,
    )
    print(
        f"privalign serve: create an API key with:  privalign keys create {db_flag}--budget-epsilon 10",
        file=sys.stderr,
    )
    print(
        f'privalign serve: then:  curl -s {base}/v1/select -H "Authorization: Bearer $TOKEN" '
        '-H \'Content-Type: application/json\' -d \'{"prompt": "Hi", "candidates": ["a", "b"], '
        '"privacy": {"epsilon": 1}}\'',
        file=sys.stderr,
    )
    run(cfg, app=app)
    return 0
