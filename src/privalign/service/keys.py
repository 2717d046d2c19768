"""API keys: create, list, top up, revoke, authenticate (admin operations; never exposed over HTTP).

A key is ``pa_<key_id>_<secret>``: ``key_id`` (public, 16 hex digits) names the row; ``secret`` is 32 bytes
from ``secrets.token_urlsafe``. Only ``salt`` and ``HMAC-SHA256(salt, secret)`` are stored. The secret has 256
bits of entropy, so a fast keyed hash is the right tool (a slow password hash protects low-entropy secrets and
would cost milliseconds per request); comparison is constant-time (``hmac.compare_digest``).

**Budget principal.** A key created without a user has a budget of its own (its principal is its key
id). A key created with ``user=NAME`` spends from the user's budget (principal ``"u:NAME"``,
:func:`privalign.service.db.key_principal`), shared by every key of that user: the first key of a user
creates the budget (its ε, δ and accounting), a further key joins it (it may not state a budget, and
an accounting it states must be the user's), a top-up through any of the user's keys adds to it,
revoking a key leaves the user's other keys and the budget as they are. A key's user never changes. The
guarantee is per principal: a person holding several keys has one budget only if the operator assigns
all of them to one user.

Budgets are stored in the key's accounting unit:

* ``pure``: limit ``(ε, δ)``; PrivBoN costs ``(ε, 0)``.
* ``zcdp``: limit ``(ρ, δ)`` where ``ρ`` is the largest zCDP budget that converts to ``(ε, δ)``-DP with the
  project's documented conversion (``privalign.accounting.filters.ZCDPFilter.from_epsilon_delta``);
  PrivBoN costs ``(ε²/8, 0)``.
* ``ex-post``: limit ``(ε, δ)``; PrivBoN costs ``(ε, 0)``, PrivITP reserves ``(ε_max, δ)`` and settles the
  realized ex-post cost.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, literal, select, update
from sqlalchemy.engine import Engine

from privalign._validation import check_choice, check_real
from privalign.errors import PrivacyParameterError
from privalign.service import db
from privalign.service.store import SQLBudgetStore

__all__ = [
    "ACCOUNTING_MODES",
    "KeyInfo",
    "KeyCache",
    "create_key",
    "list_keys",
    "top_up",
    "revoke_key",
    "authenticate",
    "budget_units",
    "check_user_name",
]

ACCOUNTING_MODES = ("pure", "zcdp", "ex-post")

_SQL_AUTH = (
    "SELECT k.key_id, k.name, k.salt, k.secret_hash, k.accounting, k.created_at, k.revoked_at, "
    "k.user_name, p.limit_epsilon, p.limit_delta "
    "FROM api_keys k LEFT JOIN principals p "
    f"ON p.principal = COALESCE('{db.USER_PREFIX}' || k.user_name, k.key_id) WHERE k.key_id = :k"
)

#: A user name: 1 to 60 characters of letters, digits and ``. _ @ -``.
_USER_RE = re.compile(r"[A-Za-z0-9._@-]{1,60}")


@dataclass(frozen=True)
class KeyInfo:
    """Public information about a key (no secret, no hash)."""

    key_id: str
    name: str
    accounting: str
    created_at: float
    revoked_at: float | None
    limit: tuple[float, float] = (0.0, 0.0)  # granted budget in store units, read with the key
    user: str | None = None  # the user whose budget the key shares; None: the key's own budget

    @property
    def principal(self) -> str:
        """Who pays: the key id, or the user's shared budget (``"u:" + user``)."""
        return db.key_principal(self.key_id, self.user)


def _hash(salt: str, secret: str) -> str:
    return hmac.new(bytes.fromhex(salt), secret.encode(), hashlib.sha256).hexdigest()


#: Largest budget ε of one grant (the ledger holds integers of 10⁻⁹ ε in 64 bits).
MAX_BUDGET_EPSILON = 1e9


def budget_units(accounting: str, epsilon: float, delta: float) -> tuple[float, float]:
    """Convert an operator's ``(ε, δ)`` budget into the store's units for ``accounting``.

    Raises:
      PrivacyParameterError: invalid ε, δ or accounting mode; ``zcdp`` needs ``0 < δ < 1``.
    """
    check_choice(accounting, "accounting", ACCOUNTING_MODES)
    eps = check_real(epsilon, "budget_epsilon", low=0.0, high=MAX_BUDGET_EPSILON, closed="right")
    dlt = check_real(delta, "budget_delta", low=0.0, high=1.0, closed="left")
    if accounting == "zcdp":
        if dlt <= 0.0:
            raise PrivacyParameterError(
                "The 'budget_delta' parameter must be in (0, 1) for zcdp accounting "
                f"(ρ-zCDP converts to (ε, δ) only for δ > 0). Got {dlt!r} instead."
            )
        from privalign.accounting.filters import ZCDPFilter

        return float(ZCDPFilter.from_epsilon_delta(eps, dlt).budget[0]), dlt
    return eps, dlt


