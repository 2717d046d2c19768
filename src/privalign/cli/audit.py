"""``privalign audit``: audit a built-in mechanism on its analytic worst-case neighbouring pair.

Prints JSON with ``--json`` (the convention of every subcommand; text otherwise) holding the claimed ε (and
δ), the empirical lower bound ε̂, α, the samples per side and the verdict. ε̂ > claimed ε refutes the claim
with false-positive probability ≤ α; passing never proves privacy.

Exit codes: 0 when the audit finds no violation; 1 on a violation (the claim is refuted; one line on stderr
says so, also for a ``--broken`` negative control, where it is the expected finding), or 0 with
``--no-fail-on-violation``; 2 for invalid parameters.
"""

from __future__ import annotations

import argparse

from privalign.cli._args import INFINITE_EPSILON, emit_json, epsilon_float, finite_float

__all__ = ["register"]

_MECHANISMS = ("noisy_argmax", "gaussian", "laplace", "randomized_response", "peeling", "noisy_top_k")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit",
        help="Audit a built-in mechanism on worst-case neighbours (empirical ε lower bound).",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--mechanism", required=True, choices=_MECHANISMS, help="Which built-in mechanism to audit."
    )
    p.add_argument(
        "--epsilon",
        required=True,
        type=epsilon_float(
            if_infinite=f"{INFINITE_EPSILON}: every mechanism satisfies it, so there is no claim to audit",
        ),
        help="The mechanism's ε, finite, in [1e-9, 700] (per selection for noisy_top_k: the claim is then "
        "k·ε).",
    )
    p.add_argument(
        "--delta",
        type=finite_float("a finite δ in [0, 1)"),
        default=None,
        help="δ (required for gaussian and peeling).",
    )
    p.add_argument("--sensitivity", type=float, default=1.0, help="Δ (λ for peeling); default 1.")
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="Draws per side (default: per mechanism, see docs/audit.md).",
    )
    p.add_argument(
        "--alpha", type=float, default=1e-3, help="False-positive rate of the audit (default 1e-3)."
    )
    p.add_argument(
        "--seed", type=int, default=None, help="Seed of the audit's own randomness (default: fresh entropy)."
    )
    p.add_argument(
        "--broken",
        default=None,
        help="Audit a deliberately broken negative control instead (e.g. half_scale, sensitivity_ignored, "
        "wrong_flip, sqrt_scale).",
    )
    p.add_argument("--candidates", type=int, default=8, help="d for noisy_argmax (default 8).")
    p.add_argument("--k", type=int, default=2, help="k for noisy_top_k (default 2).")
    p.add_argument("--sparsity", type=int, default=1, help="s for peeling (default 1).")
    p.add_argument("--dimension", type=int, default=None, help="d for peeling (default s + 2).")
    p.add_argument(
        "--json", action="store_true", help="Print JSON on stdout (as every subcommand: only with --json)."
    )
    p.add_argument(
        "--fail-on-violation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Exit with code 1 when the audit finds a violation (default); --no-fail-on-violation exits 0.",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from privalign.audit.worst_case import audit_builtin

    extra: dict = {}
    if args.mechanism == "noisy_argmax":
        extra["candidates"] = args.candidates
    elif args.mechanism == "noisy_top_k":
        extra["k"] = args.k
    elif args.mechanism == "peeling":
        extra.update(sparsity=args.sparsity, dimension=args.dimension)
    report = audit_builtin(
        args.mechanism,
        epsilon=args.epsilon,
        delta=args.delta,
        samples=args.samples,
        alpha=args.alpha,
        seed=args.seed,
        broken=args.broken,
        sensitivity=args.sensitivity,
        **extra,
    )
    if args.json:
        emit_json(report, indent=2)
    else:
        print(
            f"{report['mechanism']}{' [BROKEN: ' + args.broken + ']' if args.broken else ''} on "
            f"{report['pair']}: claimed ε = {report['claimed_epsilon']:.6g}, lower bound ε̂ = "
            f"{report['epsilon_lower_bound']:.6g} (α = {report['alpha']:g}, {report['samples'][0]} samples "
            f"per side): {report['verdict']}"
        )
    if report["verdict"] != "violation":
        return 0
    import sys

    expected = " (expected: --broken audits a deliberately broken variant)" if args.broken else ""
    print(
        "privalign audit: violation: the empirical lower bound "
        f"ε̂ = {report['epsilon_lower_bound']:.6g} exceeds the claimed ε = {report['claimed_epsilon']:.6g} "
        f"(false-positive probability ≤ α = {report['alpha']:g}){expected}",
        file=sys.stderr,
    )
    return 1 if args.fail_on_violation else 0
