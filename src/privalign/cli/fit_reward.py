"""``privalign fit-reward``: fit a (private) sparse BTL reward model on preference pairs and save it.

Loads HH-RLHF harmless pairs, IMDb positive/negative pairs or a JSONL file of ``{"prompt", "chosen",
"rejected"}``, featurises them with a public map (hashed n-grams or MiniLM), splits 80/20 without looking
at what the privacy unit protects (by row position for the sample-DP methods, whose unit includes the
prompt; by prompt otherwise; the split seed --split-seed is public), fits the chosen estimator on the
training side and prints the held-out preference accuracy to you.

The saved model (``--out``) is the release: the coefficients, the privacy event, the feature-map config
and public facts about the fit (method, n, split rule, the tuning's choice). It never holds the seed of
the privacy noise (drawn from OS entropy unless --seed is given), a hash of the data or an exact
accuracy on private pairs; those go into the owner-only audit record of --audit-record if you want them
(docs/privacy/release.md).

Privacy units differ: ``dp-iht`` and ``dp-sgd`` are sample-DP (ε, δ); ``rr-iht`` and ``rr`` are
label-DP ε (features public); ``mle`` and ``iht`` are not private. An option the method does not read
is refused, not ignored: ``--epsilon`` with ``mle``/``iht``, ``--delta`` with the label-DP and non-private
methods, ``--sparsity`` with ``mle``/``rr``/``dp-sgd``, ``--n-iter`` with ``mle``/``rr``/``dp-sgd``.

``--model minilm`` fits a transformer reward model instead (``privalign.estimation.transformer``): the upper
``--top-layers`` of all-MiniLM-L6-v2 and a scalar head, trained on the pairs with the Bradley–Terry loss under
Opacus DP-SGD (``--method dp-sgd``, sample-DP ε, δ), on randomized-response labels with the debiased loss
(``--method rr``, label-DP ε) or without privacy (``--method mle``). It is saved in the same reward-model
format (the trained layers inside the file's feature map), so ``serve --reward-model``, ``build-pool
--proxy-reward linear:PATH`` and ``align`` read it unchanged. With ``--privacy-unit user --max-pairs-per-user
K`` it protects one user: ``rr`` randomizes each label at ε/K, ``dp-sgd`` samples users and clips each
user's summed gradient once (``--batch-size`` then counts users).

``--tune`` chooses the hyper-parameters (a small grid per method, ``privalign.estimation.tuning``) on a
validation split of the *training* prompts (``--validation-fraction``), never the test prompts; the
selection is the exponential mechanism on validation accuracy and the whole search, selection included,
costs the ``--epsilon``/``--delta`` given (candidates run at ε/K, δ/K), as the saved privacy event records.
With ``--privacy-unit user`` (rr, rr-iht, dp-sgd, dp-iht) the validation split is by user, every candidate is
fitted at user level and scored by its accuracy averaged per user; the whole search costs ε (δ) per user.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from privalign.cli._args import emit_json, epsilon_float

__all__ = ["register"]

_BACKBONES = ("minilm", "tiny-random")  # privalign.estimation.transformer.BACKBONES (imported lazily)


class _Given(argparse.Action):
    """Store the value and record that the option was given (``args.options_given``), so that an option with
    a default that the chosen method does not read can be refused rather than ignored."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        setattr(namespace, self.dest, values)
        namespace.options_given = (*getattr(namespace, "options_given", ()), self.dest)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fit-reward",
        help="Fit a (private) sparse linear BTL reward model, or a transformer one, on preference pairs.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, help="'hh-rlhf', 'imdb' or a path to a .jsonl of pairs.")
    p.add_argument(
        "--features", default="ngram", choices=("ngram", "minilm"), help="Public feature map (default ngram)."
    )
    from privalign.estimation import registry  # the estimators, registered ones included

    short = ", ".join(registry.short_name(n) for n in registry.names())
    p.add_argument(
        "--method",
        required=True,
        choices=registry.spellings(),
        metavar="METHOD",
        help=f"Estimator: {short} (or its class name: {', '.join(registry.names())}).",
    )
    p.add_argument(
        "--model",
        default="linear",
        choices=("linear",) + _BACKBONES,
        help="'linear' (default: a linear reward over --features) or a transformer reward model on a shipped "
        "backbone: 'minilm' (all-MiniLM-L6-v2, its upper --top-layers trained with a scalar head) or "
        "'tiny-random' (a 2-layer test backbone); with --method dp-sgd (Opacus DP-SGD, sample-DP), rr (RR "
        "labels and the debiased BT loss, label-DP) or mle (not private).",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="Transformer model: expected batch size b (Poisson rate b/n for dp-sgd; default 64, at most the "
        "number of training pairs).",
    )
    p.add_argument(
        "--epochs", type=float, default=None, help="Transformer model: passes over the data (default 2)."
    )
    p.add_argument(
        "--top-layers",
        type=int,
        default=None,
        help="Transformer model: upper encoder layers trained (default 1; the rest are frozen).",
    )
    p.add_argument(
        "--epsilon",
        type=epsilon_float(
            if_infinite="ε = ∞ is no privacy at all: the non-private fits are --method mle / iht",
        ),
        default=1.0,
        action=_Given,
        help="ε (private methods; default 1; finite, in [1e-9, 700]).",
    )
    p.add_argument(
        "--delta", type=float, default=1e-5, action=_Given, help="δ (sample-DP methods; default 1e-5)."
    )
    p.add_argument(
        "--sparsity", type=int, default=32, action=_Given, help="s for the IHT methods (default 32)."
    )
    p.add_argument("--n-features", type=int, default=2**12, help="Hashed n-gram dimension d (default 4096).")
    p.add_argument("--n-pairs", type=int, default=None, help="Use at most this many pairs.")
    p.add_argument(
        "--step-size",
        type=float,
        default=None,
        help="η for the IHT methods / learning rate for dp-sgd (Adam's step size with a transformer --model, "
        "default 1e-3).",
    )
    p.add_argument("--n-iter", type=int, default=None, help="T for the IHT methods.")
    p.add_argument("--test-size", type=float, default=0.2, help="Fraction of prompts held out (default 0.2).")
    p.add_argument(
        "--tune",
        action="store_true",
        help="Choose hyper-parameters on a validation split of the training prompts (of the training users, "
        "scored per user, with --privacy-unit user; privacy accounted).",
    )
    p.add_argument(
        "--validation-fraction",
        type=float,
        default=None,
        help="With --tune: fraction of training prompts used for selection, in (0, 1) (default 0.2).",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="Seed of the privacy noise (default: fresh OS entropy). It is never written into the model: a "
        "seeded private fit is exactly as private as the secrecy of its seed.",
    )
    p.add_argument(
        "--split-seed",
        type=int,
        default=0,
        help="Public seed of the data order and the train/test split (default 0; recorded in the model).",
    )
    p.add_argument(
        "--privacy-unit",
        default="record",
        choices=("record", "user"),
        help="What ε protects: 'record' (default: the method's own unit, one pair or one label) or 'user' "
        "(all of one person's data together: needs --max-pairs-per-user and a JSONL --data whose lines "
        "name their user; rr and rr-iht protect all of a user's labels, dp-sgd and dp-iht all of a user's "
        "pairs, with the linear and the transformer --model (rr, dp-sgd); docs/privacy/user_level.md).",
    )
    p.add_argument(
        "--max-pairs-per-user",
        type=int,
        default=None,
        metavar="K",
        help="With --privacy-unit user: each user keeps at most K pairs (the first K in file order). rr, "
        "rr-iht: each label is randomized at epsilon/K; dp-sgd: users are sampled and each user's summed "
        "gradient clipped once (also with a transformer --model); dp-iht: each user's pairs fall in one "
        "batch, Peeling at K times a pair's sensitivity.",
    )
    p.add_argument(
        "--user-field",
        default="user",
        metavar="NAME",
        help="With --privacy-unit user: the JSONL field naming each pair's user (default 'user').",
    )
    p.add_argument("--out", default=None, help="Where to save the model (JSON): the release.")
    p.add_argument(
        "--audit-record",
        default=None,
        metavar="PATH",
        help="Also write an operator-private audit record (mode 0600: the noise seed, the data file's "
        "SHA-256, the exact held-out and validation accuracies), e.g. MODEL.PRIVATE-audit.json. Never "
        "publish it: it undoes the model's privacy.",
    )
    p.add_argument("--json", action="store_true", help="Print the result as JSON on stdout.")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.model != "linear":
        from privalign.cli.fit_reward_transformer import run_transformer

        return run_transformer(args, check_writable=_check_writable, save=_save)
    _refuse_transformer_options(args)
    return _run_linear(args)


