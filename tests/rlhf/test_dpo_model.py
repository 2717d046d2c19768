"""``privalign dpo`` on SmolLM2-135M-Instruct (sample-DP, 2 steps): the policy is the generator of
``build-pool`` and of the service. Loads the GGUF (``model``; ``slow``: minutes on 2 shared cores)."""

from __future__ import annotations

import json

import pytest

from privalign.cli import main

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_dpo_sample_two_steps_then_generate(tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {
            "prompt": f"Review {k}:",
            "chosen": f" A moving, brilliant film {k}.",
            "rejected": f" Dull and weak {k}.",
        }
        for k in range(8)
    ]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "dpo"
    argv = ["dpo", "--data", str(pairs), "--privacy", "sample", "--epsilon", "8", "--delta", "1e-2"]
    argv += ["--out", str(out), "--batch-size", "4", "--lora-rank", "2", "--max-length", "24"]
    argv += ["--num-threads", "1", "--no-progress", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    man = json.loads(capsys.readouterr().out)
    assert man["steps"] == 2 and man["privacy"]["privacy_unit"] == "sample"
    assert man["privacy"]["accounting"]["cross_check"]["agrees"]
    assert man["privacy"]["guarantee"]["epsilon"] <= 8.0
    policy = out / "policy"
    assert "quantization_config" not in json.loads((policy / "config.json").read_text())

    from privalign.service.components import build_generator
    from privalign.service.config import ComponentConfig

    gen = build_generator(
        ComponentConfig(
            kind="transformers",
            options={"model": str(policy), "max_new_tokens": 4, "chat_template": False, "num_threads": 1},
        )
    )
    res = gen("This movie was", 1, max_tokens=4, temperature=1.0, top_p=1.0, chat=False)
    assert len(res.texts) == 1 and isinstance(res.texts[0], str)
    pool = tmp_path / "pool.jsonl"
    argv = ["build-pool", "--dataset", "imdb", "--model", str(policy), "--n", "1", "--num-prompts", "1"]
    argv += ["--max-new-tokens", "4", "--proxy-reward", "vader", "--true-reward", "none", "--out", str(pool)]
    argv += ["--no-progress", "--num-threads", "1"]
    assert main(argv) == 0
    rec = json.loads(pool.read_text().splitlines()[0])
    assert len(rec["responses"]) == 1 and rec["meta"]["generator"] == str(policy)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_dpo_sample_user_level_two_steps(tmp_path, capsys):
    """User-level DP-SGD on SmolLM2 (issue 39): 8 users with 3 pairs each, each keeps its first K = 2; the
    batch counts users (4 of 8: q = 1/2, 2 steps); the manifest states unit ``user``, K and (ε, δ) per user,
    and no count of the pairs kept (it depends on one user's data)."""
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {
            "prompt": f"Review {k}:",
            "chosen": f" A moving, brilliant film {k}.",
            "rejected": f" Dull and weak {k}.",
            "user": f"u{k % 8}",
        }
        for k in range(24)
    ]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "dpo"
    argv = ["dpo", "--data", str(pairs), "--privacy", "sample", "--epsilon", "8", "--delta", "1e-2"]
    argv += ["--privacy-unit", "user", "--max-pairs-per-user", "2"]
    argv += ["--out", str(out), "--batch-size", "4", "--lora-rank", "2", "--max-length", "24"]
    argv += ["--num-threads", "1", "--no-progress", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    man = json.loads(capsys.readouterr().out)
    priv = man["privacy"]
    assert man["steps"] == 2 and priv["privacy_unit"] == "user" and priv["max_pairs_per_user"] == 2
    assert priv["privacy_event"]["unit"] == "user"
    assert priv["accounting"]["sampling_probability"] == 0.5 and priv["accounting"]["cross_check"]["agrees"]
    assert priv["guarantee"]["epsilon"] <= 8.0 and priv["guarantee"]["delta"] <= 1e-2
    assert "n_pairs" not in json.dumps(man)
    assert (out / "policy" / "config.json").is_file()
