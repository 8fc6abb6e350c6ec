"""The train stage's wandb run: TRL's `report_to` logs into it, shaped like every other stage's.

Group `<exp>`, job type `train`, name `<exp>-round<r>-train`, files under the stage's directory
(`selskill.monitor.tracking` says why one run per stage). Its id is kept in the stage's directory, so a
resumed training logs on into the same run.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

WANDB_ID_FILE = "wandb_id"


def setup_wandb(run, cfg, stage_path: Path, is_main: bool) -> None:
    """wandb run with group=<exp>, job_type=train, like every stage's (`selskill.monitor.tracking`): online where a key
    is set, offline where none is, unless WANDB_MODE says otherwise; off when WANDB_MODE=disabled."""
    from selskill.monitor.tracking import wandb_mode, wandb_wanted

    if not wandb_wanted(cfg.report_to):
        cfg.report_to = [r for r in cfg.report_to or [] if r != "wandb"]
        return
    wandb_mode()
    os.environ.setdefault("WANDB_PROJECT", run.wandb_project)
    if not is_main:
        return
    import wandb

    id_file = stage_path / WANDB_ID_FILE
    run_id = (
        id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(8)
    )  # resumes keep the run
    id_file.write_text(run_id + "\n")
    keys = {k: v for k, v in cfg.to_dict().items() if k not in cfg._not_recipe_keys}  # the train section's
    config = json.loads(json.dumps(keys, default=str))
    wandb.init(
        project=run.wandb_project,
        group=run.exp,
        job_type="train",
        name=f"{run.exp}-round{run.round}-train",
        id=run_id,
        resume="allow",
        dir=str(stage_path),
        # the seed is the run section's key (TRL's field is not a key of the train section)
        config={"round": run.round, "exp": run.exp, **config, "seed": cfg.seed},
    )


def finish_wandb(cfg, is_main: bool) -> None:
    """End the main process's run once training wrote its outputs."""
    if "wandb" in (cfg.report_to or []) and is_main:
        import wandb

        wandb.finish()
