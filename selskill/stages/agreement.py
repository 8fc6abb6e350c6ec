"""Label agreement: does a branch point forked twice get the same label?

A local pair's direction rests on a handful of sampled continuations per arm, so one
unlucky sample can flip it. To measure how often that happens, `selskill bench
label-agreement` forks a round's branch points a second time with another fork seed and
labels them with the same recipe, then compares, per branch point, the arm each run's
label chose: invoke, skip, or none (the label dropped the point: both arms failed, a tie,
a malformed winner, ...). It reports the share of points with the same outcome, Cohen's
kappa over those three outcomes (agreement beyond what the two runs' outcome shares alone
would give), the confusion table and how often a point labelled by both runs flipped arm.

The second run is an experiment of its own, `runs/<exp>-refork-seed<S>/`, whose round
holds symbolic links to the first run's sample and branch stages and to the round it
starts from (its policy), so both runs fork exactly the same branch points with the same
policy; only its own fork and label stages are computed, by the ordinary stage table. The
fork stage seeds each continuation from the recipe-wide `seed`, which is why a different
seed changes every fork sample and nothing upstream. The first run's fork and label
stages are checked against the same recipe through the stage contract (complete ranks
with the same inputs are skipped, others refused naming the keys), so both runs fork with
the same `fork_*` keys and label with the same `label_*` keys.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence

from selskill.config import load_recipe
from selskill.data.contract import StageRefused, read_stage
from selskill.data.layout import StageDir, round_dir
from selskill.data.shards import write_json_atomic
from selskill.executors import Executor, StageFailed, make_executor
from selskill.stages.replication import link_shared
from selskill.stages.table import round_stages

logger = logging.getLogger(__name__)

OUTCOMES: tuple[str, ...] = ("invoke", "skip", "none")
SHARED = ("sample", "branch")  # what the second run links: the same branch points of the same rollouts
RESULT_FILE = "label_agreement.json"


def local_winners(pairs: Iterable[dict], branch_ids: Iterable[str]) -> dict[str, str]:
    """Per branch point, the arm its local pair chose, or "none" where the label dropped it.

    Episode pairs are ignored. A local pair of a branch point outside `branch_ids` means the
    pairs come from other branch points than the ones compared, and is refused.
    """
    out = dict.fromkeys(branch_ids, "none")
    for p in pairs:
        if p["kind"] != "local":
            continue
        if p["branch_id"] not in out:
            raise ValueError(
                f"local pair of branch point {p['branch_id']!r} is not among the branch points compared: "
                "both label runs must label the same branch stage"
            )
        if out[p["branch_id"]] != "none":
            raise ValueError(f"branch point {p['branch_id']!r} has two local pairs; a label run writes one")
        out[p["branch_id"]] = p["chosen_arm"]
    return out


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Agreement of two labellings beyond chance; None when chance alone agrees fully (one outcome only)."""
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    ca, cb = Counter(a), Counter(b)
    chance = sum(ca[k] * cb[k] for k in ca)  # in n * n
    if chance == n * n:
        return None
    expected = chance / (n * n)
    return (observed - expected) / (1 - expected)


def label_agreement(pairs_a: Iterable[dict], pairs_b: Iterable[dict], branch_ids: Iterable[str]) -> dict:
    """How two label runs of the same branch points agree on each point's winning arm.

    `pairs_a` and `pairs_b` are the pair rows of the two runs (only `kind`, `branch_id` and
    `chosen_arm` are read), `branch_ids` every branch point both runs forked: a point that
    neither run labelled counts as an agreement on "none", so it must be listed, not
    inferred from the pairs. The confusion table's rows are the first run's outcome, its
    columns the second's.
    """
    ids = sorted(set(branch_ids))
    wa, wb = local_winners(pairs_a, ids), local_winners(pairs_b, ids)
    a, b = [wa[i] for i in ids], [wb[i] for i in ids]
    n = len(ids)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    both = [(x, y) for x, y in zip(a, b, strict=True) if x != "none" and y != "none"]
    confusion = {x: dict.fromkeys(OUTCOMES, 0) for x in OUTCOMES}
    for x, y in zip(a, b, strict=True):
        confusion[x][y] += 1
    kappa = cohen_kappa(a, b)
    return {
        "branch_points": n,
        "same_outcome": same,
        "agreement": round(same / n, 4) if n else None,
        "kappa": None if kappa is None else round(kappa, 4),
        "confusion": confusion,
        "labelled_by_both": len(both),
        "same_arm_when_labelled_by_both": sum(x == y for x, y in both),
        "outcomes": {"first": dict(Counter(a)), "second": dict(Counter(b))},
    }


