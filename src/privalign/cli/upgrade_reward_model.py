"""``privalign upgrade-reward-model OLD --out NEW``: rewrite a reward-model file in the current format.

A file whose noise seed was ever written down is refused (exit 2, nothing written): the seed is in every
copy of the old file, so the rewrite could only hide it (issue 36); such a model is refitted."""

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
        "version 1, or 'privalign-linear-reward/1' from fit-imdb-reward) and write it in the "
        "current format (coefficients, estimator, public parameters, privacy event and feature map are "
        "kept; exact accuracies a release may not hold are removed and listed). A private (or "
        "privalign-estimator) file whose noise seed or data hash was ever written down is refused with "
        "exit status 2 and nothing written: a non-null random_state, seed_entropy or hash field, a "
        "fit-reward file from before the release boundary (it always recorded its seed), or the HH reward "
        "model shipped at commit a836a1f (seed 3241444873). Whoever holds any copy of such a file replays "
        "its fit, so removing the field cannot make its privacy event true: refit it with 'privalign "
        "fit-reward --data PAIRS --method METHOD --epsilon EPS --out NEW.json' (docs/privacy/release.md). "
        "What still upgrades: version-1 and current files that never held a seed, and "
        "'privalign-linear-reward/1' reference models that claim no privacy. The retired service weights "
        "format cannot be converted (its features "
        "differ from the trainer's): refit with 'privalign fit-reward'.",
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
