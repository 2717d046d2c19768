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
        raise _refuse("--tune", f"not available with --model {args.model}; drop --tune", True)
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


def _load_pairs(args: argparse.Namespace, rng: Any) -> Any:
    from privalign.data.preferences_io import load_hh_rlhf_pairs, load_imdb_pairs, load_jsonl_pairs

    if args.data == "hh-rlhf":
        pairs = load_hh_rlhf_pairs(limit=args.n_pairs)
    elif args.data == "imdb":
        pairs = load_imdb_pairs(args.n_pairs, random_state=rng)
    else:
        pairs = load_jsonl_pairs(args.data)
        if args.n_pairs is not None:
            n = args.n_pairs
            pairs.prompts, pairs.chosen, pairs.rejected, pairs.prompt_ids = (
                pairs.prompts[:n],
                pairs.chosen[:n],
                pairs.rejected[:n],
                pairs.prompt_ids[:n],
            )
    for i, (c, r) in enumerate(zip(pairs.chosen, pairs.rejected)):
        if c == r:
            raise _refuse(
                "--data",
                f"pair {i + 1} has identical chosen and rejected texts: a comparison must compare two "
                "different responses",
                args.data,
            )
    return pairs


#: --method → the transformer model's privacy mode
TRANSFORMER_PRIVACY = {"dp-sgd": "sample", "rr": "label", "mle": "none"}


def run_transformer(args: argparse.Namespace, *, check_writable: Any, data_sha256: Any) -> int:
    """``fit-reward`` with a transformer ``--model``; ``check_writable(flag, path)`` and ``data_sha256(data)``
    are ``fit-reward``'s (passed in, so that this module does not import that one)."""
    import numpy as np

    from privalign.estimation.persistence import save_model
    from privalign.estimation.preferences import PreferenceData, train_test_split
    from privalign.estimation.transformer import DPTransformerRM
    from privalign.release import audit_record_path, public_metadata, write_audit_record

    privacy = TRANSFORMER_PRIVACY.get(args.method)
    _refuse_unused(args, privacy)
    assert privacy is not None
    _validate(args, privacy, check_writable)
    unit = privacy
    noise = np.random.SeedSequence(args.seed)  # never written into the release
    (est_seed,) = noise.spawn(1)
    data_seed, split_seed = np.random.SeedSequence(args.split_seed).spawn(2)
    data_rng = np.random.default_rng(data_seed)
    pairs = _load_pairs(args, data_rng)
    n = len(pairs.chosen)
    # orientation by a fair, data-independent coin, as PreferenceData.from_text_pairs
    y = (data_rng.random(n) < 0.5).astype(np.float64)
    triples = [
        (k, r, c) if yi else (k, c, r) for k, c, r, yi in zip(pairs.prompts, pairs.chosen, pairs.rejected, y)
    ]
    data = PreferenceData(
        X=np.arange(n, dtype=np.float64)[:, None], y=y, prompt_ids=np.asarray(pairs.prompt_ids, dtype=object)
    )
    train, test = train_test_split(
        data, unit=unit, test_size=args.test_size, random_state=np.random.default_rng(split_seed)
    )
    tr_idx = train.X[:, 0].astype(np.int64)
    te_idx = test.X[:, 0].astype(np.int64)
    batch_size = 64 if args.batch_size is None else args.batch_size
    if batch_size > tr_idx.size:
        raise _refuse(
            "--batch-size",
            f"must be at most the {tr_idx.size} training pairs (a larger batch leaves no full step)",
            batch_size,
        )
    kw: dict[str, Any] = {
        "privacy": privacy,
        "backbone": args.model,
        "batch_size": batch_size,
        "random_state": np.random.default_rng(est_seed),
    }
    if privacy != "none":
        kw["epsilon"] = args.epsilon
    if privacy == "sample":
        kw["delta"] = args.delta
    for dest, param in (("epochs", "epochs"), ("top_layers", "top_layers"), ("step_size", "learning_rate")):
        if getattr(args, dest) is not None:
            kw[param] = getattr(args, dest)
    est = DPTransformerRM(**kw)
    print(
        f"fitting DPTransformerRM ({args.model}, privacy {privacy}) on {tr_idx.size} pairs", file=sys.stderr
    )
    est.fit([triples[i] for i in tr_idx], train.y)
    fm = est.feature_map()
    acc = est.score_texts([triples[i] for i in te_idx], test.y, feature_map=fm)
    release = {
        "method": args.method,
        "estimator": "DPTransformerRM",
        "privacy_unit": unit,
        "n_train": int(tr_idx.size),
        "n_test": int(te_idx.size),
        "n_features": int(est.n_features_in_),
        "nonzeros": int(np.count_nonzero(est.coef_)),
        "data": args.data,
        "split": {
            "rule": "by row position" if unit == "sample" else "by prompt",
            "test_size": args.test_size,
            "seed": args.split_seed,
        },
    }
    result: dict[str, Any] = {
        **public_metadata(release),
        "model_kind": f"transformer ({args.model}, {est.top_layers} upper layer(s) trained)",
        "privacy_event": est.privacy_event_.to_dict(),
        "feature_config": fm.describe_config(),
        "operator_only": {"heldout_accuracy": acc},
    }
    if args.out:
        result["model"] = str(save_model(est, args.out, feature_config=fm.get_config(), metadata=release))
    if args.audit_record:
        audit = write_audit_record(
            args.audit_record,
            {
                "noise_seed_entropy": str(noise.entropy) if args.seed is None else str(args.seed),
                "data_sha256": data_sha256(args.data),
                "heldout_accuracy": acc,
                "command": "privalign fit-reward",
                "arguments": {k: v for k, v in vars(args).items() if k != "func"},
            },
            release=args.out,
        )
        result["audit_record"] = str(audit)
    if args.json:
        emit_json(result, indent=2)
        return 0
    what = f"{unit}-level privacy" if unit != "none" else "not private"
    print(
        f"DPTransformerRM {args.model} ({what}): held-out accuracy {acc:.4f} on {te_idx.size} pairs (exact, "
        "on private pairs: shown to you, not written into the release); event "
        f"{result['privacy_event']['kind']}"
        + (f"; saved to {result['model']}" if args.out else "")
        + (f"; operator-private audit record {result['audit_record']}" if args.audit_record else "")
    )
    if args.out and not args.audit_record:
        print(
            f"(no audit record: the noise seed is not kept anywhere; add --audit-record "
            f"{audit_record_path(args.out)} to keep it privately)",
            file=sys.stderr,
        )
    return 0
