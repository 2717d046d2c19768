"""``privalign upgrade-reward-model OLD --out NEW``: rewrite a reward-model file in the current format."""

from __future__ import annotations

import argparse
import sys

from privalign.cli._args import emit_json

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "upgrade-reward-model",
        help="rewrite an older reward-model file in the current format (privalign.reward_model v2)",
        description="Read a reward-model file written by an older privalign ('privalign.reward_model' "
        "version 1 from fit-reward, or 'privalign-linear-reward/1' from fit-imdb-reward) and write it in the "
        "current format (coefficients, estimator, public parameters, privacy event and feature map are "
        "kept; the noise seed, data hashes and exact accuracies a release may not hold are removed and "
        "listed). The retired service weights format cannot be converted (its features differ from the "
        "trainer's): refit with 'privalign fit-reward'.",
    )
    p.add_argument("model", help="the old reward-model file")
    p.add_argument("--out", required=True, help="destination file (must differ from MODEL)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from privalign.models.scorers import LinearRewardScorer, upgrade_reward_model_report

    src, dst = Path(args.model), Path(args.out)
    if dst.exists() and src.exists() and dst.resolve() == src.resolve():
        raise ValueError(f"argument --out: must differ from the source file, got {args.out}")
    path, dropped = upgrade_reward_model_report(src, dst)
    sc = LinearRewardScorer.load(path)
    out = {
        "model": str(path),
        "name": sc.name,
        "estimator": sc.estimator,
        "dim": int(sc.coef.shape[0]),
        "privacy_event": sc.privacy_event,
        "removed": dropped,
    }
    if args.json:
        emit_json(out)
    else:
        print(
            f"wrote {path} ({sc.name}, d={out['dim']}, privacy event: "
            f"{(sc.privacy_event or {}).get('kind', 'none recorded')})",
            file=sys.stderr,
        )
        if dropped:
            print(
                f"removed what a release may not hold (docs/privacy/release.md): {', '.join(dropped)}",
                file=sys.stderr,
            )
    return 0
