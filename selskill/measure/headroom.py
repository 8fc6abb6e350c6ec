"""The skills' headroom (the SelSkill paper's Appendix B): on the same held-out tasks, does a
policy do better with the skills listed than without them?

Each task is played once with the skills listed and once without (`no_skills`), and the two
outcomes, paired by task id, put it in one class:

- positive: won with the skills, lost without them (a call helped);
- negative: lost with the skills, won without them (a call hurt);
- no effect: the same outcome either way, split into both won and both lost.

`net_gain` (positive - negative share, in SR points) is the skills' net effect, SR(with) -
SR(without) on the same tasks. `oracle_gain` (the negative share) bounds what selectivity
can add to the policy with skills: a policy that kept every helpful call and skipped every
harmful one would, per task, do as well as the better of the two conditions (`oracle_sr`),
taking skipping a call to play like not seeing the skill, which the paired design assumes.

Panel B relates the effect to how well the invoked skills match the task: for each task
whose with-skills episode called at least one skill of the library, the mean BM25 score of
the task text against those skills' metadata (name and description, `skill_document`),
scored within the library (`BM25Scorer`: its IDF is the library's), averaged per class.

Greedy evaluation plays one episode per task, so each side holds one row per task id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from selskill.measure.metrics import paired_sr_difference
from selskill.skills.model import SkillLibrary
from selskill.skills.scorers import BM25Scorer, skill_document

CLASSES = ("positive", "negative", "both_won", "both_lost")
PANEL_B = ("positive", "negative", "no_effect")


def _by_task(rows: Sequence[dict], side: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in rows:
        if r["task_id"] in out:
            raise ValueError(
                f"{side}: task {r['task_id']} has more than one row; the headroom pairs one greedy episode "
                "per task and condition"
            )
        out[r["task_id"]] = r
    return out


def effect_class(with_skills: bool, without: bool) -> str:
    """The class of one task from its two outcomes (won with the skills, won without)."""
    if with_skills != without:
        return "positive" if with_skills else "negative"
    return "both_won" if with_skills else "both_lost"


def invoked_skills(row: dict) -> list[str]:
    """The distinct skills an episode called (well-formed calls naming a skill), in call order."""
    names: list[str] = []
    for t in row.get("turns") or ():
        if t.get("kind") == "skill" and t.get("skill") and t["skill"] not in names:
            names.append(t["skill"])
    return names


def _counts(classes: Iterable[str]) -> dict:
    counts = dict.fromkeys(CLASSES, 0)
    for c in classes:
        counts[c] += 1
    n = sum(counts.values())
    share = {c: counts[c] / n for c in CLASSES} if n else dict.fromkeys(CLASSES)
    out = {"tasks": n, "counts": counts, "shares": share}
    if not n:
        return out | dict.fromkeys(("sr_with", "sr_without", "net_gain", "oracle_sr", "oracle_gain"))
    return out | {
        "sr_with": share["positive"] + share["both_won"],
        "sr_without": share["negative"] + share["both_won"],
        "net_gain": share["positive"] - share["negative"],
        "oracle_sr": 1.0 - share["both_lost"],
        "oracle_gain": share["negative"],
    }


def metadata_similarity(
    rows: Sequence[dict], library: SkillLibrary, task_texts: Mapping[str, str]
) -> dict[str, float]:
    """Per task id: the mean BM25 score of its task text against the metadata of the skills its
    episode called (skills outside `library` are not scored; an episode with none is left out)."""
    names = list(library)
    if not names:  # a mode without callable skills (skills_as_context): nothing was called
        return {}
    scorer = BM25Scorer([skill_document(library[n]) for n in names])
    column = {n: i for i, n in enumerate(names)}
    out = {}
    for r in rows:
        called = [column[s] for s in invoked_skills(r) if s in column]
        if not called:
            continue
        if r["task_id"] not in task_texts:
            raise ValueError(f"no task text for {r['task_id']}, whose episode called {invoked_skills(r)}")
        scores = scorer.score(task_texts[r["task_id"]])
        out[r["task_id"]] = float(sum(scores[i] for i in called) / len(called))
    return out


def skill_headroom(
    with_skills: Sequence[dict],
    without: Sequence[dict],
    library: SkillLibrary | None = None,
    task_texts: Mapping[str, str] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict:
    """The headroom of the tasks both sides played, overall and per task type.

    `with_skills` / `without`: rows (`task_id`, `task_type`, `success`, and for Panel B
    `turns`) of the same policy with the skills listed and with none. Tasks only one side
    played are counted in `unpaired`, not classed. With `library` (the skills the listing
    offered) and `task_texts` (task id -> the task as first given), `similarity` holds Panel
    B: per effect class the tasks whose episode called a skill and their mean BM25 score.
    `net_gain_ci` is the net gain's 95% paired bootstrap interval (`n_boot` resamples of the
    tasks; none with 0).
    """
    a, b = _by_task(with_skills, "with_skills"), _by_task(without, "without")
    common = sorted(set(a) & set(b))
    classes = {t: effect_class(bool(a[t]["success"]), bool(b[t]["success"])) for t in common}
    out = _counts(classes.values())
    # the paired bootstrap of every paired SR difference (a task resampled with both its outcomes)
    paired = paired_sr_difference([b[t] for t in common], [a[t] for t in common], max(n_boot, 1), seed)
    out["net_gain_ci"] = paired["ci"] if n_boot else None
    out["unpaired"] = {"with_skills": len(set(a) - set(b)), "without": len(set(b) - set(a))}
    types: dict[str, list[str]] = defaultdict(list)
    for t in common:
        types[a[t]["task_type"]].append(classes[t])
    out["by_task_type"] = {k: _counts(v) for k, v in sorted(types.items())}
    if library is not None:
        if task_texts is None:
            raise ValueError("the BM25 view needs task_texts (task id -> task text) with the library")
        sim = metadata_similarity([a[t] for t in common], library, task_texts)
        groups: dict[str, list[float]] = {c: [] for c in PANEL_B}
        for t, s in sim.items():
            c = classes[t]
            groups[c if c in ("positive", "negative") else "no_effect"].append(s)
        out["similarity"] = {
            c: {"tasks": len(v), "mean": sum(v) / len(v) if v else None} for c, v in groups.items()
        }
    return out


def within_budget(rows: Sequence[dict], budget: int, played_budget: int | None = None) -> list[dict]:
    """Each episode's outcome had it been played with a turn budget of `budget` agent decisions.

    Valid because the budget is not shown to the policy: an episode played with a larger
    budget is, decision for decision, the episode a smaller one would have played until the
    smaller one ends it. So a task is won within `budget` iff it was won in at most `budget`
    decisions (`n_turns`), and an episode cut at `budget` keeps its first `budget` turns (the
    skills it called by then). The other budgets (environment steps, context) stay as played.
    Rows played with `played_budget` decisions (the rollout's `max_decisions`; rows do not record
    it) cannot say what a larger budget would have done: such a `budget` is refused.

    Returns outcome records (`task_id`, `task_type`, `success`, `n_turns`, `turns`,
    `termination`, and the counters `selskill.measure.metrics.compute_metrics` reads, recounted from the
    kept turns), not rollout rows: a cut episode's tokens are not recomputed.
    """
    if budget < 1:
        raise ValueError(f"budget must be at least 1 agent decision; got {budget}")
    if played_budget is not None:
        if budget > played_budget:
            raise ValueError(
                f"budget {budget} is above the {played_budget} decisions the rows were played with: an episode "
                "cut by that budget cannot say what more decisions would have done"
            )
        longer = [r["task_id"] for r in rows if int(r["n_turns"]) > played_budget]
        if longer:
            raise ValueError(
                f"{len(longer)} rows (e.g. {longer[0]}) have more than the {played_budget} decisions they were "
                "said to be played with: pass the rollout's max_decisions they were played with"
            )
    out = []
    for r in rows:
        n = int(r["n_turns"])
        cut = n > budget
        turns = list(r.get("turns") or ())[:budget]
        calls = [t for t in turns if t.get("kind") == "skill"]
        recounted = {
            "n_skill_calls": len(calls),
            "n_precise_calls": sum(bool(t.get("exec_precise")) for t in calls),
            "n_malformed": sum(t.get("kind") == "malformed" for t in turns),
        }
        # an uncut episode keeps the counters the row recorded
        counters = recounted if cut else {k: r.get(k, v) for k, v in recounted.items()}
        out.append(
            {
                "task_id": r["task_id"],
                "task_type": r["task_type"],
                "success": bool(r["success"]) and not cut,
                "n_turns": min(n, budget),
                "turns": turns,
                "termination": "step_limit" if cut else r.get("termination"),
                **counters,
            }
        )
    return out


def budget_curve(
    with_skills: Sequence[dict],
    without: Sequence[dict],
    budgets: Iterable[int],
    played_budget: int | None = None,
    **headroom_args,
) -> dict[int, dict]:
    """`skill_headroom` at each budget of `budgets` (see `within_budget`) from one pair of evals."""
    return {
        b: skill_headroom(
            within_budget(with_skills, b, played_budget),
            within_budget(without, b, played_budget),
            **headroom_args,
        )
        for b in sorted(set(budgets))
    }


def profile_by_budget(
    with_skills: Sequence[dict],
    without: Sequence[dict],
    budgets: Iterable[int],
    played_budget: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[int, dict]:
    """A policy's starting profile at each decision budget, from one pair of evals: its metrics with
    the skills listed and without them (`compute_metrics`), and the headroom between the two.

    The paper's round starts from a policy that wins without its skills and calls them too often;
    this is the table that says whether an init has that profile, and at which budget.
    """
    from selskill.measure.metrics import compute_metrics

    out = {}
    for b in sorted(set(budgets)):
        w, o = within_budget(with_skills, b, played_budget), within_budget(without, b, played_budget)
        out[b] = {
            "with_skills": compute_metrics(w, n_boot, seed),
            "without": compute_metrics(o, n_boot, seed),
            "headroom": skill_headroom(w, o, n_boot=n_boot, seed=seed),
        }
    return out


def format_profile(profile: Mapping[int, dict]) -> str:
    """`profile_by_budget` as a markdown table, one row per budget."""
    from selskill.measure.metrics import format_value

    head = (
        "| budget | SR with skills | SR without | Skill/ep | Exec. Prec. | Avg. Steps | "
        "positive | negative | both won | both lost | net (with - without) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for b, p in profile.items():
        w, o, h = p["with_skills"], p["without"], p["headroom"]
        ci = h.get("net_gain_ci")
        net = f"{100 * h['net_gain']:+.1f}" + (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else "")
        cells = [
            str(b),
            format_value("sr", w["sr"], w["ci"].get("sr")),
            format_value("sr", o["sr"], o["ci"].get("sr")),
            format_value("skill_per_ep", w["skill_per_ep"]),
            format_value("exec_prec", w["exec_prec"]),
            format_value("avg_steps", w["avg_steps"]),
            *(str(h["counts"][c]) for c in CLASSES),
            net,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
