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
        help="Validate the config, check that the host and port can be listened on, open the database and "
        "the reward model, print a JSON summary and exit.",
    )
    p.set_defaults(func=_serve)


def _config(args: argparse.Namespace):  # noqa: ANN202
    import tomllib
    from dataclasses import replace
    from pathlib import Path

    from privalign.service.config import default_config, load_config

    if args.config and not Path(args.config).is_file():
        raise FileNotFoundError(f"argument --config: no such file: {args.config}")
    try:
        cfg = load_config(args.config) if args.config else default_config()
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"argument --config: {args.config} is not valid TOML: {exc}") from None
    if args.reward_model is not None:
        path = Path(args.reward_model).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"argument --reward-model: no such file: {args.reward_model}")
        cfg = replace(
            cfg, reward_model=replace(cfg.reward_model, kind="linear", options={"path": str(path.resolve())})
        )
    if args.generator is not None:
        local = ("transformers", "ctranslate2")
        keep = cfg.generator.kind in local and args.generator in local
        cfg = replace(
            cfg,
            generator=replace(
                cfg.generator, kind=args.generator, options=dict(cfg.generator.options) if keep else {}
            ),
        )
    if args.db is not None:
        cfg = replace(cfg, database=replace(cfg.database, url=args.db))
    if args.port is not None:
        cfg = replace(cfg, server=replace(cfg.server, port=args.port))
    if args.host is not None:
        cfg = replace(cfg, server=replace(cfg.server, host=args.host))
    cfg = cfg.validate()
    url = cfg.database.url
    if (
        url.startswith("sqlite:///") and ":memory:" not in url
    ):  # create the ledger's directory (not the file's parents)
        folder = Path(url[len("sqlite:///") :]).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(
                f"cannot create the folder {str(folder)!r} of the SQLite ledger {url!r} (--db / "
                f"[database].url): {exc.strerror or exc}"
            ) from None
    return cfg


def _create_app(cfg):  # noqa: ANN001, ANN202
    """Build the app, naming the config key when the database or the reward model cannot be opened."""
    from privalign.service.app import create_app

    try:
        return create_app(cfg)
    except Exception as exc:
        if (type(exc).__module__ or "").startswith("sqlalchemy"):
            orig = getattr(exc, "orig", None)
            detail = " ".join(str(orig if orig is not None else exc).split("\n")[0].split())
            raise OSError(
                f"cannot open the database {cfg.database.url!r} (--db / [database].url): "
                f"{type(exc).__name__}: {detail[:300]}"
            ) from None
        raise


def _check_listen(host: str, port: int) -> None:
    """Bind the listening address once, as uvicorn will (``SO_REUSEADDR``, IPv6 when the host has a
    colon), so that a busy or forbidden port is one line (exit 2) before anything is printed or loaded."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ValueError(
            f"argument --port: cannot listen on {host}:{port} (--host/--port, else [server].host/port): "
            f"{reason}"
        ) from None


def _serve(args: argparse.Namespace) -> int:
    from privalign.service.config import default_config

    cfg = _config(args)
    if not args.print_openapi:  # serve --check validates the port too; serve binds before it prints a URL
        _check_listen(cfg.server.host, cfg.server.port)
    if args.print_openapi or args.check:
        app = _create_app(cfg)
        if args.print_openapi:
            print(json.dumps(app.openapi()))
        else:
            st = app.state.service
            rm = getattr(st.scorer, "model", st.scorer)
            print(
                json.dumps(
                    {
                        "config": cfg.source,
                        "database": st.engine.dialect.name,
                        "database_url": cfg.database.url,
                        "host": cfg.server.host,
                        "port": cfg.server.port,
                        "methods": list(cfg.privacy.allowed_methods),
                        "reward_model": cfg.reward_model.kind,
                        "reward_model_path": cfg.reward_model.options.get("path"),
                        "reward_model_privacy_event": getattr(rm, "privacy_event", None),
                        "generator": cfg.generator.kind,
                    }
                )
            )
        return 0
    from privalign.service.server import run

    app = _create_app(cfg)  # fail here (one line) rather than inside uvicorn
    gen = app.state.service.generator
    if args.preload and gen is not None:
        import time

        t0 = time.perf_counter()
        print(f"privalign serve: loading the generator ({cfg.generator.kind}) ...", file=sys.stderr)
        st = app.state.service
        warm = st.start_warm_up()  # the same warm-up /readyz reports; joined here so serving starts warm
        if warm is not None:
            warm.join()
        if st.warm_error:
            raise OSError(f"the generator ({cfg.generator.kind}) failed to load: {st.warm_error} (--preload)")
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
