"""``privalign select``: run one inference-time selector on a list of scores."""

from __future__ import annotations

import argparse
import sys

from privalign._validation import parse_floats
from privalign.cli._args import INFINITE_EPSILON, emit_json, epsilon_float
from privalign.cli._methods import add_param_option, selector_spec

__all__ = ["register", "add_selector_args", "build_selector"]


def add_selector_args(p: argparse.ArgumentParser) -> None:
    from privalign.alignment.selectors import methods

    p.add_argument("--method", required=True, choices=list(methods()), help="selector")
    p.add_argument(
        "--scores",
        required=True,
        help="comma-separated proxy rewards of pool A (the only pool for bon/privbon)",
    )
    p.add_argument(
        "--scores-b", default=None, help="comma-separated rewards of the fresh pool B (itp, privitp)"
    )
    p.add_argument(
        "--r-max", type=float, default=1.0, help="public upper end of the score range [0, R_max] (default 1)"
    )
    p.add_argument("--clip", action="store_true", help="clip scores into [0, R_max] instead of failing")
    p.add_argument("--sensitivity", type=float, default=None, help="public Δ_r (default R_max)")
    p.add_argument(
        "--epsilon",
        type=epsilon_float(
            if_infinite=f"{INFINITE_EPSILON}: for the non-private selection use --method bon (no --epsilon)",
        ),
        default=None,
        help="PrivBoN ε, finite, in [1e-9, 700] (the non-private selection is --method bon, not ε = inf)",
    )
    p.add_argument(
        "--sigma-reg",
        type=float,
        default=None,
        help="PrivBoN regularisation temperature (σ = max(2Δ/ε, σ_reg))",
    )
    p.add_argument("--beta", type=float, default=None, help="ITP/PrivITP β > 0")
    p.add_argument("--sigma-x", type=float, default=None, help="PrivITP phase-1 noise σ_X > 0")
    p.add_argument("--sigma-z", type=float, default=None, help="PrivITP phase-2 noise σ_Z > 0")
    p.add_argument(
        "--L", type=float, default=3.0, help="PrivITP envelope widening in units of σ_Z (default 3)"
    )
    p.add_argument("--delta", type=float, default=1e-6, help="PrivITP phase-1 δ (default 1e-6)")
    add_param_option(p)
    p.add_argument("--json", action="store_true", help="print JSON on stdout")


def build_selector(args):
    """The selector of ``--method`` with its options (parsed once, by
    :func:`privalign.cli._methods.selector_spec`); an option the method does not read is refused, a required
    one left out is named."""
    from privalign.alignment.selectors import make_selector, method_class, methods
    from privalign.errors import PrivacyParameterError

    kind = method_class(args.method)
    if kind.layout.pools > 1 and args.scores_b is None:
        raise PrivacyParameterError(
            "The '--scores-b' option (the selector's 'pool_b_scores') is required for --method "
            f"{args.method}: phase 2 runs on a fresh pool of candidates independent of --scores (see "
            "docs/privacy/privitp.md)."
        )
    # (--scores-b is read only by the two-pool methods but allowed with every method, so that one command
    # line can compare all of them on the same pools; --L and --delta have defaults, read by PrivITP only)
    given_defaults = {"L": 3.0, "delta": 1e-6}
    for name, default in given_defaults.items():
        if getattr(args, name) == default and name not in {p.name for p in kind.params}:
            setattr(args, name, None)  # the default, not the user's: not refused
    if args.sensitivity is not None and not kind.private:
        raise PrivacyParameterError(
            f"argument --sensitivity: not used by --method {args.method} ({args.method} adds no noise: its "
            "selection is not private); drop --sensitivity or choose a private method"
            f" ({', '.join(m for m in methods() if method_class(m).private)})"
        )
    spec = selector_spec(args, args.method)
    return make_selector(spec, r_max=args.r_max, sensitivity=args.sensitivity, clip=args.clip)


def _run(args) -> int:
    from privalign.rng import NoiseSource, SecureNoise, SeededNoise

    sel = build_selector(args)
    a = parse_floats(args.scores, "scores")
    b = None if args.scores_b is None else parse_floats(args.scores_b, "scores_b")
    src: NoiseSource = SecureNoise() if args.secure else SeededNoise(args.seed)
    out = sel.select(a, rng=src, pool_b_scores=b)
    # stdout (with or without --json) is the private answer: the selection, its realized and worst-case
    # events and the released diagnostics; nothing else computed from the scores (docs/privacy/release.md).
    d = {"method": args.method, "secure": bool(args.secure), **out.to_dict()}
    if out.is_fallback:
        d["fallback_reason"] = (
            "no candidate of pool B passed the rejection test (accept candidate i when its noisy score "
            "exceeds the noisy normaliser plus W·U). The fallback serves one fresh sample from the base "
            "policy. More candidates make it rarer; 'privalign law' with the same options prints the exact "
            "fallback probability."
        )
    if args.json:
        emit_json(d)
    else:
        what = "fallback (serve one fresh sample)" if out.is_fallback else f"candidate {out.index}"
        print(f"{args.method}: {what}")
        if out.is_fallback:
            print(f"  why: {d['fallback_reason']}")
        print(f"  realized: {out.event.to_dict()}")
        print(f"  worst case: {out.worst_case_event.to_dict()}")
        if out.diagnostics:
            print(f"  diagnostics: {out.diagnostics}")
    if out.is_fallback:
        # The exact fallback probability is a function of the scores, not of the DP output: a note on stderr
        # for whoever holds the scores, never part of the answer.
        try:
            p_fb = float(sel.law(a, pool_b_scores=b).fallback)
        except Exception:  # noqa: BLE001 - the law is an explanation only; never fail the selection over it
            p_fb = float("nan")
        print(
            f"privalign select: note: for these scores the fallback has probability {p_fb:.3g} (computed "
            "from the exact scores: not part of the private answer on stdout)",
            file=sys.stderr,
        )
    if not args.secure and args.seed is None:
        print(
            "privalign select: note: unseeded, non-secure noise (use --secure to serve real users)",
            file=sys.stderr,
        )
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "select",
        help="select one candidate with BoN, ITP, PrivBoN or PrivITP",
        description="Run one inference-time selector on given scores and print the chosen "
        "index (or the fallback), the realized privacy cost and the worst case.",
    )
    add_selector_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed a reproducible (non-secure) noise source, a non-negative integer (default: none, i.e. "
        "fresh entropy; a note says so)",
    )
    g.add_argument(
        "--secure", action="store_true", help="OS-entropy noise with OpenDP samplers (refuses seeds)"
    )
    p.set_defaults(func=_run)
