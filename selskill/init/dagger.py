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

import functools
import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from selskill.agent.transcript import MALFORMED_COMMAND, after_malformed
from selskill.agent.turn_format import TurnFormat
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.env import AlfworldEnv, GameRecord
from selskill.config.rollout import MAX_DECISIONS
from selskill.envs.base import EnvError
from selskill.init.demos import (
    Demo,
    DemoEpisode,
    DemoMix,
    MixState,
    play_on,
    task_spec,
)
from selskill.init.sft import demo_token_lengths, init_device, sft_config, sft_train
from selskill.skills import SkillExecutor, render_listing

DAGGER_DEMOS = "dagger_demos.jsonl"  # the relabelled demonstrations of a DAgger build (all iterations)


@dataclass(frozen=True)
class DaggerSettings:
    """DAgger after the SFT (`run_dagger`); `iterations=0` turns it off."""

    iterations: int = 0
    epochs: float = 2.0
    lr: float = 1e-3
    points: int = 2
    max_env_steps: int = 30
    temperature: float = 0.0
    base: str = ""  # an existing init model (same settings, DAgger off) to start from
    fresh_games: bool = False  # iteration i plays new generated train games, not the SFT's
    # the rollouts' decoding (the recipe's `action_choice`): DAgger relabels the states the policy
    # reaches as the rounds will sample it, so it decodes the same way
    action_choice: str = "free"

    def __post_init__(self):
        if self.iterations < 0 or self.points < 1 or self.epochs <= 0 or self.max_env_steps < 1:
            raise ValueError(
                f"DAgger settings out of range: {self} (init_dagger_iters >= 0, init_dagger_points >= 1, "
                "init_dagger_epochs > 0, init_dagger_env_steps >= 1)"
            )
        if self.base and not self.iterations:
            raise ValueError("init_dagger_from is set but init_dagger_iters is 0: set init_dagger_iters >= 1")


def _replay(ep: DemoEpisode, turn: dict) -> None:
    """Apply one recorded policy turn to `ep` exactly as the episode runner applied it.

    Unlike `DemoEpisode.call`, a skill call here is context: it is not recorded among the
    demo's calls and gets no after-failure follow-up from the mix."""
    kind = turn["kind"]
    if kind == "action":
        ep.act(turn["action"], text=turn["text"])
        return
    if kind == "skill":
        arguments = json.loads(turn["arguments"]) if turn.get("arguments") else None
        ep.run_call(turn["skill"], text=turn["text"], arguments=arguments)
    else:
        ep.messages.append(ep.fmt.assistant_message(turn["text"]))
        ep.state = ep.env.step(MALFORMED_COMMAND)
        ep.env_steps += ep.state.env_steps
        ep.expert.observe(MALFORMED_COMMAND, ep.state)
        ep.messages.append(after_malformed(ep.fmt, ep.state))


def disagreements(ep: DemoEpisode, turns: Sequence[dict]) -> list[int]:
    """Replay `turns` on `ep`; the indices of the turns where the expert would have acted otherwise.

    Skill calls are never disagreements (whether to call is the mix's business, and the
    init must keep its calling habits); a malformed turn always is.
    """
    out = []
    for i, turn in enumerate(turns):
        if ep.state.won or ep.state.done:
            break
        if turn["kind"] != "skill":
            wanted = ep.expert.next_command()
            if wanted is not None and (turn["kind"] != "action" or turn["action"] != wanted):
                out.append(i)
        _replay(ep, turn)
    return out


def relabel_rollout(
    env,
    executor: SkillExecutor,
    fmt: TurnFormat,
    listing: str,
    record: GameRecord,
    turns: Sequence[dict],
    *,
    rng: random.Random,
    mix: DemoMix,
    max_env_steps: int,
    max_decisions: int = MAX_DECISIONS,
    points: int = 2,
    window: int = 10,
) -> tuple[list[Demo], Counter]:
    """Demonstrations that continue the policy's episode (`turns`, a rollout row's turn records)
    with the expert from the first disagreement and up to `points - 1` random later ones
    within `window` turns of it (where the policy first goes wrong and what it does next;
    later points would mostly add long roll-ins of the same loop).

    The roll-in turns are `Demo.untrained_turns`; the expert has `max_decisions` decisions and
    `max_env_steps` commands of its own from the point on (the roll-in already spent the
    policy's). Returns the demonstrations and the counts of what was dropped.
    """
    spec = task_spec(record)
    dropped: Counter = Counter()
    probe = DemoEpisode(env, executor, fmt, listing, record, spec, rng, mix, max_env_steps)
    found = disagreements(probe, turns)
    if not found:
        return [], dropped
    later = [i for i in found[1:] if i <= found[0] + window]
    chosen = [found[0], *sorted(rng.sample(later, min(points - 1, len(later))))] if points > 0 else []
    demos = []
    for point in chosen:
        ep = DemoEpisode(env, executor, fmt, listing, record, spec, rng, mix, max_env_steps)
        done = MixState()
        for turn in turns[:point]:
            done.note(ep.expert, spec)
            _replay(ep, turn)
        ep.max_env_steps = ep.env_steps + max_env_steps
        ep.max_decisions = ep.n_turns + max_decisions
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
    fmt: TurnFormat,
    listing_style: str,
    seed: int,
    max_env_steps: int,
    max_decisions: int = MAX_DECISIONS,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    concurrent_episodes: int = 32,
    action_choice: str = "free",
    progress: bool = False,
) -> list[dict]:
    """One episode of the policy at `model_dir` per game (rows as the episode runner writes them).

    The episodes run where the init's SFT trains (`init_device`): a GPU build would otherwise
    spend its DAgger iterations decoding on the CPU.
    """
    from selskill.agent.runner import EpisodeRunner, EpisodeSpec, RunnerConfig
    from selskill.policy.hf import HFPolicy
    from selskill.policy.settings import HFSettings

    policy = HFPolicy(str(model_dir), HFSettings(device=init_device(), batch_size=concurrent_episodes))
    library = load_alfworld_skills()
    config = RunnerConfig(
        max_decisions=max_decisions,
        max_env_steps=max_env_steps,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        concurrent_episodes=concurrent_episodes,
        listing_style=listing_style,
        action_choice=action_choice,
    )
    runner = EpisodeRunner(policy, functools.partial(AlfworldEnv, list(records)), library, fmt, config)
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
        rows = runner.run(specs, progress=bar.update if bar else None)
    finally:
        runner.close()
        if bar:
            bar.close()
    return [{"task_id": spec.task_id, **row} for spec, row in zip(specs, rows, strict=True)]