def check_user_name(user: Any) -> str:
    """A valid user name (1 to 60 characters of letters, digits and ``. _ @ -``).

    Raises:
      PrivacyParameterError: anything else (one line naming ``user``).
    """
    if not isinstance(user, str) or _USER_RE.fullmatch(user) is None:
        raise PrivacyParameterError(
            "The 'user' parameter must be 1 to 60 characters of letters, digits and '._@-'. "
            f"Got {user!r} instead."
        )
    return user


def create_key(
    engine: Engine,
    *,
    budget_epsilon: float | None = None,
    budget_delta: float | None = None,
    accounting: str | None = None,
    name: str = "",
    user: str | None = None,
) -> tuple[str, str]:
    """Create a key. Returns ``(key_id, token)``; the token is shown once, never stored.

    Without ``user`` (or for the first key of ``user``) a budget is created: ``budget_epsilon`` is
    required, ``budget_delta`` defaults to 0 and ``accounting`` to ``"pure"``. A further key of an
    existing ``user`` joins the user's budget: it may not state ``budget_epsilon`` or ``budget_delta``
    (top the user up instead, :func:`top_up`), and ``accounting``, if given, must be the user's. The
    decision and the writes are one transaction under the user's budget row lock, so two keys created
    concurrently for a new user create one budget.

    Raises:
      PrivacyParameterError: invalid budget, accounting mode or user name, or budget flags that
        contradict the user's budget (nothing is written).
    """
    if user is not None:
        check_user_name(user)
    if accounting is not None:
        check_choice(accounting, "accounting", ACCOUNTING_MODES)
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    principal = db.key_principal(key_id, user)
    store = SQLBudgetStore(engine)
    with engine.begin() as conn:
        joined = None if user is None else _lock_user(store, conn, user)
        if joined is not None:
            for param, given in (("budget_epsilon", budget_epsilon), ("budget_delta", budget_delta)):
                if given is not None:
                    raise PrivacyParameterError(
                        f"The '{param}' parameter must be absent for a further key of user {user!r}: the "
                        "key shares the user's budget (add to it with a top-up). "
                        f"Got {given!r} instead."
                    )
            if accounting is not None and accounting != joined:
                raise PrivacyParameterError(
                    f"The 'accounting' parameter must be {joined!r}, the accounting of user {user!r}'s "
                    f"shared budget. Got {accounting!r} instead."
                )
            mode = joined
        else:
            if budget_epsilon is None:
                raise PrivacyParameterError(
                    "The 'budget_epsilon' parameter is required for a key with a budget of its own or the "
                    "first key of a user. Got none."
                )
            mode = accounting or "pure"
            dlt = 0.0 if budget_delta is None else budget_delta
            units = budget_units(mode, budget_epsilon, dlt)
        conn.execute(
            db.api_keys.insert().values(
                key_id=key_id,
                name=str(name)[:200],
                salt=salt,
                secret_hash=_hash(salt, secret),
                accounting=mode,
                created_at=db.now(),
                revoked_at=None,
                user_name=user,
            )
        )
        if joined is None:
            store.grant(
                principal,
                units[0],
                units[1],
                note=f"create {mode} eps={budget_epsilon} delta={dlt}",
                conn=conn,
            )
    return key_id, f"pa_{key_id}_{secret}"


def _lock_user(store: SQLBudgetStore, conn: Any, user: str) -> str | None:
    """Lock ``user``'s budget row (created if missing: PostgreSQL ``SELECT … FOR UPDATE``; SQLite holds the
    database write lock already) and return the accounting of the user's budget, or ``None`` if the user
    has no key yet (the caller creates the budget)."""
    principal = db.key_principal("", user)
    store.lock_principal_row(conn, principal)
    row = conn.execute(
        select(db.api_keys.c.accounting)
        .where(db.api_keys.c.user_name == user)
        .order_by(db.api_keys.c.created_at)
        .limit(1)
    ).first()
    return None if row is None else str(row[0])


