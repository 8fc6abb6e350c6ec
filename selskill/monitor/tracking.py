"""wandb for everything but training: one run per stage of a round, and one for the report.

The train stage logs through TRL's `report_to` into its own run (project `wandb_project`,
group `<exp>`, job type `train`, directory `round_<r>/train/`). Every other stage gets a run
of the same shape (job type = the stage, name `<exp>-round<r>-<stage>`, files under the
stage's directory), and the report one with job type `report`: an experiment is one wandb
group whatever process computed which part. One run per stage rather than one per round
because a round's stages run in different processes, on different machines under Slurm or
Ray, while an offline run is a file written by one process; a run per stage is written
whole by the process that sees the stage complete.

The recipe's `report_to` decides for all of them (wandb in it: log; `none`: nothing), and
`WANDB_MODE=disabled` turns wandb off as TRL's integration does. Where WANDB_MODE is not set,
wandb is online when a key is set (WANDB_API_KEY, or the netrc entry `wandb login` writes) and
offline otherwise, so a machine without an account never waits on a login prompt
(`wandb sync <dir>/wandb/offline-run-*` uploads later). wandb is an optional dependency:
without it a line says so and the stages run on.

A stage's run is logged once per content: `<dir>/wandb/logged.json` records the key of what
was logged (the stage's completion markers), so a rerun that skips every rank logs nothing
and a recomputed stage logs again. The run id is derived from that key, so two processes
that both see the stage complete at once write the same run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from selskill.data.shards import write_json_atomic

logger = logging.getLogger(__name__)

LOGGED = "logged.json"
_missing_said = False


def wandb_wanted(report_to) -> bool:
    """Whether a recipe's `report_to` (TRL's: a list once parsed, or a string) asks for wandb and
    WANDB_MODE does not switch it off."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "wandb" not in names and "all" not in names:
        return False
    return os.environ.get("WANDB_MODE", "").lower() != "disabled"


def wandb_key_set() -> bool:
    """Whether wandb has an API key here: WANDB_API_KEY, or a netrc entry for its host (WANDB_BASE_URL's,
    api.wandb.ai by default), in the file wandb reads ($NETRC, else ~/.netrc or ~/_netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlsplit

    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    found = [Path(p).expanduser() for p in ("~/.netrc", "~/_netrc") if Path(p).expanduser().is_file()]
    path = Path(os.environ["NETRC"]).expanduser() if os.environ.get("NETRC") else next(iter(found), None)
    if not host or path is None:
        return False
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode() -> str:
    """WANDB_MODE as the user set it; else `online` where a key is set and `offline` where none is (set for
    this process and those it starts, so that every process of a run logs the same way)."""
    if not os.environ.get("WANDB_MODE"):
        os.environ["WANDB_MODE"] = "online" if wandb_key_set() else "offline"
    return os.environ["WANDB_MODE"]


def import_wandb():
    """The wandb module, or None with one line (per process) saying how to install it."""
    global _missing_said
    try:
        import wandb
    except ImportError:
        if not _missing_said:
            logger.warning(
                "report_to includes wandb but wandb is not installed: pip install 'selskill[wandb]' "
                "(or set report_to: none); stage metrics are not sent to wandb"
            )
            _missing_said = True
        return None
    return wandb


def flatten(metrics: Mapping, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a/b": 1}: the slash-separated keys wandb groups into sections."""
    out = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        elif value is not None:
            out[name] = value
    return out


def logged_key(directory: str | Path) -> str | None:
    """The key of what was last logged from `directory` (None: nothing)."""
    path = Path(directory) / "wandb" / LOGGED
    try:
        return json.loads(path.read_text()).get("key")
    except (OSError, ValueError, AttributeError):
        return None


def logged_project(directory: str | Path) -> str | None:
    """The wandb project of the first run logged from a directory below `directory` (None: none was)."""
    for path in sorted(Path(directory).glob(f"**/wandb/{LOGGED}")):
        try:
            project = json.loads(path.read_text()).get("project")
        except (OSError, ValueError, AttributeError):
            continue
        if project:
            return project
    return None


def log_run(
    directory: str | Path,
    *,
    key: str,
    project: str,
    group: str,
    job_type: str,
    name: str,
    metrics: Mapping,
    config: Mapping | None = None,
    images: Mapping[str, str | Path] | None = None,
) -> bool:
    """Log `metrics` (and `images`, by key) as one step of a wandb run whose files go to `directory`/wandb;
    False when content `key` was logged from there already, wandb is missing or it failed (said on a line).

    A failure never fails the caller: what is logged is read from files the stage keeps.
    """
    directory = Path(directory)
    if logged_key(directory) == key:
        return False
    wandb = import_wandb()
    if wandb is None:
        return False
    mode = wandb_mode()
    run_id = hashlib.sha256("\x1f".join((project, group, name, key)).encode()).hexdigest()[:16]
    try:
        (directory / "wandb").mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=project,
            group=group,
            job_type=job_type,
            name=name,
            id=run_id,
            resume="allow",
            dir=str(directory),
            config=dict(config or {}),
            reinit="create_new",  # beside a run this process has open (TRL's), not instead of it
            settings=wandb.Settings(
                console="off", silent=True, x_disable_stats=True, save_code=False, disable_git=True
            ),
        )
        try:
            step = dict(metrics)
            step.update({k: wandb.Image(str(p)) for k, p in (images or {}).items()})
            run.log(step)
        finally:
            run.finish()
    except Exception as exc:  # noqa: BLE001 - wandb's own errors vary by version and mode
        logger.warning(f"wandb: could not log {name} ({type(exc).__name__}: {exc}); its files are kept")
        return False
    record = {"key": key, "project": project, "group": group, "name": name, "run_id": run_id, "mode": mode}
    write_json_atomic(record, directory / "wandb" / LOGGED)
    where = f"{directory / 'wandb'} (offline; `wandb sync` uploads it)" if mode == "offline" else project
    logger.info(f"wandb: logged {name} to {where}")
    return True


def log_report_plots(exp_dir: str | Path, plots: list[Path]) -> bool:
    """The report's plots as wandb images (`report/<plot>`), in the experiment's group, when its stages
    logged to wandb (the recipe's `report_to`; the report itself reads no recipe) and WANDB_MODE allows."""
    exp_dir = Path(exp_dir)
    project = logged_project(exp_dir)
    if not plots or project is None or os.environ.get("WANDB_MODE", "").lower() == "disabled":
        return False
    h = hashlib.sha256()
    for p in sorted(plots):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return log_run(
        exp_dir,
        key=h.hexdigest()[:16],
        project=project,
        group=exp_dir.name,
        job_type="report",
        name=f"{exp_dir.name}-report",
        metrics={},
        images={f"report/{p.stem}": p for p in plots},
    )
