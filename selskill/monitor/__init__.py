"""How a run is watched while it runs: its progress messages on stderr, the `selskill` loggers
at the recipe's `log_level` (`logs`), and its wandb runs, one per stage and one for the report
(`tracking`).

Both sit below the recipe (`selskill.config` applies `log_level` and names `report_to`), so any
layer can log without importing a stage.
"""