def _principal_of_row() -> Any:
    """SQL: the principal of an ``api_keys`` row (as :func:`privalign.service.db.key_principal`)."""
    return func.coalesce(literal(db.USER_PREFIX) + db.api_keys.c.user_name, db.api_keys.c.key_id)


def list_keys(engine: Engine) -> list[dict[str, Any]]:
    """Every key with its user, accounting mode, and its budget's limit, spent, reserved and remaining
    (store units): for a key of a user, the user's shared budget (the same numbers on each of its keys)."""
    out = []
    with engine.connect() as conn:
        rows = (
            conn.execute(
                select(db.api_keys, db.principals)
                .join(db.principals, db.principals.c.principal == _principal_of_row())
                .order_by(db.api_keys.c.created_at)
            )
            .mappings()
            .all()
        )
        conn.rollback()
    for raw in rows:
        r: dict[str, Any] = dict(raw)
        left = {
            "remaining_epsilon": max(0, r["limit_epsilon"] - r["spent_epsilon"] - r["reserved_epsilon"]),
            "remaining_delta": max(0, r["limit_delta"] - r["spent_delta"] - r["reserved_delta"]),
        }
        r = {
            **r,
            **db.units_to_floats(
                {
                    **left,
                    **{
                        k: r[k]
                        for k in (
                            "limit_epsilon",
                            "limit_delta",
                            "spent_epsilon",
                            "spent_delta",
                            "reserved_epsilon",
                            "reserved_delta",
                        )
                    },
                }
            ),
        }
        out.append(
            {
                "key_id": r["key_id"],
                "name": r["name"],
                "user": r["user_name"],
                "accounting": r["accounting"],
                "created_at": r["created_at"],
                "revoked": r["revoked_at"] is not None,
                "limit": [r["limit_epsilon"], r["limit_delta"]],
                "spent": [r["spent_epsilon"], r["spent_delta"]],
                "reserved": [r["reserved_epsilon"], r["reserved_delta"]],
                "remaining": [r["remaining_epsilon"], r["remaining_delta"]],  # exact: computed in units
            }
        )
    return out


def _key_row(conn: Any, key_id: str) -> Any:
    row = conn.execute(select(db.api_keys).where(db.api_keys.c.key_id == key_id)).mappings().first()
    if row is None:
        raise PrivacyParameterError(
            f"The 'key_id' parameter must name an existing key. Got {key_id!r} instead."
        )
    return row


def top_up(engine: Engine, key_id: str, *, epsilon: float, delta: float = 0.0) -> None:
    """Add budget to a key's budget (an appended grant row): for a key of a user, to the user's budget
    shared by all of the user's keys.

    For ``pure`` and ``ex-post`` keys the grant is ``(ε, δ)``. For ``zcdp`` keys ``epsilon`` is converted
    at the key's creation δ into ρ, and that ρ is added (ρ budgets add; the resulting (ε, δ) statement is
    then computed from the total ρ). ``delta`` must be 0 for zcdp keys.

    Raises:
      PrivacyParameterError: unknown or revoked key, or invalid amounts (nothing is written).
    """
    eps = check_real(epsilon, "epsilon", low=0.0, high=MAX_BUDGET_EPSILON, closed="both")
    dlt = check_real(delta, "delta", low=0.0, high=1.0, closed="left")
    if eps == 0.0 and dlt == 0.0:
        raise PrivacyParameterError(
            "The top-up must add a positive 'epsilon' or 'delta'. Got epsilon=0, delta=0 instead."
        )
    store = SQLBudgetStore(engine)
    with engine.begin() as conn:
        row = _key_row(conn, key_id)
        if row["revoked_at"] is not None:
            raise PrivacyParameterError(
                f"The 'key_id' parameter must name an active key. Key {key_id!r} is revoked."
            )
        principal = db.key_principal(row["key_id"], row["user_name"])
        if row["accounting"] == "zcdp":
            if dlt != 0.0:
                raise PrivacyParameterError(
                    "The 'delta' parameter must be 0 for a zcdp key (δ is fixed at creation). "
                    f"Got {dlt!r} instead."
                )
            first = conn.execute(
                select(db.budget_grants.c.delta)
                .where(db.budget_grants.c.principal == principal)
                .order_by(db.budget_grants.c.id)
                .limit(1)
            ).first()
            assert first is not None  # a zcdp key has the grant made at its creation
            d0 = db.from_units(first[0], db.DELTA_SCALE)
            a, b = budget_units("zcdp", eps, d0) if eps > 0 else (0.0, 0.0)
            store.grant(
                principal, a, 0.0, note=f"top-up zcdp eps={eps} at delta={d0} via {key_id}", conn=conn
            )
        else:
            store.grant(principal, eps, dlt, note=f"top-up eps={eps} delta={dlt} via {key_id}", conn=conn)


