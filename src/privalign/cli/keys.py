"""``privalign keys {create,list,top-up,revoke}``: admin CLI for API keys and budgets.

Admin actions exist only here (direct database access), never over HTTP. The database comes from
``--db URL`` (plus ``--db-schema`` for PostgreSQL) or from a service config's ``[database]``.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("keys", help="Create, list, top up and revoke service API keys.")
    sub = p.add_subparsers(dest="keys_command", metavar="ACTION")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--db",
            default=None,
            help="Database URL (e.g. sqlite:///svc.db, postgresql+psycopg://@127.0.0.1/test).",
        )
        sp.add_argument("--db-schema", default=None, help="PostgreSQL schema.")
        sp.add_argument(
            "--config", default=None, help="Service config whose [database] to use (if --db is absent)."
        )
        sp.add_argument("--json", action="store_true", help="Print JSON on stdout.")

    c = sub.add_parser("create", help="Create a key with a privacy budget; prints the token once.")
    c.add_argument("--budget-epsilon", type=float, required=True, help="Budget ε (> 0).")
    c.add_argument(
        "--budget-delta", type=float, default=0.0, help="Budget δ in [0, 1) (zcdp: δ of the conversion, > 0)."
    )
    c.add_argument(
        "--accounting",
        choices=["pure", "zcdp", "ex-post"],
        default="pure",
        help="Accounting of this key's budget.",
    )
    c.add_argument("--name", default="", help="A label.")
    common(c)
    c.set_defaults(func=_create)

    ls = sub.add_parser("list", help="List keys with limit, spent, reserved, remaining.")
    common(ls)
    ls.set_defaults(func=_list)

    t = sub.add_parser("top-up", help="Add budget to a key.")
    t.add_argument("key_id", help="the key's id (privalign keys list)")
    t.add_argument("--epsilon", type=float, default=0.0, help="ε to add to the key's budget (default 0)")
    t.add_argument("--delta", type=float, default=0.0, help="δ to add to the key's budget (default 0)")
    common(t)
    t.set_defaults(func=_top_up)

    r = sub.add_parser("revoke", help="Revoke a key (401 from then on; its ledger is kept).")
    r.add_argument("key_id", help="the key's id (privalign keys list)")
    common(r)
    r.set_defaults(func=_revoke)
    p.set_defaults(func=_no_action)


def _no_action(args: argparse.Namespace) -> int:
    print(
        "privalign keys: error: an ACTION is required: create, list, top-up or revoke "
        "(see 'privalign keys --help')",
        file=sys.stderr,
    )
    return 2


def _engine(args: argparse.Namespace):  # noqa: ANN202
    from privalign.errors import PrivacyParameterError
    from privalign.service import db

    url, schema = args.db, args.db_schema
    if url is None and args.config:
        import tomllib

        from privalign.service.config import load_config

        try:
            cfg = load_config(args.config)
        except tomllib.TOMLDecodeError as exc:  # as serve: name the file
            raise ValueError(f"argument --config: {args.config} is not valid TOML: {exc}") from None
        url, schema = cfg.database.url, schema or cfg.database.schema or None
    if url is None:
        raise PrivacyParameterError("The '--db' parameter (or '--config') is required. Got neither.")
    engine = db.make_engine(url, schema=schema)
    db.create_schema(engine, schema=schema)
    return engine


def _create(args: argparse.Namespace) -> int:
    from privalign.service.keys import create_key

    key_id, token = create_key(
        _engine(args),
        budget_epsilon=args.budget_epsilon,
        budget_delta=args.budget_delta,
        accounting=args.accounting,
        name=args.name,
    )
    out = {
        "key_id": key_id,
        "token": token,
        "accounting": args.accounting,
        "budget_epsilon": args.budget_epsilon,
        "budget_delta": args.budget_delta,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(token)
        print(
            f"key {key_id} created ({args.accounting}, ε={args.budget_epsilon}, δ={args.budget_delta}); "
            "the token is shown only once",
            file=sys.stderr,
        )
    return 0


def _list(args: argparse.Namespace) -> int:
    from privalign.service.keys import list_keys

    rows = list_keys(_engine(args))
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(
                f"{r['key_id']}  {r['accounting']:7s}  revoked={r['revoked']!s:5s}  limit={r['limit']}  "
                f"spent={r['spent']}  reserved={r['reserved']}  remaining={r['remaining']}  {r['name']}"
            )
    return 0


def _top_up(args: argparse.Namespace) -> int:
    from privalign.service.keys import top_up

    top_up(_engine(args), args.key_id, epsilon=args.epsilon, delta=args.delta)
    if args.json:
        print(json.dumps({"key_id": args.key_id, "added_epsilon": args.epsilon, "added_delta": args.delta}))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from privalign.service.keys import revoke_key

    revoke_key(_engine(args), args.key_id)
    if args.json:
        print(json.dumps({"key_id": args.key_id, "revoked": True}))
    return 0
