"""DAgger for the offline init policy: the expert labels the states the policy itself reaches.

Trained on the expert's trajectories only, the small policy meets states the expert never
visits: after its own first mistake it sees a context unlike any demonstration, and under
greedy decoding it repeats that mistake until the step limit (examples: docs/benchmarks.md,
"What shaped the init's demonstrations and SFT"). Imitation learning's standard fix is DAgger
(Ross, Gordon and Bagnell, 2011; ALFWorld's own BUTLER agent is trained with it): play the
current policy, ask the expert what it would do in the states the policy reached, and
train on the union of all data so far.

Here a label becomes a whole demonstration ("roll in with the policy, roll out with the
expert"): the policy's own turns up to a point where it disagrees with the expert are
replayed on a fresh copy of the game and kept as context (not trained), then the expert,
with the same skill-call mix as the original demonstrations, plays on from that state to
the win (trained). So one sequence teaches the correction at the point and the recovery
after it, in the format the runner gives the policy, and the skill-call habits the init
must keep stay in the data. Per rollout, the first disagreement and up to
`points - 1` random ones among the next few turns become demonstrations; rollouts without a disagreement
(the policy played as the expert would) add nothing. Continuations the expert cannot
win within a budget of its own from the point (`init_max_decisions` decisions,
`init_dagger_env_steps` commands) are dropped and counted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from selskill.agent.transcript import MALFORMED_COMMAND, after_malformed
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.demos import DemoEpisode, MixState, play_on, task_spec
from selskill.benchmarks.alfworld.env import AlfworldEnv, GameRecord
from selskill.benchmarks.alfworld.episode import NAVIGATION, AlfworldHooks
from selskill.benchmarks.alfworld.init_config import DaggerSettings, DemoBudget, DemoMix
from selskill.config.init import SftSchedule
from selskill.data.records import Episode, Turn
from selskill.envs.base import EnvError
from selskill.sft.build import fitting, init_device, sft_config, sft_train
from selskill.sft.demos import Demo, DemoPrompts, DemoSetup

DAGGER_DEMOS = "dagger_demos.jsonl"  # the relabelled demonstrations of a DAgger build (all iterations)
# the policy's episodes: a decision is one short command or call; episodes decode in batches
ROLLOUT_MAX_NEW_TOKENS = 64
ROLLOUT_EPISODES = 32


@dataclass(frozen=True)
class DaggerRun:
    """One build's DAgger: its settings, and what it keeps of the build's demonstrations (the
    prompts, the mix, the decision budget) and of its SFT (the schedule, the seed)."""

    settings: DaggerSettings
    prompts: DemoPrompts
    mix: DemoMix
    max_decisions: int
    sft: SftSchedule
    seed: int
    progress: bool = False

    @property
    def budget(self) -> DemoBudget:
        """The policy's episodes and the expert's continuations: the demonstrations' decisions,
        DAgger's own commands."""
        return DemoBudget(max_decisions=self.max_decisions, max_env_steps=self.settings.max_env_steps)


def _replay(ep: DemoEpisode, turn: Turn) -> None:
    """Apply one recorded policy turn to `ep` exactly as the episode runner applied it.

    Unlike `DemoEpisode.call`, a skill call here is context: it is not recorded among the
    demo's calls and gets no after-failure follow-up from the mix."""
    if turn.kind == "action":
        ep.act(turn.action, text=turn.text)
        return
    if turn.kind == "skill":
        arguments = json.loads(turn.arguments) if turn.arguments else None
        ep.run_call(turn.skill, text=turn.text, arguments=arguments)
    else:
        ep.messages.append(ep.fmt.assistant_message(turn.text))
        ep.state = ep.env.step(MALFORMED_COMMAND)
        ep.env_steps += ep.state.env_steps
        ep.expert.observe(MALFORMED_COMMAND, ep.state)
        ep.messages.append(after_malformed(ep.fmt, ep.state))


def disagreements(ep: DemoEpisode, turns: Sequence[Turn]) -> list[int]:
    """Replay `turns` on `ep`; the indices of the turns where the expert would have acted otherwise.

    Skill calls are never disagreements (whether to call is the mix's business, and the
    init must keep its calling habits); a malformed turn always is.
    """
    out = []
    for i, turn in enumerate(turns):
        if ep.state.won or ep.state.done:
            break
        if turn.kind != "skill":
            wanted = ep.expert.next_command()
            if wanted is not None and (turn.kind != "action" or turn.action != wanted):
                out.append(i)
        _replay(ep, turn)
    return out


