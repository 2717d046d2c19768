"""The ``privalign align`` workflow as library calls (:mod:`privalign.rlhf.workflow`), without a policy model:
inputs, the overlap check, and the errors that name the flag before anything is trained or written."""

from __future__ import annotations

import json
import warnings

import pytest

from privalign.cli import main
from privalign.errors import PrivacyParameterError, PrivacyWarning
from privalign.rlhf.train import AlignConfig
from privalign.rlhf.workflow import align, load_align_inputs


def _prompt_file(tmp_path, *, overlap: bool):
    pairs = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    p = tmp_path / "prompts.txt"
    p.write_text("A film about the sea\n" + (pairs[7]["rejected"] + "\n" if overlap else ""))
    return p


def test_inputs_of_a_private_reward_and_a_prompt_file(tmp_path, make_rm):
    rm = make_rm(tmp_path)
    inputs = load_align_inputs(rm, prompts=_prompt_file(tmp_path, overlap=False))
    assert inputs.prompts == ["A film about the sea"]
    assert inputs.reward.is_private and inputs.reward.privacy_unit == "label"
    assert inputs.overlap_check["checked"] and inputs.overlap_check["overlapping_prompts"] == 0
    assert inputs.prompt_info["source"] == "file"


def test_overlap_is_refused_or_recorded_with_a_warning(tmp_path, make_rm):
    rm = make_rm(tmp_path)
    prompts = _prompt_file(tmp_path, overlap=True)
    with pytest.raises(PrivacyParameterError, match=r"^argument --prompts: .*1 of 2.*--allow-overlap"):
        load_align_inputs(rm, prompts=prompts)
    with pytest.warns(PrivacyWarning, match=r"^1 prompts overlap the reward model's preference data"):
        inputs = load_align_inputs(rm, prompts=prompts, allow_overlap=True)
    assert inputs.overlap_check["overlapping_indices"] == [1]


def test_input_errors_name_the_flag_and_keep_their_type(tmp_path, make_rm):
    with pytest.raises(FileNotFoundError, match=r"^argument --reward-model: .*nope\.json"):
        load_align_inputs(tmp_path / "nope.json")
    rm = make_rm(tmp_path)
    with pytest.raises(PrivacyParameterError, match=r"^argument --num-prompts/--prompt-offset: .* 0, "):
        load_align_inputs(rm, num_prompts=0)
    with pytest.raises(FileNotFoundError, match=r"^argument --prompts: "):
        load_align_inputs(rm, prompts=tmp_path / "none.txt")
    with pytest.raises(PrivacyParameterError, match=r"^argument --num-threads: .* 0\.$"):
        align(rm, tmp_path / "o", AlignConfig(), num_threads=0)
    assert not (tmp_path / "o").exists()


def test_align_refuses_an_out_that_is_a_file_before_any_model_loads(tmp_path, make_rm):
    rm = make_rm(tmp_path)
    out = tmp_path / "out"
    out.write_text("keep me")
    with pytest.raises(PrivacyParameterError, match=r"^argument --out: .*must be a directory"):
        align(rm, out, AlignConfig(), prompts=_prompt_file(tmp_path, overlap=False))
    assert out.read_text() == "keep me"


def test_cli_prints_the_overlap_warning_then_the_error(tmp_path, make_rm, capsys):
    rm = make_rm(tmp_path)
    out = tmp_path / "out"
    out.mkdir()  # a directory that holds no align run: refused after the inputs are read (a file as --out
    (out / "keep.txt").write_text("keep me")  # is refused before, with no warning)
    argv = ["align", "--reward-model", str(rm), "--out", str(out), "--allow-overlap"]
    with warnings.catch_warnings():
        warnings.simplefilter("always", PrivacyWarning)  # the suite turns PrivacyWarning into an error
        assert main([*argv, "--prompts", str(_prompt_file(tmp_path, overlap=True))]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == (
        "privalign align: warning: 1 prompts overlap the reward model's preference data (--allow-overlap "
        "given); the policy's privacy statement does not cover those prompts."
    )
    assert lines[1].startswith("privalign align: error: argument --out: ") and len(lines) == 2
    assert (out / "keep.txt").read_text() == "keep me"
