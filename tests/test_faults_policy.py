"""Fault injection, part 3: the policy a stage ran is known by every byte, and a broken model file is one line.

A weight changed in the middle of `model.safetensors` is a changed input like a changed recipe
key, found from a manifest that hashes a file again only when its stat changed; a record
written when policies were fingerprinted by their first and last MiB is still recognised. A
truncated or corrupt GGUF file is named with its fix before anything loads it.
"""

from __future__ import annotations

import json
import os

import pytest
from test_faults import _compute, _run, branch_rows

from selskill.data import manifest
from selskill.data.contract import StageRefused
from selskill.data.inputs import StageInputs, sampled_policy_fingerprint
from selskill.data.layout import StageDir
from selskill.data.rank_writer import run_rank


def _model(path, mib: int = 6):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "toy"}\n')
    (path / "model.safetensors").write_bytes(os.urandom(mib << 20))
    return path


def _sampled(run, policy) -> bool:
    """One rank of a toy stage that records `policy` as the model it ran."""
    stage = StageDir.of(run.runs_dir, "t", 1, "sample")
    inputs = StageInputs([run], 3, 1, policy=str(policy))
    return run_rank(stage, "branch", run, inputs, _compute(branch_rows(2)), log=lambda s: None)


def test_a_weight_changed_in_the_middle_of_the_file_is_a_changed_policy(tmp_path):
    policy, run = _model(tmp_path / "model"), _run(tmp_path)
    assert _sampled(run, policy)
    weights = policy / "model.safetensors"
    with open(weights, "r+b") as f:  # same size, first and last MiB untouched
        f.seek(3 << 20)
        f.write(b"\x7f" * 64)
    with pytest.raises(
        StageRefused, match=r"rank 0 was computed with other inputs than this run: policy: 'sha256:"
    ):
        _sampled(run, policy)  # was: "rank 0 already complete, skipping"
    assert _sampled(run.replace(redo=True), policy)


def test_the_policy_is_hashed_once_and_again_only_where_a_file_changed(tmp_path, monkeypatch):
    policy, run = _model(tmp_path / "model"), _run(tmp_path)
    hashed = []
    real = manifest.file_sha256
    monkeypatch.setattr(manifest, "file_sha256", lambda p: hashed.append(p.name) or real(p))
    assert _sampled(run, policy)
    assert sorted(hashed) == ["config.json", "model.safetensors"]
    stores = list((tmp_path / "runs" / manifest.MANIFESTS_DIR).glob("policy-*.json"))
    assert len(stores) == 1 and set(json.loads(stores[0].read_text())["files"]) == set(hashed)
    hashed.clear()
    assert not _sampled(run, policy)  # complete, and nothing was read again
    assert hashed == []
    (policy / "config.json").write_text('{"model_type": "toy2"}\n')
    with pytest.raises(StageRefused, match="policy: "):
        _sampled(run, policy)
    assert hashed == ["config.json"]


def test_a_policy_recorded_by_its_first_and_last_mib_is_recognised_with_a_note(tmp_path, caplog):
    policy, run = _model(tmp_path / "model"), _run(tmp_path)
    assert _sampled(run, policy)
    stage = StageDir.of(run.runs_dir, "t", 1, "sample")
    marker = json.loads(stage.marker(0).read_text())
    marker["inputs"]["policy"] = sampled_policy_fingerprint(str(policy))  # as an older selskill recorded it
    stage.marker(0).write_text(json.dumps(marker))
    with caplog.at_level("INFO"):
        assert not _sampled(run, policy)
    assert "fingerprinted policies by their first and last MiB" in caplog.text
    marker["inputs"]["policy"] = "0123456789abcdef"  # another policy, recorded the old way
    stage.marker(0).write_text(json.dumps(marker))
    with pytest.raises(StageRefused, match="policy: '0123456789abcdef' -> 'sha256:"):
        _sampled(run, policy)