def format_agreement(result: dict) -> str:
    n, same, kappa = result["branch_points"], result["same_outcome"], result["kappa"]
    share = "-" if result["agreement"] is None else f"{100 * result['agreement']:.1f}%"
    lines = [
        f"label agreement, round {result['round']}: {result['exp']} (fork seed {result['fork_seed']['first']}) "
        f"vs {result['second_exp']} (fork seed {result['fork_seed']['second']}); "
        f"label_arm_rule {result['label_arm_rule']}, {result['fork_k_invoke']} invoke + "
        f"{result['fork_k_skip']} skip continuations at T={result['fork_temperature']}",
        f"  branch points: {n}; same outcome (invoke / skip / none): {same} ({share}); Cohen's kappa: "
        + ("-" if kappa is None else f"{kappa:.3f}"),
        f"  labelled by both runs: {result['labelled_by_both']}, of which the same arm: "
        f"{result['same_arm_when_labelled_by_both']}",
        "  first \\ second " + "".join(f"{o:>8}" for o in OUTCOMES),
    ]
    for x in OUTCOMES:
        lines.append(f"  {x:<15}" + "".join(f"{result['confusion'][x][y]:>8}" for y in OUTCOMES))
    return "\n".join(lines)


def second_exp(exp: str, fork_seed: int) -> str:
    """The experiment holding the second fork of `exp`'s branch points."""
    return f"{exp}-refork-seed{fork_seed}"


def run_label_agreement(
    argv: list[str], fork_seed: int | None = None, executor: Executor | None = None
) -> dict | None:
    """Fork and label the recipe's round a second time with `fork_seed` (default: the recipe's seed + 1),
    then compare both runs' labels; None when the executor only queued the stages (rerun to compare)."""
    recipe = load_recipe(argv)
    run = recipe.run
    if recipe.label.label_kinds == "episode":
        raise ValueError(
            "label_kinds is episode: the label writes no local pair, so there is no arm to agree on; "
            "pass --label_kinds both (or local)"
        )
    seed = recipe.seed + 1 if fork_seed is None else int(fork_seed)
    if seed == recipe.seed:
        raise ValueError(
            f"--fork-seed {seed} is the recipe's seed: the second fork would repeat the first sample for sample; "
            "give another seed"
        )
    other = second_exp(run.exp, seed)
    first = load_recipe([*argv, "--redo", "false"])  # checked (and completed), never recomputed
    second = load_recipe([*argv, "--exp", other, "--seed", str(seed)])
    executor = executor or make_executor(recipe)
    if recipe.run.dry_run:  # what both forks and labels would run; nothing linked, computed or written
        for each in (first, second):
            executor.run(each, round_stages(["fork", "label"]))
        return None
    link_shared(run.runs_dir, run.exp, other, SHARED, round_=run.round)
    try:
        executor.run(first, round_stages(["fork", "label"]))
    except (StageRefused, StageFailed) as exc:
        raise StageRefused(
            f"round {run.round} of {run.exp} does not match this recipe: {exc}\nThe second fork is compared with "
            "that round's, so give this command the recipe and overrides the round ran with"
        ) from None
    executor.run(second, round_stages(["fork", "label"]))
    if not executor.waits:
        print(f"the fork and label stages of {other} are queued: rerun this command once they finish")
        return None

    def table(exp: str, stage: str, kind: str):
        return read_stage(StageDir.of(run.runs_dir, exp, run.round, stage), kind, run.world_size)

    branch_ids = table(run.exp, "branch", "branch").column("branch_id").to_pylist()
    columns = ["kind", "branch_id", "chosen_arm"]
    result = label_agreement(
        table(run.exp, "label", "pair").select(columns).to_pylist(),
        table(other, "label", "pair").select(columns).to_pylist(),
        branch_ids,
    )
    result |= {
        "exp": run.exp,
        "second_exp": other,
        "round": run.round,
        "fork_seed": {"first": recipe.seed, "second": seed},
        "label_arm_rule": recipe.label.label_arm_rule,
        "fork_k_invoke": recipe.fork.fork_k_invoke,
        "fork_k_skip": recipe.fork.fork_k_skip,
        "fork_temperature": recipe.fork.fork_temperature,
    }
    out = round_dir(run.runs_dir, other, run.round) / RESULT_FILE
    write_json_atomic(result, out)
    print(format_agreement(result))
    logger.info(f"wrote {out}")
    return result
