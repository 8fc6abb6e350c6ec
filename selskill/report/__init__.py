"""The report of an experiment across rounds: `selskill report --exp runs/<exp>`.

Writes `runs/<exp>/report.md`, `runs/<exp>/report.html` (one file: its plots embedded as
base64 PNG) and `runs/<exp>/plots/*.png` with

1. held-out metrics per round (init = round 0, R1, R2, ...) and eval split, like the paper's
   Table 1 (SR, Exec. Prec., SR@Invoke, SR@Skip, Skill/ep, Avg. Steps, malformed rate) with
   95% bootstrap intervals, plus the paired SR difference vs init (same tasks) with its
   interval; SR per task type; where the eval also played without skills (`eval_headroom`),
   the skills' headroom per round (the paper's Appendix B);
2. pair yield per round from the label stage's stats: pairs/task by kind and by reason,
   invoke-preferred share of local pairs, discard reasons;
3. plots: each metric per round; per-token entropy after the branch point for the invoke
   vs skip arm of the fork continuations (the paper's Figure 3 analogue); branch scores of
   local pairs by chosen arm; skill calls per episode; chosen - rejected agent steps.

Inputs are only files every round already writes (eval/metrics.json + eval shards, label
stats + shards, fork shards). A missing round or stage is skipped with a note, never an
error. The output is deterministic: bootstraps are seeded, nothing carries a timestamp.

Every benchmark gets the same report; its words are the benchmark's (`selskill.registry.Wording`,
the benchmark read from metrics.json or a stage's config.yaml), and its steps are counted as
the benchmark counts them (`selskill.registry.step_measure`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from selskill.data.layout import round_numbers
from selskill.monitor.tracking import log_report_plots
from selskill.registry import wording_of
from selskill.report.data import exp_benchmark, load_mode_metrics, load_round, round_label
from selskill.report.render import to_html, to_markdown
from selskill.report.sections import (
    baselines_section,
    headroom_section,
    metrics_section,
    plots_section,
    yield_section,
)

__all__ = ["Report", "build_report"]


@dataclass
class Report:
    markdown: Path
    html: Path
    plots: list[Path]
    notes: list[str]


def build_report(exp_dir: str | Path, n_boot: int = 2000, seed: int = 0) -> Report:
    """Write report.md, report.html and plots/ for every round found under `exp_dir`."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        raise FileNotFoundError(
            f"no experiment directory {exp_dir}: run a round first (`selskill round --config RECIPE --round 1`) or pass --exp"
        )
    notes: list[str] = []
    rounds_found = round_numbers(exp_dir)
    benchmark = exp_benchmark(exp_dir)
    rounds = [
        load_round(exp_dir, r, notes, n_boot=1000, seed=seed, benchmark=benchmark) for r in rounds_found
    ]
    if rounds_found:
        missing = sorted(set(range(max(rounds_found) + 1)) - set(rounds_found))
        if missing:
            notes.insert(0, f"rounds {missing} have no directory under {exp_dir}")
    else:
        notes.append(f"no round_<r> directories under {exp_dir}")

    blocks: list[tuple] = [
        ("h", 1, f"SelSkill report: {exp_dir.name}"),
        (
            "p",
            f"Run directory {exp_dir}; rounds found: "
            + (", ".join(f"{round_label(r)} (round_{r})" for r in rounds_found) or "none")
            + ". Round r samples with round r−1's model; pairs are not accumulated across rounds."
            + (f" {description}" if (description := wording_of(benchmark).description) else ""),
        ),
    ]
    modes = load_mode_metrics(exp_dir, rounds_found, notes)
    body = (
        metrics_section(rounds, n_boot, seed, notes, benchmark)
        + headroom_section(rounds)
        + baselines_section(rounds, modes)
        + yield_section(rounds)
    )
    plot_blocks, plots = plots_section(rounds, exp_dir / "plots", exp_dir, notes, benchmark)
    body += plot_blocks
    if notes:
        blocks += [("h", 2, "Notes (skipped or missing)"), ("list", notes, "notes")]
    blocks += body

    md, page = exp_dir / "report.md", exp_dir / "report.html"
    for path, text in (
        (md, to_markdown(blocks)),
        (page, to_html(blocks, exp_dir, f"SelSkill report: {exp_dir.name}")),
    ):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    log_report_plots(exp_dir, plots)
    return Report(md, page, plots, notes)