def _refuse_transformer_options(args: argparse.Namespace) -> None:
    from privalign.errors import PrivacyParameterError

    for dest in ("batch_size", "epochs", "top_layers"):
        if getattr(args, dest) is not None:
            flag = "--" + dest.replace("_", "-")
            raise PrivacyParameterError(
                f"argument {flag}: used only with a transformer --model (minilm, tiny-random); drop {flag} "
                f"or add --model minilm (got {getattr(args, dest)!r})"
            )


def _run_linear(args: argparse.Namespace) -> int:
    from privalign.estimation.fit import fit_reward_model, reward_estimator
    from privalign.release import audit_record_path

    # Build the estimator first so that bad parameters fail before any data is loaded (the fit builds its
    # own, with the noise generator).
    est = reward_estimator(
        args.method,
        epsilon=args.epsilon,
        delta=args.delta,
        sparsity=args.sparsity,
        step_size=args.step_size,
        n_iter=args.n_iter,
    )
    _validate_params(est, args)
    from privalign.estimation.fit import check_user_level

    check_user_level(args.privacy_unit, args.method, args.max_pairs_per_user, args.tune)
    features: Any = args.features
    if features == "minilm":
        from privalign.models.features import EmbeddingFeatures

        features = EmbeddingFeatures()
    fit = fit_reward_model(
        args.data,
        method=args.method,
        features=features,
        n_features=args.n_features,
        n_pairs=args.n_pairs,
        epsilon=args.epsilon,
        delta=args.delta,
        sparsity=args.sparsity,
        step_size=args.step_size,
        n_iter=args.n_iter,
        test_size=args.test_size,
        tune=args.tune,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        split_seed=args.split_seed,
        progress=_to_stderr,
        privacy_unit=args.privacy_unit,
        max_pairs_per_user=args.max_pairs_per_user,
        user_field=args.user_field,
    )
    result = _save(fit, args)
    if args.json:
        emit_json(result, indent=2)
        return 0
    unit = result["privacy_unit"]
    what = f"{unit}-level privacy" if unit != "none" else "not private"
    if unit == "user":
        k = result["max_pairs_per_user"]
        if result["user_level"]["route"] == "label":
            what += f": ε = {args.epsilon:g} per user, ≤ {k} pairs each, ε/{k} per label"
        else:
            what += f": (ε, δ) = ({args.epsilon:g}, {args.delta:g}) per user, ≤ {k} pairs each"
    counted = "users' pairs" if (result.get("user_level") or {}).get("counts") == "users" else "pairs"
    print(
        f"{result['estimator']} ({what}): held-out accuracy {fit.heldout_accuracy:.4f} on "
        f"{result['n_test']} {counted} (exact, on private pairs: shown to you, not written into the "
        "release); "
        f"event {result['privacy_event']['kind']}"
        + (f"; saved to {result['model']}" if args.out else "")
        + (
            f"; operator-private audit record {result['audit_record']} (never publish it)"
            if args.audit_record
            else ""
        )
    )
    if args.out and not args.audit_record:
        kept = "the data hash and the exact accuracies"  # a non-private fit draws no noise: no noise seed
        print(
            f"(no audit record: add --audit-record {audit_record_path(args.out)} to keep {kept} privately)"
            if unit == "none"
            else f"(no audit record: the noise seed is not kept anywhere; add --audit-record "
            f"{audit_record_path(args.out)} to keep it, {kept} privately)",
            file=sys.stderr,
        )
    return 0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _save(fit: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Write the release (--out) and the audit record (--audit-record) of ``fit`` (a
    ``privalign.estimation.fit.RewardFit``); returns the result to print, with their paths."""
    result: dict[str, Any] = dict(fit.summary)
    if args.out:
        result["model"] = str(fit.save(args.out))
    if args.audit_record:
        arguments = {k: v for k, v in vars(args).items() if k != "func"}
        record = fit.write_audit_record(args.audit_record, release=args.out, arguments=arguments)
        result["audit_record"] = str(record)
    return result


def _validate_params(est, args: argparse.Namespace) -> None:
    """Check ε, δ, s, test size before loading data (fit re-checks everything)."""
    from pathlib import Path

    from privalign._validation import check_int, check_probability, check_real
    from privalign.errors import PrivacyParameterError

    _refuse_unused(est, args)
    check_real(args.epsilon, "epsilon", low=0.0, closed="neither")  # ε = ∞ is not private: name mle/iht
    check_probability(args.delta, "delta")
    check_int(args.sparsity, "sparsity", low=1)
    check_int(args.n_features, "n_features", low=1)
    # the hashed n-gram map has exactly --n-features columns (MiniLM's width is known only once loaded)
    if args.features == "ngram" and type(est).sparse and args.sparsity > args.n_features:
        raise PrivacyParameterError(
            f"The 'sparsity' parameter must be at most the number of features d={args.n_features} "
            f"(--n-features). Got {args.sparsity} instead."
        )
    check_probability(args.test_size, "test_size")
    if args.n_pairs is not None:  # the loader would call it 'limit'
        check_int(args.n_pairs, "n_pairs", low=1)
    if args.step_size is not None:
        check_real(args.step_size, "step_size", low=0.0, closed="neither")
    if args.n_iter is not None:
        check_int(args.n_iter, "n_iter", low=1)
    if args.out is not None and Path(args.out).is_dir():  # else found only after the fit, as '.tmp.* -> DIR'
        raise PrivacyParameterError(
            f"The 'out' parameter must name a file to write, not a directory. Got {args.out!r} instead."
        )
    if args.audit_record is not None:
        if Path(args.audit_record).is_dir():
            raise PrivacyParameterError(
                "The 'audit_record' (--audit-record) parameter must name a file to write, not a directory. "
                f"Got {args.audit_record!r} instead."
            )
        if args.out is not None and Path(args.audit_record).resolve() == Path(args.out).resolve():
            raise PrivacyParameterError(
                "The 'audit_record' (--audit-record) parameter must differ from --out: the audit record is "
                f"operator-private, the model is the release. Got {args.audit_record!r} for both."
            )
    for flag, path in (("--out", args.out), ("--audit-record", args.audit_record)):
        if path is not None:
            _check_writable(flag, path)
    if not args.tune and args.validation_fraction is not None:
        raise PrivacyParameterError(
            "argument --validation-fraction: used only with --tune (without it nothing is selected on a "
            f"validation split); add --tune or drop --validation-fraction. Got {args.validation_fraction!r}."
        )
    if args.tune:
        if args.validation_fraction is None:
            args.validation_fraction = 0.2
        check_real(
            args.validation_fraction,
            "validation_fraction (--validation-fraction)",
            low=0.0,
            high=1.0,
            closed="neither",
        )


def _check_writable(flag: str, path: str) -> None:
    """The file ``path`` can be created: its nearest existing ancestor is a writable directory (found after
    the fit, it was '[Errno 2] .../.m.json.tmp' or 'afile exists and is not a directory')."""
    import os

    from privalign.errors import PrivacyParameterError

    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise PrivacyParameterError(f"argument {flag}: {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK):
        raise PrivacyParameterError(f"argument {flag}: {path}: cannot write into {parent}")


def _refuse_unused(est, args: argparse.Namespace) -> None:
    """An option the chosen estimator does not read is refused, not ignored, as ``select`` does: e.g.
    ``--method rr-iht --delta 1e-6`` fitted a pure ε label-DP model, though δ was asked for."""
    from privalign.errors import PrivacyParameterError

    given = set(getattr(args, "options_given", ()))
    given |= {k for k in ("step_size", "n_iter") if getattr(args, k) is not None}
    params = est.get_params()
    reads = {"step_size": type(est).step_param}
    for dest in ("epsilon", "delta", "sparsity", "step_size", "n_iter"):
        if dest in given and reads.get(dest, dest) not in params:
            flag = "--" + dest.replace("_", "-")
            why = {
                "epsilon": "it is not private: it adds no noise",
                "delta": "its guarantee is pure ε-DP, with no δ",
                "sparsity": "it is not sparse",
            }.get(dest, "it has no such parameter")
            raise PrivacyParameterError(
                f"argument {flag}: not used by --method {args.method} ({why}); drop {flag} "
                f"(got {getattr(args, dest)!r})"
            )
