"""``privalign dpo``: direct preference optimisation of SmolLM2-135M-Instruct (LoRA) on private preference
pairs, under label-DP or sample-DP.

* ``--privacy label``: randomized response on each preference label (ε-label-DP; flip rate 1/(1+e^ε)), then
  DPO with the debiased ("robust") loss for that flip rate. Unit: one preference label (texts public).
* ``--privacy sample``: DP-SGD on the LoRA parameters (Opacus per-comparison gradients, Poisson sampling,
  clipping, Gaussian noise), (ε, δ)-DP under replace-one, accounted by privalign's PLD accountant and
  cross-checked against Opacus's. Unit: one comparison. The noise grows with the number of LoRA parameters d,
  the signal does not: before the first step a warning line says when the isotropic signal-to-noise ceiling
  of the run, B·√T/(σ·√d), is below 1 (the noise is then large against the signal; at 400 pairs and rank 8 the
  one schedule tried did not move the policy, see docs/privacy/dpo-sample.md).
* ``--privacy none``: non-private DPO (a reference).

``--privacy-unit user --max-pairs-per-user K`` protects one *user* (all of their pairs) instead of one record:
every line of ``--data`` names its user (field ``--user-field``, default ``user``; a line without one is
refused), each user keeps the first K of their pairs in file order, and
  - with ``--privacy label``, each label is randomized at ε/K (a user's labels together cost ε; the texts and
    who gave which pair are public); ``--flip-rate`` is refused (it fixes the per-label ε, not the user's);
  - with ``--privacy sample``, user-level DP-SGD (McMahan et al. 2018): Poisson sampling of users
    (``--batch-size`` counts expected users per step), each sampled user's gradient summed over their pairs
    and clipped once to ``--clip-norm``, noise on the sum; (ε, δ) per user, δ < 1/(number of users). See
    docs/privacy/dpo-user.md.

``--optimizer {adam,adamw,sgd}`` (default adam; adamw: decoupled ``--weight-decay``, default 0.01) acts on the
privatized gradient or the randomized labels only: the same ε whichever is chosen.

``--data`` is a .jsonl file of ``{"prompt": ..., "chosen": ..., "rejected": ...}`` (plus the user field at
user level). ``OUT/policy`` is a plain
HF model directory (``privalign build-pool --model OUT/policy``, or the generator model of ``privalign
serve``); ``OUT/manifest.json`` holds the configuration and the privacy statement, never the seed, a hash of
the data or the training loss. OUT is written only when training has finished. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from privalign.cli._args import epsilon_float

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dpo",
        help="Train a policy with DPO (LoRA) on preference pairs under label-DP or sample-DP.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, help=".jsonl of pairs (chosen, rejected, optional prompt)")
    p.add_argument("--privacy", required=True, choices=("label", "sample", "none"), help="privacy route")
    p.add_argument(
        "--epsilon",
        type=epsilon_float(if_infinite="ε = ∞ is no privacy at all: the non-private route is --privacy none"),
        default=None,
        help="ε for label/sample (finite, in [1e-9, 700])",
    )
    p.add_argument(
        "--flip-rate", type=float, default=None, help="label only: the flip rate ρ in (0, 0.5) instead of ε"
    )
    p.add_argument(
        "--delta",
        type=float,
        default=None,
        help="sample only: δ in (0, 1/n) (default 1e-5); n = the number of users with --privacy-unit user",
    )
    p.add_argument(
        "--privacy-unit",
        choices=("record", "user"),
        default="record",
        help="what ε protects: 'record' (default: one label or one comparison) or 'user' (all of one "
        "person's pairs: needs --max-pairs-per-user and a user field on every line; "
        "docs/privacy/dpo-user.md)",
    )
    p.add_argument(
        "--max-pairs-per-user",
        type=int,
        default=None,
        metavar="K",
        help="with --privacy-unit user: each user keeps at most K pairs (the first K in file order)",
    )
    p.add_argument(
        "--user-field",
        default="user",
        help="with --privacy-unit user: the JSONL field naming each pair's user (default 'user')",
    )
    p.add_argument("--out", required=True, help="output directory (new or empty): manifest.json, policy/")
    p.add_argument(
        "--base-model",
        default="smollm2",
        help="'smollm2' (the shipped default) or a local HF model directory",
    )
    p.add_argument("--beta", type=float, default=0.1, help="DPO temperature β > 0 (default 0.1)")
    p.add_argument("--learning-rate", type=float, default=5e-4, help="step size (default 5e-4)")
    p.add_argument(
        "--optimizer",
        choices=("adam", "adamw", "sgd"),
        default="adam",
        help="adam (default), adamw (decoupled weight decay; DP-AdamW of arXiv:2505.08849 on the sample "
        "route, without its unconfirmed second-moment correction) or sgd; post-processing: the same ε",
    )
    p.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        help="adamw only: decoupled weight decay λ ≥ 0 (default 0.01)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="(expected) pairs per step (default 8); expected users per step with --privacy sample "
        "--privacy-unit user",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=1,
        help="passes over the pairs (over the users under user-level sample; default 1)",
    )
    p.add_argument("--max-length", type=int, default=64, help="tokens per prompt+response (default 64)")
    p.add_argument("--lora-rank", type=int, default=8, help="LoRA rank (default 8; α = 2r)")
    p.add_argument(
        "--clip-norm",
        type=float,
        default=1.0,
        help="sample: clipping norm of each comparison's gradient, or of each user's summed gradient with "
        "--privacy-unit user (default 1)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="seed of all randomness (default: fresh; never recorded)"
    )
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--no-progress", action="store_true", help="no step counter on stderr")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON on stdout")
    p.set_defaults(func=_run)


def _fail(msg: str) -> int:
    print(f"privalign dpo: error: {' '.join(str(msg).split())}", file=sys.stderr)
    return 2


_FLAGS = {
    "privacy_unit": "--privacy-unit",
    "max_pairs_per_user": "--max-pairs-per-user",
    "weight_decay": "--weight-decay",
    "optimizer": "--optimizer",
    "privacy": "--privacy",
    "epsilon": "--epsilon",
    "delta": "--delta",
    "beta": "--beta",
    "learning_rate": "--learning-rate",
    "batch_size": "--batch-size",
    "epochs": "--epochs",
    "max_length": "--max-length",
    "lora_rank": "--lora-rank",
    "clip_norm": "--clip-norm",
    "flip_rate": "--flip-rate",
    "out": "--out",
    "data": "--data",
}


def _flag_msg(exc: Exception) -> str:
    """ "The 'batch_size' parameter ..." → "argument --batch-size: The 'batch_size' parameter ..."."""
    msg = str(exc)
    for name, flag in _FLAGS.items():
        if f"'{name}'" in msg:
            return f"argument {flag}: {msg}"
    return msg


def _epsilon(args: argparse.Namespace) -> tuple[float | None, str | None]:
    """ε from --epsilon or --flip-rate (ε = log((1 − ρ)/ρ)), or an error line."""
    if args.flip_rate is None:
        return args.epsilon, None
    if args.privacy != "label":
        return None, "argument --flip-rate: only with --privacy label."
    if args.privacy_unit == "user":
        return None, (
            "argument --flip-rate: not with --privacy-unit user: a flip rate fixes the per-label ε, while "
            "the user's ε is K times it; give the per-user --epsilon (each label is then randomized at ε/K)."
        )
    if args.epsilon is not None:
        return None, "argument --flip-rate: give --epsilon or --flip-rate, not both."
    rho = args.flip_rate
    if not (math.isfinite(rho) and 0.0 < rho < 0.5):
        return None, f"argument --flip-rate: the flip rate must be in (0, 0.5). Got {rho!r}."
    eps = math.log((1.0 - rho) / rho)
    from privalign._validation import EPS_MAX, EPS_MIN, epsilon_problem

    why = epsilon_problem(eps)
    if why is not None:  # the ε rule, in terms of the flag given: ρ in [1/(1+e^EPS_MAX), 1/(1+e^EPS_MIN)]
        lo, hi = 1.0 / (1.0 + math.exp(EPS_MAX)), 1.0 / (1.0 + math.exp(EPS_MIN))
        return None, (
            f"argument --flip-rate: the flip rate must be in [{lo:.3g}, {hi:.17g}] (ε = log((1 − ρ)/ρ) in "
            f"[{EPS_MIN:g}, {EPS_MAX:g}]). Got {rho!r} (ε = {eps:.3g}): {why}."
        )
    return eps, None


def _check_backbone(spec: str) -> str | None:
    if spec == "smollm2":
        return None
    p = Path(spec)
    if p.is_dir() and (p / "config.json").is_file():
        return None
    return (
        f"argument --base-model: {spec!r} is not a shipped backbone ('smollm2') nor a local HF model "
        "directory with a config.json."
    )


def _build(args: argparse.Namespace) -> tuple[object, object, str | None]:
    """(config, pairs, error): every check that needs no model."""
    from privalign.errors import DataFormatError, PrivacyParameterError
    from privalign.rlhf.dpo import DPOConfig, _check_out, check_schedule, prepare_units, read_dpo_pairs

    eps, err = _epsilon(args)
    if err:
        return None, None, err
    if args.num_threads is not None and args.num_threads < 1:
        return None, None, f"argument --num-threads: must be an integer >= 1. Got {args.num_threads}."
    try:
        cfg = DPOConfig(
            privacy=args.privacy,
            epsilon=eps,
            delta=args.delta,
            beta=args.beta,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            epochs=args.epochs,
            max_length=args.max_length,
            lora_rank=args.lora_rank,
            clip_norm=args.clip_norm,
            privacy_unit=args.privacy_unit,
            max_pairs_per_user=args.max_pairs_per_user,
            optimizer=args.optimizer,
            weight_decay=args.weight_decay,
        )
    except PrivacyParameterError as exc:
        return None, None, _flag_msg(exc)
    err = _check_backbone(args.base_model)
    if err:
        return None, None, err
    from privalign.errors import MissingDependencyError
    from privalign.models._resources import require

    try:
        require("peft", purpose="privalign dpo (pip install 'privalign[rlhf]')")
        if cfg.privacy == "sample":
            require("opacus", purpose="privalign dpo --privacy sample (pip install 'privalign[rlhf]')")
    except MissingDependencyError as exc:
        return None, None, str(exc)
    try:
        _check_out(Path(args.out))
        pairs = read_dpo_pairs(args.data, user_field=args.user_field if cfg.user_level else None)
        units = prepare_units(pairs, cfg, user_field=args.user_field)  # user level: bounded first
    except PrivacyParameterError as exc:
        return None, None, _flag_msg(exc)
    except (FileNotFoundError, DataFormatError) as exc:
        return None, None, f"argument --data: {exc}"
    try:
        check_schedule(cfg, units.n_units)
    except PrivacyParameterError as exc:
        return None, None, _flag_msg(exc)
    return cfg, pairs, None


@contextlib.contextmanager
def _utility_warnings_as_lines() -> Iterator[None]:
    """A :class:`~privalign.errors.UtilityWarning` (e.g. noise that swamps sample-DP DPO) as one stderr line
    when it is raised (before the first step), not Python's file:line format."""
    from privalign.errors import UtilityWarning

    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message: Any, category: type[Warning], *a: Any, **k: Any) -> None:
            if issubclass(category, UtilityWarning):
                print(f"privalign dpo: warning: {message}", file=sys.stderr, flush=True)
            else:
                shown(message, category, *a, **k)

        warnings.simplefilter("always", UtilityWarning)
        warnings.showwarning = show
        yield


