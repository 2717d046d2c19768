"""``privalign simulate``: the §5.4 evaluation protocol on a scored pool → results.json + PNG figures."""

from __future__ import annotations

import json

__all__ = ["register"]


def _specs(args):
    from privalign.alignment.simulation import MethodSpec
    from privalign.cli.select import parse_floats
    from privalign.errors import PrivacyParameterError

    specs = []
    for m in [x.strip() for x in args.methods.split(",") if x.strip()]:
        if m == "bon":
            specs.append(MethodSpec("bon"))
        elif m == "itp":
            specs += [MethodSpec("itp", beta=b) for b in parse_floats(args.beta, "beta")]
        elif m == "privbon":
            if args.sigma_gumbel:
                specs += [MethodSpec("privbon", sigma=s) for s in parse_floats(args.sigma_gumbel, "sigma-gumbel")]
            else:
                specs += [MethodSpec("privbon", epsilon=e) for e in parse_floats(args.epsilon, "epsilon")]
        elif m == "privitp":
            for b in parse_floats(args.beta, "beta"):
                for sx in parse_floats(args.sigma_x, "sigma-x"):
                    for sz in parse_floats(args.sigma_z or args.sigma_x, "sigma-z"):
                        specs.append(MethodSpec("privitp", beta=b, sigma_x=sx, sigma_z=sz, L=args.L, delta=args.delta))
        else:
            raise PrivacyParameterError(f"The '--methods' option must list bon, itp, privbon, privitp. Got {m!r} instead.")
    return specs


def _run(args) -> int:
    from privalign.alignment.simulation import plot_results, run_protocol, write_results
    from privalign.cli.select import _clean, parse_floats
    from privalign.data.pools import ScoredPool

    if args.pool:
        pool = ScoredPool.read(args.pool)
    else:
        from privalign.alignment.synthetic import make_synthetic_pool

        p, c = (int(x) for x in args.synthetic.split(","))
        pool = make_synthetic_pool(p, c, random_state=args.seed)
    lo, hi = parse_floats(args.score_range, "score-range")[:2]
    res = run_protocol(pool, _specs(args), n_grid=[2**k for k in range(args.max_log2_n + 1)],
                       replicates=args.replicates, random_state=args.seed, transform=args.transform,
                       score_range=(lo, hi), skip_short=args.skip_short, progress=not args.no_progress)
    path = write_results(res, args.out)
    figs = plot_results(res, args.out)
    summary = {"results": str(path), "figures": [str(f) for f in figs], "n_prompts": res["n_prompts"],
               "skipped_prompts": res["skipped_prompts"], "seconds": res["seconds"],
               "methods": [{"name": m["name"], "true_lift_at_max_n": m["true_lift"][-1],
                            "privacy": m["privacy"]} for m in res["methods"]]}
    if args.json:
        print(json.dumps(_clean(summary)))
    else:
        for m in summary["methods"]:
            print(f"{m['name']:<40s} lift at N={2**args.max_log2_n}: {100 * m['true_lift_at_max_n']:+.2f}")
        print(f"wrote {path} and {len(figs)} figures")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="evaluation protocol (N = 2^0..2^k) on a scored pool",
                              description="Run BoN/ITP/PrivBoN/PrivITP with exact selection laws on a scored pool "
                                          "(spec §5.4) and write results.json plus PNG figures into --out.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--pool", help="scored-pool JSONL(.gz) file")
    src.add_argument("--synthetic", help="PROMPTS,CANDIDATES: use a synthetic pool instead")
    p.add_argument("--methods", default="bon,itp,privbon,privitp", help="comma-separated methods")
    p.add_argument("--beta", default="0.05", help="β values (comma-separated sweep) for itp/privitp")
    p.add_argument("--epsilon", default="4", help="PrivBoN ε values (sweep)")
    p.add_argument("--sigma-gumbel", default=None, help="PrivBoN Gumbel scales instead of ε (sweep)")
    p.add_argument("--sigma-x", default="0.1", help="PrivITP σ_X values (sweep)")
    p.add_argument("--sigma-z", default=None, help="PrivITP σ_Z values (default: = σ_X)")
    p.add_argument("--L", type=float, default=3.0, help="PrivITP envelope widening (units of σ_Z)")
    p.add_argument("--delta", type=float, default=1e-6, help="PrivITP δ")
    p.add_argument("--max-log2-n", type=int, default=6, help="largest N is 2^k (default 6)")
    p.add_argument("--replicates", type=int, default=50, help="replicates per (prompt, N) (default 50)")
    p.add_argument("--transform", choices=["none", "global_z"], default="none", help="reward normalisation")
    p.add_argument("--score-range", default="0,1", help="public clipping range LOW,HIGH (after the transform)")
    p.add_argument("--skip-short", action="store_true", help="skip prompts with too few candidates")
    p.add_argument("--seed", type=int, default=0, help="SeedSequence entropy (default 0)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=_run)
