"""Close the loop: ``privalign align`` (tiny) → the saved policy is the generator of ``build-pool`` and of the
service → one completion; interrupted runs resume from the last checkpoint. Loads SmolLM2 (``model``) and
trains for a few steps on the CPU (``slow``: a few minutes on 2 shared cores)."""

from __future__ import annotations

import json
import shutil

import pytest

from privalign.cli import main

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_align_resume_then_serve_and_build_pool(tmp_path, make_rm, capsys):
    from privalign.rlhf.rewards import file_sha256

    rm = make_rm(tmp_path)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The film was\nI watched this movie and\n")
    out = tmp_path / "run"
    argv = [
        "align",
        "--reward-model",
        str(rm),
        "--out",
        str(out),
        "--prompts",
        str(prompts),
        "--steps",
        "2",
        "--save-steps",
        "1",
        "--num-generations",
        "2",
        "--max-new-tokens",
        "4",
        "--lora-rank",
        "2",
        "--num-threads",
        "1",
        "--seed",
        "3",
        "--no-progress",
        "--json",
    ]
    assert main(argv) == 0
    man = json.loads(capsys.readouterr().out)
    assert man["status"] == "complete" and man["steps_done"] == 2 and man["resumed_from"] is None
    assert man["reward_model"]["sha256"] == file_sha256(rm)
    assert man["privacy"]["privacy_event"]["epsilon"] == 8.0 and man["privacy"]["privacy_unit"] == "label"
    assert man["prompts"]["list"] == ["The film was", "I watched this movie and"]
    assert man["trl_config"]["beta"] == 0.05 and man["trl_config"]["seed"] == 3
    assert man["overlap_check"]["checked"] and man["overlap_check"]["result"].startswith("disjoint")
    assert "overlapping_prompts" not in man["overlap_check"]  # a count over private records: not released
    assert man["privacy"]["guarantee"] == {
        "epsilon": 8.0,
        "delta": 0.0,
        "how": man["privacy"]["guarantee"]["how"],
    }
    # no digest of the private preference file anywhere in the manifest
    assert file_sha256(tmp_path / "pairs.jsonl") not in json.dumps(man)
    assert len(man["training_log"]) == 2
    policy = out / "policy"
    cfg = json.loads((policy / "config.json").read_text())
    assert "quantization_config" not in cfg and (policy / "model.safetensors").is_file()

    # a complete run is not redone
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["resumed"] is False

    # simulate an interruption after step 1: the rerun resumes from checkpoint-1 and finishes step 2
    shutil.rmtree(out / "checkpoints" / "checkpoint-2")
    shutil.rmtree(policy)
    m = json.loads((out / "manifest.json").read_text())
    m["status"] = "incomplete"
    (out / "manifest.json").write_text(json.dumps(m))
    assert main(argv) == 0
    cap = capsys.readouterr()
    man2 = json.loads(cap.out)
    assert (
        man2["resumed_from"].endswith("checkpoint-1")
        and man2["steps_done"] == 2
        and (policy / "config.json").is_file()
    )
    said = [ln for ln in cap.err.splitlines() if "resuming" in ln]  # it did not say that it resumed
    assert len(said) == 1 and "from step 1 of 2" in said[0] and "checkpoint-1" in said[0], cap.err

    # other arguments on the same directory are refused, naming what differs and how to go on
    assert main([*argv[:-1], "--beta", "0.2"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "--beta 0.2, not 0.05" in err and "new --out" in err, err

    # the policy is the generator of build-pool ...
    pool = tmp_path / "pool.jsonl"
    assert (
        main(
            [
                "build-pool",
                "--dataset",
                "imdb",
                "--model",
                str(policy),
                "--n",
                "1",
                "--num-prompts",
                "1",
                "--max-new-tokens",
                "4",
                "--proxy-reward",
                "vader",
                "--true-reward",
                "none",
                "--out",
                str(pool),
                "--no-progress",
                "--num-threads",
                "1",
            ]
        )
        == 0
    )
    rec = json.loads(pool.read_text().splitlines()[0])
    assert len(rec["responses"]) == 1 and isinstance(rec["responses"][0]["text"], str)
    assert rec["meta"]["generator"] == str(policy)

    # ... and of the service ([generator] kind = "transformers", model = the policy directory)
    from privalign.service.components import build_generator
    from privalign.service.config import ComponentConfig

    gen = build_generator(
        ComponentConfig(
            kind="transformers",
            options={"model": str(policy), "max_new_tokens": 4, "chat_template": False, "num_threads": 1},
        )
    )
    out = gen("This movie was", 1, max_tokens=4, temperature=1.0, top_p=1.0, chat=False)
    texts = out.texts  # a Generation: candidates with token counts and finish reasons
    assert len(texts) == 1 and isinstance(texts[0], str) and 0 <= out.candidates[0].num_tokens <= 4


def test_align_on_a_user_level_reward_model_states_the_user_and_k(tmp_path, capsys):
    """``privalign align`` (1 step) on a ``fit-reward --privacy-unit user`` model: the manifest's privacy
    event has unit ``user``, the reward model it copies states K, and the statement says ε per user and K."""
    words = (["great", "superb", "moving", "lovely"], ["dull", "awful", "boring", "weak"])
    rows = [
        {
            "prompt": "",
            "chosen": f"{words[0][k % 4]} {words[0][(k + 1) % 4]} film {k}",
            "rejected": f"{words[1][k % 4]} {words[1][(k + 2) % 4]} film {k}",
            "user": f"ann{k % 20}",
        }
        for k in range(100)
    ]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    rm = tmp_path / "rm.json"
    argv = ["fit-reward", "--data", str(pairs), "--method", "rr", "--epsilon", "8", "--n-features", "256"]
    assert main([*argv, "--privacy-unit", "user", "--max-pairs-per-user", "3", "--out", str(rm)]) == 0
    capsys.readouterr()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The film was\n")
    argv = ["align", "--reward-model", str(rm), "--out", str(tmp_path / "run"), "--prompts", str(prompts)]
    argv += ["--steps", "1", "--num-generations", "2", "--max-new-tokens", "4", "--lora-rank", "2"]
    assert main([*argv, "--num-threads", "1", "--seed", "3", "--no-progress", "--json"]) == 0
    man = json.loads(capsys.readouterr().out)
    priv = man["privacy"]
    assert man["status"] == "complete" and priv["privacy_unit"] == "user"
    assert priv["privacy_event"]["unit"] == "user" and priv["privacy_event"]["count"] == 3
    assert man["reward_model"]["max_pairs_per_user"] == 3
    assert "at most 3 pairs per user" in priv["statement"]
    assert priv["guarantee"]["epsilon"] <= 8.0 * (1 + 1e-9)
