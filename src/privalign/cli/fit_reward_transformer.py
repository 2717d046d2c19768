"""``privalign fit-reward --model minilm``: the transformer reward model
(``privalign.estimation.transformer``).

Same data, split rule, release and audit record as the linear path of ``fit-reward``; options the transformer
path does not read are refused, and every bad value is refused before anything is loaded, trained or written.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from privalign.cli._args import emit_json

__all__ = ["run_transformer"]


def _refuse(flag: str, why: str, value: Any) -> Exception:
    from privalign.errors import PrivacyParameterError

    return PrivacyParameterError(f"argument {flag}: {why} (got {value!r})")


def _refuse_unused(args: argparse.Namespace, privacy: str | None) -> None:
    if privacy is None:
        raise _refuse(
            "--method",
            f"--model {args.model} trains with --method dp-sgd (sample-DP), rr (label-DP) or mle "
            "(not private)",
            args.method,
        )
    given = set(getattr(args, "options_given", ()))
    if "sparsity" in given:
        raise _refuse(
            "--sparsity", f"not used by --model {args.model} (it is not sparse); drop it", args.sparsity
        )
    if args.n_iter is not None:
        raise _refuse("--n-iter", f"not used by --model {args.model}; use --epochs", args.n_iter)
    if args.tune:
        raise _refuse(
            "--tune",
            f"not available with --model {args.model} (it is for the linear models); drop --tune",
            True,
        )
    if args.n_features != 2**12:
        raise _refuse(
            "--n-features", f"not used by --model {args.model} (no hashed n-grams)", args.n_features
        )
    if args.features != "ngram":
        raise _refuse(
            "--features", f"not used by --model {args.model} (the backbone is the feature map)", args.features
        )
    if privacy == "none" and "epsilon" in given:
        raise _refuse(
            "--epsilon", "not used by --method mle (it is not private: it adds no noise)", args.epsilon
        )
    if privacy != "sample" and "delta" in given:
        raise _refuse(
            "--delta", f"not used by --method {args.method} (its guarantee is pure ε, with no δ)", args.delta
        )


def _validate(args: argparse.Namespace, privacy: str, check_writable: Any) -> None:
    """Every option's range, before any data is loaded."""
    from pathlib import Path

    from privalign._validation import check_int, check_probability, check_real
    from privalign.estimation.fit import check_user_level

    check_user_level(args.privacy_unit, args.method, args.max_pairs_per_user, False)

    if privacy != "none":
        check_real(args.epsilon, "epsilon", low=0.0, closed="neither")
    if privacy == "sample":
        check_probability(args.delta, "delta")
    check_probability(args.test_size, "test_size")
    if args.n_pairs is not None:
        check_int(args.n_pairs, "n_pairs", low=1)
    if args.batch_size is not None and args.batch_size < 1:
        raise _refuse("--batch-size", "must be an integer >= 1", args.batch_size)
    if args.epochs is not None:
        check_real(args.epochs, "epochs", low=0.0, closed="neither")
    n_layers = {"minilm": 6, "tiny-random": 2}[args.model]
    if args.top_layers is not None and not 1 <= args.top_layers <= n_layers:
        raise _refuse("--top-layers", f"must be in [1, {n_layers}] for --model {args.model}", args.top_layers)
    if args.step_size is not None:
        check_real(args.step_size, "step_size", low=0.0, closed="neither")
    for flag, path in (("--out", args.out), ("--audit-record", args.audit_record)):
        if path is not None:
            if Path(path).is_dir():
                raise _refuse(flag, "must name a file to write, not a directory", path)
            check_writable(flag, path)
    if args.out and args.audit_record and Path(args.out).resolve() == Path(args.audit_record).resolve():
        raise _refuse(
            "--audit-record", "must differ from --out (the audit record is operator-private)", args.out
        )


def run_transformer(args: argparse.Namespace, *, check_writable: Any, save: Any) -> int:
    """``fit-reward`` with a transformer ``--model``; ``check_writable(flag, path)`` and ``save(fit, args)``
    (writes --out and --audit-record, returns the result to print) are ``fit-reward``'s (passed in, so that
    this module does not import that one)."""
    from privalign.estimation.fit import fit_transformer_reward_model, transformer_privacy
    from privalign.release import audit_record_path

    privacy = transformer_privacy(args.method)
    _refuse_unused(args, privacy)
    assert privacy is not None
    _validate(args, privacy, check_writable)
    fit = fit_transformer_reward_model(
        args.data,
        backbone=args.model,
        method=args.method,
        n_pairs=args.n_pairs,
        epsilon=args.epsilon,
        delta=args.delta,
        batch_size=args.batch_size,
        epochs=args.epochs,
        top_layers=args.top_layers,
        step_size=args.step_size,
        test_size=args.test_size,
        seed=args.seed,
        split_seed=args.split_seed,
        progress=lambda line: print(line, file=sys.stderr),
        privacy_unit=args.privacy_unit,
        max_pairs_per_user=args.max_pairs_per_user,
        user_field=args.user_field,
    )
    result = save(fit, args)
    if args.json:
        emit_json(result, indent=2)
        return 0
    what = f"{privacy}-level privacy" if privacy != "none" else "not private"
    counted = "pairs"
    if result["privacy_unit"] == "user":
        k = result["max_pairs_per_user"]
        if privacy == "label":
            what = f"user-level privacy: ε = {args.epsilon:g} per user, ≤ {k} pairs each, ε/{k} per label"
        else:
            what = (
                f"user-level privacy: (ε, δ) = ({args.epsilon:g}, {args.delta:g}) per user, ≤ {k} pairs each"
            )
            counted = "users' pairs"
    print(
        f"DPTransformerRM {args.model} ({what}): held-out accuracy {fit.heldout_accuracy:.4f} on "
        f"{result['n_test']} {counted} (exact, on private pairs: shown to you, not written into the "
        "release); "
        f"event {result['privacy_event']['kind']}"
        + (f"; saved to {result['model']}" if args.out else "")
        + (f"; operator-private audit record {result['audit_record']}" if args.audit_record else "")
    )
    if args.out and not args.audit_record and privacy != "none":  # a non-private fit draws no noise
        print(
            f"(no audit record: the noise seed is not kept anywhere; add --audit-record "
            f"{audit_record_path(args.out)} to keep it privately)",
            file=sys.stderr,
        )
    return 0