def dagger_demos(
    model_dir: str | Path,
    records: Sequence[GameRecord],
    *,
    fmt: TurnFormat,
    listing_style: str,
    mix: DemoMix,
    seed: int,
    iteration: int,
    max_env_steps: int,
    max_decisions: int = MAX_DECISIONS,
    points: int = 2,
    temperature: float = 0.0,
    concurrent_episodes: int = 32,
    action_choice: str = "free",
    progress: bool = False,
) -> tuple[list[Demo], dict]:
    """Play the policy on `records`, relabel its episodes with the expert; returns demos and stats."""
    rows = policy_rollouts(
        model_dir,
        records,
        fmt=fmt,
        listing_style=listing_style,
        seed=seed + iteration,
        max_env_steps=max_env_steps,
        max_decisions=max_decisions,
        temperature=temperature,
        concurrent_episodes=concurrent_episodes,
        action_choice=action_choice,
        progress=progress,
    )
    by_id = {r.task_id: r for r in records}
    library = load_alfworld_skills()
    executor = SkillExecutor(library)
    listing = render_listing(library, style=listing_style)
    env = AlfworldEnv(list(records))
    demos: list[Demo] = []
    dropped: Counter = Counter()
    iterator = rows
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(rows, desc="dagger relabel", unit="episode")
    for row in iterator:
        rng = random.Random(f"selskill-dagger:{seed}:{iteration}:{row['task_id']}")
        try:
            new, lost = relabel_rollout(
                env, executor, fmt, listing, by_id[row["task_id"]], row["turns"],
                rng=rng, mix=mix, max_env_steps=max_env_steps, max_decisions=max_decisions, points=points,
            )  # fmt: skip
        except (EnvError, OSError, ValueError, KeyError) as exc:
            new, lost = [], Counter({f"error:{type(exc).__name__}": 1})
        demos.extend(new)
        dropped.update(lost)
    stats = {
        "iteration": iteration,
        "rollouts": len(rows),
        "rollout_success_rate": round(sum(1 for r in rows if r["success"]) / max(1, len(rows)), 4),
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
    settings: DaggerSettings,
    *,
    fmt: TurnFormat,
    listing_style: str,
    mix: DemoMix,
    sft: dict,
    prior: Sequence[Demo] = (),
    first_iteration: int = 0,
    max_decisions: int = MAX_DECISIONS,
):
    """`settings.iterations` rounds of: play the current model on `games(iteration)`, relabel, SFT
    (assistant tokens) on the base demonstrations plus every relabelled one so far (`prior`:
    those of earlier iterations, when continuing a DAgger build). `sft` holds the init's
    `sft_config` arguments (its seed, batch size, max_length, ...); DAgger's own epochs and lr
    replace the init's. `max_decisions` is the demonstrations' decision budget: the policy's
    episodes play under it and the expert's continuations get as many decisions of their own.
    Returns (model, stats per iteration, all relabelled demonstrations)."""

    work = Path(work)
    aggregate: list[Demo] = list(prior)
    stats = []
    seed, progress = sft["seed"], sft.get("progress", True)
    for it in range(first_iteration, first_iteration + settings.iterations):
        snapshot = work / f"dagger{it}" / "model"
        model.save_pretrained(snapshot)
        tokenizer.save_pretrained(snapshot)
        records = games(it)
        new, st = dagger_demos(
            snapshot, records, fmt=fmt, listing_style=listing_style, mix=mix, seed=seed, iteration=it,
            max_env_steps=settings.max_env_steps, max_decisions=max_decisions, points=settings.points,
            temperature=settings.temperature, action_choice=settings.action_choice, progress=progress,
        )  # fmt: skip
        lengths = demo_token_lengths(tokenizer, new)
        kept = [d for d, n in zip(new, lengths, strict=True) if n <= sft["max_length"]]
        st["too_long"] = len(new) - len(kept)
        aggregate.extend(kept)
        st["aggregate_demos"] = len(base_demos) + len(aggregate)
        args = sft_config(
            work / f"dagger{it}" / "sft",
            **{**sft, "seed": seed + it, "lr": settings.lr},
            epochs=settings.epochs,
        )
        trainer, st["sft"] = sft_train(model, tokenizer, base_demos + aggregate, args)
        model = trainer.model
        stats.append(st)
    return model, stats, aggregate


__all__ = ["dagger_demos", "disagreements", "policy_rollouts", "relabel_rollout", "run_dagger"]
