"""Write constraints.txt: the exact version, as installed here, of every package that
`pip install -e '.[all,dev]'` pulls in (`make constraints`).

The closure of pyproject.toml's requirements is walked through the installed packages'
metadata rather than taken from `pip freeze`, so that a package installed by hand (a Jupyter
front end, a model wheel) is not pinned for everyone, and nothing is downloaded. Left out: torch (the Makefile installs the
build `TORCH_SPEC` names, CPU or CUDA, before anything else), bfcl-eval (installed `--no-deps`
from `BFCL_SPEC`: pyproject.toml, extra `bfcl`) and the packaging tools, as `pip freeze` leaves
them out.

    python tools/pin_constraints.py [--extras all,dev] [--out constraints.txt]
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
# `pip install -c constraints.txt -e '.[{extras}]'`. Regenerate with `make constraints`
# after changing a range in pyproject.toml. torch and bfcl-eval are pinned by
# the Makefile (TORCH_SPEC, BFCL_SPEC), not here.
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
    parser.add_argument("--out", default="constraints.txt", type=Path)
    parser.add_argument("--pyproject", default="pyproject.toml", type=Path)
    args = parser.parse_args(argv)
    extras = {e for e in args.extras.split(",") if e}
    pins = closure(project_requirements(args.pyproject, extras))
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in NOT_PINNED]
    args.out.write_text(HEADER.format(py=py, extras=",".join(sorted(extras))) + "\n".join(lines) + "\n")
    print(f"wrote {len(lines)} pins to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