def relabel_rollout(
    setup: DemoSetup,
    record: GameRecord,
    turns: Sequence[Turn],
    *,
    rng: random.Random,
    mix: DemoMix,
    budget: DemoBudget,
    points: int = 2,
    window: int = 10,
) -> tuple[list[Demo], Counter]:
    """Demonstrations that continue the policy's episode (`turns`, a rollout row's turn records)
    with the expert from the first disagreement and up to `points - 1` random later ones
    within `window` turns of it (where the policy first goes wrong and what it does next;
    later points would mostly add long roll-ins of the same loop).

    The roll-in turns are `Demo.untrained_turns`; the expert has `budget`'s decisions and
    commands of its own from the point on (the roll-in already spent the policy's). Returns
    the demonstrations and the counts of what was dropped.
    """
    spec = task_spec(record)
    dropped: Counter = Counter()
    found = disagreements(DemoEpisode(setup, record, spec, rng, mix, budget), turns)
    if not found:
        return [], dropped
    later = [i for i in found[1:] if i <= found[0] + window]
    chosen = [found[0], *sorted(rng.sample(later, min(points - 1, len(later))))] if points > 0 else []
    demos = []
    for point in chosen:
        ep = DemoEpisode(setup, record, spec, rng, mix, budget)
        done = MixState()
        for turn in turns[:point]:
            done.note(ep.expert, spec)
            _replay(ep, turn)
        ep.max_env_steps = ep.env_steps + budget.max_env_steps
        ep.max_decisions = ep.n_turns + budget.max_decisions
        demo, reason = play_on(ep, done, untrained=list(range(ep.n_turns)))
        if demo is None:
            dropped[reason] += 1
        else:
            demos.append(demo)
    return demos, dropped


def policy_rollouts(
    model_dir: str | Path,
    records: Sequence[GameRecord],
    *,
    prompts: DemoPrompts,
    budget: DemoBudget,
    dagger: DaggerSettings,
    seed: int,
    progress: bool = False,
) -> list[Episode]:
    """One episode of the policy at `model_dir` per game of `records`, in their order,
    decoded at `dagger`'s temperature and action choice, every skill of the prompts' library listed.

    The episodes run where the init's SFT trains (`init_device`): a GPU build would otherwise
    spend its DAgger iterations decoding on the CPU.
    """
    from selskill.agent.episode_host import EpisodeSpec
    from selskill.agent.runner import EpisodeRunner, RunnerConfig
    from selskill.policy.hf import HFPolicy
    from selskill.policy.settings import HFSettings

    policy = HFPolicy(str(model_dir), HFSettings(device=init_device(), batch_size=ROLLOUT_EPISODES))
    library = prompts.library or load_alfworld_skills()
    config = RunnerConfig(
        max_decisions=budget.max_decisions,
        max_env_steps=budget.max_env_steps,
        max_new_tokens=ROLLOUT_MAX_NEW_TOKENS,
        temperature=dagger.temperature,
        concurrent_episodes=ROLLOUT_EPISODES,
        listing_style=prompts.listing_style,
        action_choice=dagger.action_choice,
    )
    runner = EpisodeRunner(
        policy,
        functools.partial(AlfworldEnv, list(records)),
        library,
        prompts.fmt,
        config,
        hooks=AlfworldHooks(),
    )
    specs = [
        EpisodeSpec(
            f"dagger/{r.task_id}",
            r.task_id,
            random.Random(f"selskill-dagger:{seed}:{r.task_id}").getrandbits(62),
        )
        for r in records
    ]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(specs), desc="dagger rollouts", unit="episode")
    try:
        return runner.run(specs, progress=bar.update if bar else None)
    finally:
        runner.close()
        if bar:
            bar.close()


