"""Typed rows: one dataclass per stage's rows, its fields the shard's columns in order.

Each column is defined here once: its name, its Python type, and where that leaves the
width open, its Arrow type (`Int64`, `Int8`, `Int16`); `selskill.data.schema` derives the
pyarrow schemas from these fields, so a record and its schema cannot drift. Shards hold
plain dicts (what pyarrow reads and writes); every row a stage writes is built through these,
so a misspelt or forgotten column fails where the row is made rather than as a null in the
shard.

The episode runner records `Turn`s as it plays and returns an `Episode` (what was played,
`Played`, plus its split and prompt length), as verl's agent loop returns its typed output;
a stage adds what says which episode it was (`Rollout.of_episode`, `Fork.of_episode`), so
that part of a row is written in one place, and makes it a dict only to write the shard.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass
from typing import Annotated

import pyarrow as pa

# Arrow types where the Python type does not say the width (an `int` column is int32, a
# `float` one float32: `selskill.data.schema.arrow_type`)
Int64 = Annotated[int, pa.int64()]
Int8 = Annotated[int, pa.int8()]
Int16 = Annotated[int, pa.int16()]


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


class _EpisodeRow(_Row):
    """A row of one played episode: the runner's `Episode` and what says which episode it was."""

    @classmethod
    def of_episode(cls, episode: Episode, **identity):
        """The row of `episode` with the `identity` fields (which episode it is; a fork's counts
        after its branch): a field neither gives, or one the row does not have, fails here
        (TypeError naming it). What the row has no column for (a fork's prompt length, the
        source's) is left out."""
        names = {f.name for f in fields(cls)}
        played = {f.name: getattr(episode, f.name) for f in fields(episode) if f.name in names}
        return cls(**played, **identity)


def _joined(name: str, *parts: type, doc: str, base: type = _Row) -> type:
    """A row type whose columns are `parts`' fields, in order: a group of columns that several
    rows share is one dataclass, spliced where each row has it."""
    columns = [(f.name, f.type, f) for part in parts for f in fields(part)]
    # the module: where pickle (the episode host process) finds the type
    return make_dataclass(name, columns, bases=(base,), namespace={"__doc__": doc, "__module__": __name__})


@dataclass
class Turn(_Row):
    """One assistant turn as the runner recorded it (the `turns` entries of rollout and fork rows)."""

    start: int  # token offset of the assistant turn's first generated token
    end: int  # one past its last generated token (end-of-turn included)
    # token where the decision's opening tag begins, relative to start: recorded when the turn
    # is generated so that the branch stage need not decode prefixes again
    decision: int
    # index of this turn's assistant message in `messages`: fork prefixes cut `messages` here
    # (a message count per turn is no contract)
    message_index: int
    text: str
    kind: str  # action | skill | malformed
    reason: str | None  # why malformed
    action: str | None
    skill: str | None
    arguments: str | None  # JSON
    exec_precise: bool | None  # skill calls: executed precisely
    exec_error: str | None
    env_steps: int  # environment steps this turn consumed
    commands: list[str]  # environment commands it executed (replays the prefix)
    forced: bool  # the decision was forced (fork arms)
    # the skills this decision's prompt listed: with retrieval a turn sees a few skills, and the
    # branch and fork stages must hold the invoke arm to them
    listed: list[str]


@dataclass
class Played:
    """What an episode's play recorded: the columns rollout and fork rows share."""

    token_ids: list[int]
    logprob: list[float]  # 0 on tokens the policy did not generate
    entropy: list[float]  # full-vocabulary entropy (nats); 0 where not generated
    role: list[Int8]
    turn: list[Int16]  # assistant turn index a token belongs to / follows; -1 before the first
    success: bool
    env_steps: int
    n_turns: int
    n_skill_calls: int
    n_precise_calls: int
    n_malformed: int
    termination: str
    error: str | None
    turns: list[Turn]
    messages: str  # JSON chat messages, for humans
    # task retrieval's pseudo-skills, written by the policy for the task (retrieval_pseudo_skills)
    pseudo_skills: list[str]


