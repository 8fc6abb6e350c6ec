"""Typed rows: one dataclass per schema of `selskill.data.schema`, field for field, in order.

Shards hold plain dicts (what pyarrow reads and writes); every row a stage writes is built
through these, so a misspelt or forgotten column fails where the row is made rather than
as a null in the shard. `tests/test_records.py` keeps the fields equal to the schemas' names.

The episode runner returns an `Episode` (the fields the rollout and fork rows share, as
verl's agent loop returns its typed output); a stage adds what says which episode it was
(`Rollout.of_episode`, `Fork.of_episode`), so that part of a row is written in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass


class _Row:
    """`to_row` / `from_row` for a dataclass whose `turns` field, if any, holds `Turn`s."""

    def to_row(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "turns" and value is not None:
                value = [t.to_row() for t in value]
            out[f.name] = value
        return out

    @classmethod
    def from_row(cls, row: dict):
        values = {f.name: row[f.name] for f in fields(cls)}
        if values.get("turns") is not None:
            values["turns"] = [Turn.from_row(t) for t in values["turns"]]
        return cls(**values)


@dataclass
class Turn(_Row):
    """One assistant turn as the runner recorded it (the `turns` entries of rollout and fork rows)."""

    start: int
    end: int
    # recorded when the turn is generated so that the branch stage need not decode prefixes again
    decision: int
    message_index: int  # fork prefixes cut `messages` here (a message count per turn is no contract)
    text: str
    kind: str
    reason: str | None
    action: str | None
    skill: str | None
    arguments: str | None
    exec_precise: bool | None
    exec_error: str | None
    env_steps: int
    commands: list[str]
    forced: bool
    # what the policy was shown it could call: with retrieval a turn sees a few skills, and the
    # branch and fork stages must hold the invoke arm to them
    listed: list[str]


def _with_episode(cls, episode: dict, identity: dict):
    """A `cls` row of the runner's `episode` and the `identity` fields: a field neither gives, or one `cls`
    does not have, fails here (TypeError naming it)."""
    names = {f.name for f in fields(cls)}
    played = {k: v for k, v in vars(Episode.from_row(episode)).items() if k in names}
    return cls(**played, **identity)


@dataclass
class Rollout(_Row):
    rollout_id: str
    run: str
    round: int
    task_id: str
    task_type: str
    split: str
    sample_idx: int
    policy_id: str
    seed: int
    n_prompt_tokens: int
    token_ids: list[int]
    logprob: list[float]
    entropy: list[float]
    role: list[int]
    turn: list[int]
    success: bool
    env_steps: int
    n_turns: int
    n_skill_calls: int
    n_precise_calls: int
    n_malformed: int
    termination: str
    error: str | None
    turns: list[Turn]
    messages: str
    pseudo_skills: list[str]

    @classmethod
    def of_episode(cls, episode: dict, **identity) -> Rollout:
        """The rollout row of a sampled or evaluated `episode`; `identity`: which episode it is."""
        return _with_episode(cls, episode, identity)


# what says which rollout a row is; the rest of its fields are what the runner played
_WHICH_ROLLOUT = ("rollout_id", "run", "round", "task_id", "task_type", "sample_idx", "policy_id", "seed")

# One played episode as the runner records it: per-token lists, outcome, turns and messages (the
# rollout's fields, in its order, but those that say which rollout it is).
Episode = make_dataclass(
    "Episode", [(f.name, f.type) for f in fields(Rollout) if f.name not in _WHICH_ROLLOUT], bases=(_Row,)
)


@dataclass
class BranchPoint(_Row):
    branch_id: str
    rollout_id: str
    task_id: str
    task_type: str
    round: int
    turn_index: int
    token_offset: int
    pool: str
    score: float
    strategy: str
    candidate_skill: str
    original_decision: str
    source_env_steps_before: int


@dataclass
class Fork(_Row):
    fork_id: str
    branch_id: str
    rollout_id: str
    task_id: str
    task_type: str
    split: str
    round: int
    arm: str
    k: int
    seed: int
    prefix_len: int
    token_ids: list[int]
    logprob: list[float]
    entropy: list[float]
    role: list[int]
    turn: list[int]
    success: bool
    env_steps: int
    n_turns: int
    n_skill_calls: int
    n_precise_calls: int
    n_malformed: int
    termination: str
    error: str | None
    turns: list[Turn]
    messages: str
    pseudo_skills: list[str]
    env_steps_after_branch: int
    steps_after_branch: int
    malformed_after_branch: int

    @classmethod
    def of_episode(cls, episode: dict, **identity) -> Fork:
        """The fork row of a continuation `episode` (its prompt length is the source's, not kept);
        `identity`: which branch point, arm and continuation it is, and what happened after the branch."""
        return _with_episode(cls, episode, identity)


@dataclass
class Pair(_Row):
    pair_id: str
    kind: str
    task_id: str
    task_type: str
    round: int
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    chosen_role: list[int]
    rejected_role: list[int]
    chosen_turn: list[int]
    rejected_turn: list[int]
    label_reason: str
    chosen_success: bool
    rejected_success: bool
    chosen_steps: int
    rejected_steps: int
    chosen_arm: str
    rejected_arm: str
    branch_id: str
    branch_pool: str
    branch_score: float
    branch_strategy: str
    candidate_skill: str
    chosen_source: str
    rejected_source: str
    prompt_messages: str
    chosen_messages: str
    rejected_messages: str


RECORDS: dict[str, type[_Row]] = {"rollout": Rollout, "branch": BranchPoint, "fork": Fork, "pair": Pair}
