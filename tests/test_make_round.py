"""The README's first command, as a newcomer runs it: `make round` on a recipe, to its report.

It runs the Makefile's own `round` target on `recipes/micro.yaml` (runs and games moved into a
temporary folder): every stage for real, then `selskill report`. Nothing else runs the target, and
a step that only the Makefile has (how it finds the experiment folder for the report) once failed
after every stage had passed. Slow (minutes): `make test-round`, which CI runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
STAMP = VENV / ".selskill-installed"


@pytest.mark.slow
def test_make_round_on_the_micro_recipe_exits_0_and_ends_with_the_report(tmp_path):
    if not STAMP.exists():
        pytest.skip(f"{STAMP} missing: run the tests from the venv `make setup` builds")
    recipe = yaml.safe_load((ROOT / "recipes/micro.yaml").read_text())
    recipe.update(runs_dir=str(tmp_path / "runs"), games_dir=str(tmp_path / "games"))
    path = tmp_path / "micro.yaml"
    path.write_text(yaml.safe_dump(recipe))
    # -o: the venv counts as installed (the target would otherwise reinstall after a pyproject edit)
    cmd = ["make", "-C", str(ROOT), "-o", str(STAMP), "round", f"RECIPE={path}", "ROUND=1", f"VENV={VENV}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    exp = tmp_path / "runs" / recipe["exp"]
    report = (exp / "report.md").read_text()
    assert "round_1" in report and (exp / "report.html").is_file()
    assert (exp / "round_1" / "train" / "COMPLETED").is_file()
    assert f"wrote {exp / 'report.md'}" in done.stdout