def _run(args: argparse.Namespace) -> int:
    from privalign.errors import MissingDependencyError, PrivacyParameterError
    from privalign.paths import check_out_dir

    try:  # first, in well under a second (before torch is imported): a read-only --out was found only after
        check_out_dir(args.out, atomic=True)  # training; OUT is built in OUT.partial beside it, then renamed
    except ValueError as exc:
        return _fail(str(exc))
    cfg, _, err = _build(args)
    if err:
        return _fail(err)
    import numpy as np

    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)

    def progress(t: int, total: int) -> None:
        print(f"\rDPO step {t}/{total}", end="\n" if t == total else "", file=sys.stderr, flush=True)

    from privalign.rlhf.dpo import dpo_policy
    from privalign.rlhf.train import _third_party_quiet

    rng = np.random.default_rng(args.seed)
    try:
        with _third_party_quiet(), _utility_warnings_as_lines():
            res = dpo_policy(
                args.data,
                args.out,
                cfg,  # type: ignore[arg-type]
                base_model=args.base_model,
                rng=rng,
                progress=None if args.no_progress else progress,
                user_field=args.user_field,
            )
    except PrivacyParameterError as exc:
        return _fail(_flag_msg(exc))
    except MissingDependencyError as exc:
        return _fail(str(exc))
    man = {k: v for k, v in res.items() if k not in ("model", "losses")}
    if args.json:
        print(json.dumps(man, indent=2, default=str))
    else:
        d = man["data"]
        k = args.max_pairs_per_user
        size = f"{d['n_pairs']} pairs" if "n_users" not in d else f"{d['n_users']} users (≤ {k} pairs each)"
        print(f"DPO ({args.privacy}) {man['steps']} steps on {size}; policy saved to {man['policy_dir']}")
        print(man["privacy"]["statement"])
    return 0
