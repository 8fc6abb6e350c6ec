"""notebooks/inspect_pairs.py executes without error against the fixture run (so it never rots).

jupytext reads the percent-format script into a notebook; nbclient runs it on a kernel of
this very interpreter, through a kernelspec written to a temp dir (nothing is installed
into the user's or the venv's Jupyter paths, so it works on a fresh CI machine).
"""

import json
import os
import sys
from pathlib import Path

import pytest
from fixtures_run import write_fixture_run
from markupsafe import escape

import selskill
from selskill.data.layout import StageDir
from selskill.data.shards import write_shard

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "inspect_pairs.py"


def _kernel_manager(tmp_path: Path, env: dict):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec_dir = tmp_path / "kernels" / "selskill-test"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "selskill test kernel",
        "language": "python",
        "env": env,
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name="selskill-test", kernel_spec_manager=ksm)


@pytest.mark.parametrize("kind", ["", "local"])
def test_inspect_pairs_notebook_executes(tmp_path, kind):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

    run = write_fixture_run(tmp_path / "runs", "fixture")
    # a rank that kept no pairs writes a 0-row shard, which datasets.load_dataset rejects; selskill.load_pairs reads it
    label = StageDir.of(tmp_path / "runs", "fixture", 1, "label")
    write_shard([], label.shard(1), "pair")
    label.marker(1).write_text("{}\n")
    env = {
        "SELSKILL_RUN": str(run),
        "SELSKILL_KIND": kind,
        "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    nb = jupytext.read(NOTEBOOK)
    km = _kernel_manager(tmp_path, env)
    client = nbclient.NotebookClient(
        nb, km=km, timeout=120, allow_errors=False, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "inspecting round 1" in text
    assert "selskill-table" in html  # yield table
    assert 'class="branch-point"' in html and "in-loss" in html  # a rendered pair
    # the fixture run has no round-0 model: the pair is its messages as text, not token ids
    assert "showing each message as text" in text
    assert '<span class="tok ' not in html and " id=" not in html
    shown = selskill.load_pairs(run, 1).filter(lambda p: not kind or p["kind"] == kind)[0]
    for column in ("prompt_messages", "chosen_messages", "rejected_messages"):
        for message in json.loads(shown[column]):
            assert f'<span class="who">{message["role"]}</span>{escape(message["content"])}' in html
    if kind == "local":
        assert "4 of 7 pairs match kind=local" in text
        assert "⑂ branch" in html and "r-observation" in html