def revoke_key(engine: Engine, key_id: str) -> None:
    """Revoke a key: it gets 401 from then on. Its ledger is kept; a user's other keys and the user's
    budget are unchanged.

    Raises:
      PrivacyParameterError: unknown key.
    """
    with engine.begin() as conn:
        row = _key_row(conn, key_id)
        if row["revoked_at"] is None:
            conn.execute(
                update(db.api_keys).where(db.api_keys.c.key_id == key_id).values(revoked_at=db.now())
            )


def _split(token: str | None) -> tuple[str, str] | None:
    if not token or not token.startswith("pa_") or len(token) > 200:
        return None
    parts = token.split("_", 2)
    if len(parts) != 3:
        return None
    return parts[1], parts[2]


class KeyCache:
    """The immutable facts of keys this process has authenticated: salt, secret hash, accounting mode.

    A key's salt, hash, accounting mode and user never change (``revoke_key`` sets ``revoked_at``; top-ups add
    grants), so a bearer token can be checked against a remembered hash without a database read.
    :meth:`verify` answers only "this token holds the key's secret"; it says nothing about revocation or
    the current budget. The service therefore uses it only where the same database statement that
    reserves also checks that the key is active (``SQLBudgetStore.try_reserve`` with
    :meth:`SQLBudgetStore.reserve` with ``require_active=True``), and falls back to
    :func:`authenticate` whenever that statement writes nothing. Only keys that passed :func:`authenticate`
    are remembered (at most ``max_keys``; the first remembered is forgotten first); a key found revoked or
    missing is forgotten.
    """

    def __init__(self, max_keys: int = 10_000) -> None:
        self.max_keys = int(max_keys)
        self._keys: dict[str, tuple[str, str, KeyInfo]] = {}

    def remember(self, salt: str, secret_hash: str, info: KeyInfo) -> None:
        """Remember (or refresh: e.g. a newer ``limit``) a key that :func:`authenticate` accepted."""
        if info.key_id not in self._keys and len(self._keys) >= self.max_keys:
            for oldest in list(self._keys)[:1]:  # the first remembered goes first
                self._keys.pop(oldest)
        self._keys[info.key_id] = (salt, secret_hash, info)

    def forget(self, key_id: str) -> None:
        self._keys.pop(key_id, None)

    def verify(self, token: str | None) -> KeyInfo | None:
        """The remembered :class:`KeyInfo` (its ``limit`` as last read) if ``token``'s secret matches the
        remembered hash (constant-time comparison), else ``None``. No database access."""
        parts = _split(token)
        if parts is None:
            return None
        hit = self._keys.get(parts[0])
        if hit is None:
            return None
        salt, secret_hash, info = hit
        return info if hmac.compare_digest(_hash(salt, parts[1]), secret_hash) else None


def authenticate(
    store: SQLBudgetStore, token: str | None, *, cache: KeyCache | None = None
) -> KeyInfo | None:
    """Return the key for a bearer ``token`` if it exists, is not revoked and its secret matches.

    Args:
      store: the service's store (its raw-connection read path is used: one round trip on PostgreSQL).
      token: ``pa_<key_id>_<secret>``.
      cache: if given, a successful check is remembered in it; a revoked or unknown key id is forgotten.
    """
    parts = _split(token)
    if parts is None:
        return None
    key_id, secret = parts
    row = store.query_one(_SQL_AUTH, {"k": key_id})
    if row is None:
        # Spend comparable time on unknown ids (no cheap oracle for which ids exist).
        hmac.compare_digest(_hash("00" * 16, secret), "0" * 64)
        if cache is not None:
            cache.forget(key_id)
        return None
    if not hmac.compare_digest(_hash(row["salt"], secret), row["secret_hash"]):
        return None  # a wrong secret says nothing about the key: its remembered facts stay
    if row["revoked_at"] is not None:
        if cache is not None:
            cache.forget(key_id)
        return None
    info = KeyInfo(
        row["key_id"],
        row["name"],
        row["accounting"],
        row["created_at"],
        row["revoked_at"],
        (
            db.from_units(row["limit_epsilon"], db.EPS_SCALE),
            db.from_units(row["limit_delta"], db.DELTA_SCALE),
        ),
        row["user_name"],
    )
    if cache is not None:
        cache.remember(row["salt"], row["secret_hash"], info)
    return info