@dataclass
class _Start:
    split: str  # the split of the task index the episode was played from
    n_prompt_tokens: int  # tokens of the initial prompt (system + first observation)


Episode = _joined("Episode", _Start, Played, doc="One played episode, as the episode runner returns it.")


@dataclass
class _WhichRollout:
    rollout_id: str
    run: str
    round: int
    task_id: str
    task_type: str
    split: str  # the split of the task index the episode was played from
    sample_idx: int
    policy_id: str
    seed: Int64
    n_prompt_tokens: int  # tokens of the initial prompt (system + first observation)


Rollout = _joined(
    "Rollout",
    _WhichRollout,
    Played,
    doc="A sampled or evaluated episode (the sample and eval stages' rows).",
    base=_EpisodeRow,
)


@dataclass
class _WhichFork:
    fork_id: str
    branch_id: str
    rollout_id: str
    task_id: str
    task_type: str
    split: str  # the source rollout's split (the fork replays its task)
    round: int
    arm: str  # invoke | skip
    k: int
    seed: Int64
    prefix_len: (
        int  # token_ids[:prefix_len] equal the source rollout's prefix (the lists: prefix + continuation)
    )


@dataclass
class _AfterBranch:
    env_steps_after_branch: int  # environment commands from the branch turn on
    steps_after_branch: int  # agent steps (assistant turns) from the branch turn on
    malformed_after_branch: int


Fork = _joined(
    "Fork",
    _WhichFork,
    Played,
    _AfterBranch,
    doc="A continuation from a branch point (the fork stage's rows).",
    base=_EpisodeRow,
)


@dataclass
class BranchPoint(_Row):
    branch_id: str
    rollout_id: str
    task_id: str
    task_type: str
    round: int
    turn_index: int  # assistant turn of the decision
    token_offset: int  # prefix = token_ids[:token_offset] of the source rollout
    pool: str  # post_skill | ordinary
    score: float
    strategy: str  # entropy | random | all_skill
    candidate_skill: str
    original_decision: str  # invoke | skip | malformed
    source_env_steps_before: int  # env steps the source episode took before the branch


@dataclass
class Pair(_Row):
    pair_id: str
    kind: str  # episode | local
    task_id: str
    task_type: str
    round: int
    prompt_ids: list[int]  # shared prefix (identical for both sides)
    chosen_ids: list[int]
    rejected_ids: list[int]
    # per completion token: its role and its assistant-turn index counted from the branch
    # (0 = the branch turn; episode pairs count from the first assistant turn). Tokens
    # that are not assistant tokens carry the index of the assistant turn before them.
    chosen_role: list[Int8]
    rejected_role: list[Int8]
    chosen_turn: list[Int16]
    rejected_turn: list[Int16]
    # no loss mask: the trainer alone builds the window from role + turn (selskill.train.pairs)
    label_reason: str  # success_vs_failure | success_rate | efficiency
    chosen_success: bool
    rejected_success: bool
    # agent steps (assistant turns): after the branch for local pairs, the whole episode for episode pairs
    chosen_steps: int
    rejected_steps: int
    chosen_arm: str  # invoke | skip ("" for episode pairs)
    rejected_arm: str
    branch_id: str
    branch_pool: str
    branch_score: float
    branch_strategy: str
    candidate_skill: str
    chosen_source: str  # rollout_id / fork_id the side came from
    rejected_source: str
    # JSON lists of {"role", "content"} chat messages (roles system | user | assistant | tool, the
    # episode's own), split where the token ids are: the prompt's messages end before the branch
    # turn's assistant message (episode pairs: before the first one); each side's run from that
    # message through its last assistant message (the reply to it was never tokenized)
    prompt_messages: str
    chosen_messages: str
    rejected_messages: str


RECORDS: dict[str, type[_Row]] = {"rollout": Rollout, "branch": BranchPoint, "fork": Fork, "pair": Pair}
