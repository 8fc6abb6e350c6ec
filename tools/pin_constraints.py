"""Write constraints.txt: the exact version, as installed here, of every package that
`pip install -e '.[all,dev]'` pulls in (`make constraints`), and of the extras that their own
target installs (`pretrained`: `make setup-pretrained`).

The closure of pyproject.toml's requirements is walked through the installed packages'
metadata rather than taken from `pip freeze`, so that a package installed by hand (a Jupyter
front end, a model wheel) is not pinned for everyone, and nothing is downloaded. Left out: torch (the Makefile installs the
build `TORCH_SPEC` names, CPU or CUDA, before anything else), bfcl-eval (installed `--no-deps`
from `BFCL_SPEC`: pyproject.toml, extra `bfcl`) and the packaging tools, as `pip freeze` leaves
them out. A separately installed extra is pinned at the version installed here, or where this
venv lacks it, at the version the constraints file being rewritten pins.

    python tools/pin_constraints.py [--extras all,dev] [--separate pretrained] [--out constraints.txt]
    python tools/pin_constraints.py --requirements-of pretrained   # what the extra requires, one a line
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

NOT_PINNED = frozenset({"selskill", "torch", "bfcl-eval", "pip", "setuptools", "wheel"})
HEADER = """\
# Exact versions tested together (Python {py}, Linux x86_64, CPU torch from TORCH_SPEC), for
# `pip install -c constraints.txt -e '.[{extras}]'` and the extras their own targets install
# ({separate}). Regenerate with `make constraints` after changing a range in pyproject.toml.
# torch and bfcl-eval are pinned by the Makefile (TORCH_SPEC, BFCL_SPEC), not here.
"""


def project_requirements(pyproject: Path, extras: set[str]) -> list[Requirement]:
    """The project's requirements with `extras` (self-references like `selskill[train]` expanded)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    name, optional = canonicalize_name(project["name"]), project.get("optional-dependencies", {})
    pending = [Requirement(r) for r in project.get("dependencies", [])]
    todo, done, out = list(extras), set(), []
    while pending or todo:
        if pending:
            req = pending.pop()
            if canonicalize_name(req.name) == name:
                todo += req.extras
            else:
                out.append(req)
            continue
        extra = todo.pop()
        if extra in done:
            continue
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra {extra!r}; its extras: {', '.join(optional)}")
        done.add(extra)
        pending += [Requirement(r) for r in optional[extra]]
    return out


def extra_requirements(pyproject: Path, extra: str) -> list[Requirement]:
    """The requirements `extra` itself names (not the base dependencies)."""
    optional = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    if extra not in optional:
        raise SystemExit(f"pyproject.toml has no extra {extra!r}; its extras: {', '.join(optional)}")
    return [Requirement(r) for r in optional[extra]]


def read_pins(path: Path) -> dict[str, str]:
    """{canonical name: version} of a constraints file (none when it does not exist)."""
    if not path.is_file():
        return {}
    lines = (line.strip() for line in path.read_text().splitlines())
    pairs = (line.partition("==") for line in lines if line and not line.startswith("#"))
    return {canonicalize_name(name): version for name, _, version in pairs}


def installed(name: str) -> bool:
    try:
        distribution(name)
    except PackageNotFoundError:
        return False
    return True


def separate_pins(
    pyproject: Path, extras: set[str], pinned: dict[str, str], previous: dict[str, str], where: Path
) -> dict[str, str]:
    """Pins for the packages of `extras` that `pinned` lacks: what is installed here (with what it requires),
    else the previous pin; a package with neither stops, naming what installs it."""
    out: dict[str, str] = {}
    for extra in sorted(extras):
        for req in extra_requirements(pyproject, extra):
            key = canonicalize_name(req.name)
            if installed(req.name):
                out.update({k: v for k, v in closure([req]).items() if k not in pinned})
            elif key in previous:
                out[key] = previous[key]
            else:
                raise SystemExit(
                    f"{req.name} (extra {extra}) is not installed here and {where} does not pin it: install the "
                    f"extra first (make setup-{extra})"
                )
    return out


def closure(requirements: list[Requirement]) -> dict[str, str]:
    """{canonical name: installed version} of `requirements` and everything they require, markers
    evaluated for this interpreter."""
    todo = [(r.name, set(r.extras)) for r in requirements if r.marker is None or r.marker.evaluate()]
    seen: dict[str, set[str]] = {}
    versions: dict[str, str] = {}
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        if key in seen and wanted <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | wanted
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"{name} is required but not installed: run `make setup` first") from None
        versions[key] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in sorted(seen[key])] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, set(req.extras)))
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default="all,dev", help="selskill's extras to pin (comma-separated)")
    parser.add_argument(
        "--separate",
        default="pretrained",
        help="extras their own make target installs (comma-separated): pinned where installed here, else kept "
        "as --out pins them",
    )
    parser.add_argument("--out", default="constraints.txt", type=Path)
    parser.add_argument("--pyproject", default="pyproject.toml", type=Path)
    parser.add_argument(
        "--requirements-of",
        metavar="EXTRA",
        help="print EXTRA's own requirements, one a line, and write nothing",
    )
    args = parser.parse_args(argv)
    if args.requirements_of:
        print("\n".join(str(r) for r in extra_requirements(args.pyproject, args.requirements_of)))
        return 0
    extras = {e for e in args.extras.split(",") if e}
    separate = {e for e in args.separate.split(",") if e}
    pins = closure(project_requirements(args.pyproject, extras))
    pins.update(separate_pins(args.pyproject, separate, pins, read_pins(args.out), args.out))
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in NOT_PINNED]
    header = HEADER.format(
        py=py, extras=",".join(sorted(extras)), separate=",".join(sorted(separate)) or "none"
    )
    args.out.write_text(header + "\n".join(lines) + "\n")
    print(f"wrote {len(lines)} pins to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
