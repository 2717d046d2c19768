"""``privalign keys {create,list,top-up,revoke}``: admin CLI for API keys and budgets.

Admin actions exist only here (direct database access), never over HTTP. The database comes from
``--db URL`` (plus ``--db-schema`` for PostgreSQL) or from a service config's ``[database]``.

``create --user NAME`` gives a person several keys that share one budget: the first key of NAME creates
the user's budget (``--budget-epsilon``, ``--budget-delta``, ``--accounting``); a further key of NAME joins
it and may not state a budget (``top-up`` through any of the user's keys adds to it).
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

    c = sub.add_parser(
        "create",
        help="Create a key with a privacy budget (or a further key of a user, sharing the user's budget); "
        "prints the token once.",
        description="Create a key; prints the token once. Without --user the key has a budget of its own. "
        "With --user NAME every key of NAME spends from one budget: the first key of NAME creates it "
        "(--budget-epsilon required), a further key joins it (no --budget-epsilon/--budget-delta; "
        "--accounting, if given, must be the user's). A person holding several keys has one budget only "
        "if all of them are created with the same --user.",
    )
    c.add_argument(
        "--budget-epsilon",
        type=float,
        default=None,
        help="Budget ε (> 0); required for a key of its own or the first key of a user, refused for a "
        "further key of a user.",
    )
    c.add_argument(
        "--budget-delta",
        type=float,
        default=None,
        help="Budget δ in [0, 1) (default 0; zcdp: δ of the conversion, > 0); refused for a further key "
        "of a user.",
    )
    c.add_argument(
        "--accounting",
        choices=["pure", "zcdp", "ex-post"],
        default=None,
        help="Accounting of the budget (default pure; a further key of a user has the user's).",
    )
    c.add_argument("--name", default="", help="A label.")
    c.add_argument(
        "--user",
        default=None,
        metavar="NAME",
        help="The user whose budget the key shares (1-60 characters of letters, digits, '._@-'); the first "
        "key of a user creates the user's budget.",
    )
    common(c)
    c.set_defaults(func=_create)

    ls = sub.add_parser(
        "list",
        help="List keys with their user and their budget's limit, spent, reserved, remaining (for a key of "
        "a user: the user's shared budget).",
    )
    common(ls)
    ls.set_defaults(func=_list)

    t = sub.add_parser("top-up", help="Add budget to a key's budget (a key of a user: to the user's budget).")
    t.add_argument(
        "key_id", help="the key's id (privalign keys list); any active key of a user tops up the user"
    )
    t.add_argument("--epsilon", type=float, default=0.0, help="ε to add to the key's budget (default 0)")
    t.add_argument("--delta", type=float, default=0.0, help="δ to add to the key's budget (default 0)")
    common(t)
    t.set_defaults(func=_top_up)

    r = sub.add_parser(
        "revoke",
        help="Revoke a key (401 from then on; its ledger is kept; a user's other keys and budget stay).",
    )
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
    if url is not None:
        from privalign.service.config import check_database_url

        check_database_url(url, "db")  # another database failed as a missing driver module
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
    from privalign.service.keys import create_key, list_keys

    engine = _engine(args)
    key_id, token = create_key(
        engine,
        budget_epsilon=args.budget_epsilon,
        budget_delta=args.budget_delta,
        accounting=args.accounting,
        name=args.name,
        user=args.user,
    )
    row = next(r for r in list_keys(engine) if r["key_id"] == key_id)
    joined = args.user is not None and args.budget_epsilon is None
    out = {
        "key_id": key_id,
        "token": token,
        "user": args.user,
        "accounting": row["accounting"],
        "budget_epsilon": args.budget_epsilon,
        "budget_delta": None if joined else (args.budget_delta or 0.0),
        "joined_user_budget": joined,
        "remaining": row["remaining"],
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(token)
        what = (
            f"joined user {args.user}'s budget ({row['accounting']}, remaining {row['remaining']})"
            if joined
            else f"({row['accounting']}, ε={args.budget_epsilon}, δ={out['budget_delta']}"
            + (f", budget of user {args.user}" if args.user else "")
            + ")"
        )
        print(f"key {key_id} created {what}; the token is shown only once", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    from privalign.service.keys import list_keys

    rows = list_keys(_engine(args))
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(
                f"{r['key_id']}  {r['accounting']:7s}  revoked={r['revoked']!s:5s}  "
                f"user={r['user'] or '-'}  limit={r['limit']}  "
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