def dagger_demos(
    model_dir: str | Path, records: Sequence[GameRecord], run: DaggerRun, iteration: int
) -> tuple[list[Demo], dict]:
    """Play the policy on `records`, relabel its episodes with the expert; returns demos and stats."""
    seed, budget = run.seed, run.budget
    episodes = policy_rollouts(
        model_dir, records, prompts=run.prompts, budget=budget, dagger=run.settings, seed=seed + iteration,
        progress=run.progress,
    )  # fmt: skip
    setup = DemoSetup.of(AlfworldEnv(list(records)), run.prompts, load_alfworld_skills(), NAVIGATION)
    demos: list[Demo] = []
    dropped: Counter = Counter()
    iterator = zip(records, episodes, strict=True)
    if run.progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, total=len(episodes), desc="dagger relabel", unit="episode")
    for record, episode in iterator:
        rng = random.Random(f"selskill-dagger:{seed}:{iteration}:{record.task_id}")
        try:
            new, lost = relabel_rollout(
                setup, record, episode.turns, rng=rng, mix=run.mix, budget=budget,
                points=run.settings.points,
            )  # fmt: skip
        except (EnvError, OSError, ValueError, KeyError) as exc:
            new, lost = [], Counter({f"error:{type(exc).__name__}": 1})
        demos.extend(new)
        dropped.update(lost)
    stats = {
        "iteration": iteration,
        "rollouts": len(episodes),
        "rollout_success_rate": round(sum(1 for e in episodes if e.success) / max(1, len(episodes)), 4),
        "rollouts_relabelled": len({d.task_id for d in demos}),
        "demos": len(demos),
        "dropped": dict(dropped),
        "untrained_turns_mean": round(sum(len(d.untrained_turns) for d in demos) / max(1, len(demos)), 2),
    }
    return demos, stats


def run_dagger(
    model,
    tokenizer,
    base_demos: list[Demo],
    games: Callable[[int], Sequence[GameRecord]],
    work: str | Path,
    run: DaggerRun,
    *,
    prior: Sequence[Demo] = (),
    first_iteration: int = 0,
):
    """`run.settings.iterations` rounds of: play the current model on `games(iteration)`, relabel,
    SFT (assistant tokens) on the base demonstrations plus every relabelled one so far (`prior`:
    those of earlier iterations, when continuing a DAgger build). The SFT is the build's
    schedule with DAgger's own epochs and lr. Returns (model, stats per iteration, all
    relabelled demonstrations)."""

    work = Path(work)
    aggregate: list[Demo] = list(prior)
    stats = []
    settings = run.settings
    sft = dataclasses.replace(run.sft, lr=settings.lr)
    for it in range(first_iteration, first_iteration + settings.iterations):
        snapshot = work / f"dagger{it}" / "model"
        model.save_pretrained(snapshot)
        tokenizer.save_pretrained(snapshot)
        new, st = dagger_demos(snapshot, games(it), run, it)
        kept, _ = fitting(tokenizer, new, sft.max_length)
        st["too_long"] = len(new) - len(kept)
        aggregate.extend(kept)
        st["aggregate_demos"] = len(base_demos) + len(aggregate)
        args = sft_config(
            work / f"dagger{it}" / "sft",
            sft,
            epochs=settings.epochs,
            seed=run.seed + it,
            progress=run.progress,
        )
        trainer, st["sft"] = sft_train(model, tokenizer, base_demos + aggregate, args)
        model = trainer.model
        stats.append(st)
    return model, stats, aggregate


def continued_from(dagger: DaggerSettings, base_manifest: dict) -> tuple[list[Demo], int]:
    """What a DAgger build started from `dagger.base` continues: the base's relabelled demonstrations
    (they stay in the aggregate) and the iteration after its last (the base may itself continue a
    build; numbering on keeps fresh games and episode seeds new). Nothing and 0 without a base."""
    if not dagger.base:
        return [], 0
    path = Path(dagger.base).parent / DAGGER_DEMOS
    prior = [Demo(**json.loads(line)) for line in path.read_text().splitlines()] if path.is_file() else []
    base_iterations = (base_manifest.get("train") or {}).get("dagger") or []
    return prior, max((it["iteration"] for it in base_iterations), default=-1) + 1


def save_relabelled(stage_dir: Path, demos: Sequence[Demo]) -> None:
    """Every relabelled demonstration of the build, beside its manifest (what a continuation reads)."""
    tmp = stage_dir / (DAGGER_DEMOS + ".tmp")
    tmp.write_text("".join(json.dumps(d.to_dict()) + "\n" for d in demos))
    os.replace(tmp, stage_dir / DAGGER_DEMOS)


__all__ = [
    "DaggerRun",
    "DaggerSettings",
    "continued_from",
    "dagger_demos",
    "disagreements",
    "policy_rollouts",
    "relabel_rollout",
    "run_dagger",
    "save_relabelled",
]
