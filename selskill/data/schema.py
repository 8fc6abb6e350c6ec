"""pyarrow schemas of every stage's rows, checked on write and on read.

Token-in/token-out: rows carry the exact token ids the policy saw and produced, with one
entry per token in every per-token list. Nothing downstream re-tokenizes text (chat
templates are not prefix-stable; Qwen3 drops earlier <think> blocks).
"""

from __future__ import annotations

import pyarrow as pa

# Per-token role codes (docs/design.md, "Per-token roles").
ROLE_PROMPT = 0  # system / template scaffolding / the task's first user message
ROLE_ASSISTANT = 1
ROLE_OBSERVATION = 2
ROLE_SKILL_RETURN = 3

PAIR_KINDS = ("episode", "local")

_TURN = pa.struct(
    [
        ("start", pa.int32()),  # token offset of the assistant turn's first generated token
        ("end", pa.int32()),  # one past its last generated token (end-of-turn included)
        ("decision", pa.int32()),  # token where the decision's opening tag begins, relative to start
        ("message_index", pa.int32()),  # index of this turn's assistant message in `messages`
        ("text", pa.string()),
        ("kind", pa.string()),  # action | skill | malformed
        ("reason", pa.string()),  # why malformed
        ("action", pa.string()),
        ("skill", pa.string()),
        ("arguments", pa.string()),  # JSON
        ("exec_precise", pa.bool_()),  # skill calls: executed precisely
        ("exec_error", pa.string()),
        ("env_steps", pa.int32()),  # environment steps this turn consumed
        ("commands", pa.list_(pa.string())),  # environment commands it executed (replays the prefix)
        ("forced", pa.bool_()),  # the decision was forced (fork arms)
        ("listed", pa.list_(pa.string())),  # the skills this decision's prompt listed (retrieval_mode)
    ]
)

_PER_TOKEN = [
    ("token_ids", pa.list_(pa.int32())),
    ("logprob", pa.list_(pa.float32())),  # 0 on tokens the policy did not generate
    ("entropy", pa.list_(pa.float32())),  # full-vocabulary entropy (nats); 0 where not generated
    ("role", pa.list_(pa.int8())),
    ("turn", pa.list_(pa.int16())),  # assistant turn index a token belongs to / follows; -1 before the first
]

_EPISODE_OUTCOME = [
    ("success", pa.bool_()),
    ("env_steps", pa.int32()),
    ("n_turns", pa.int32()),
    ("n_skill_calls", pa.int32()),
    ("n_precise_calls", pa.int32()),
    ("n_malformed", pa.int32()),
    ("termination", pa.string()),
    ("error", pa.string()),
    ("turns", pa.list_(_TURN)),
    ("messages", pa.string()),  # JSON chat messages, for humans
    # task retrieval's pseudo-skills, written by the policy for the task (retrieval_pseudo_skills)
    ("pseudo_skills", pa.list_(pa.string())),
]

ROLLOUT_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("run", pa.string()),
        ("round", pa.int32()),
        ("task_id", pa.string()),
        ("task_type", pa.string()),
        ("split", pa.string()),  # the split of the task index the episode was played from
        ("sample_idx", pa.int32()),
        ("policy_id", pa.string()),
        ("seed", pa.int64()),
        ("n_prompt_tokens", pa.int32()),  # tokens of the initial prompt (system + first observation)
        *_PER_TOKEN,
        *_EPISODE_OUTCOME,
    ]
)

BRANCH_SCHEMA = pa.schema(
    [
        ("branch_id", pa.string()),
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("task_type", pa.string()),
        ("round", pa.int32()),
        ("turn_index", pa.int32()),  # assistant turn of the decision
        ("token_offset", pa.int32()),  # prefix = token_ids[:token_offset] of the source rollout
        ("pool", pa.string()),  # post_skill | ordinary
        ("score", pa.float32()),
        ("strategy", pa.string()),  # entropy | random | all_skill
        ("candidate_skill", pa.string()),
        ("original_decision", pa.string()),  # invoke | skip | malformed
        ("source_env_steps_before", pa.int32()),  # env steps the source episode took before the branch
    ]
)

FORK_SCHEMA = pa.schema(
    [
        ("fork_id", pa.string()),
        ("branch_id", pa.string()),
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("task_type", pa.string()),
        ("split", pa.string()),  # the source rollout's split (the fork replays its task)
        ("round", pa.int32()),
        ("arm", pa.string()),  # invoke | skip
        ("k", pa.int32()),
        ("seed", pa.int64()),
        ("prefix_len", pa.int32()),  # token_ids[:prefix_len] equal the source rollout's prefix
        *_PER_TOKEN,  # full sequence: prefix + continuation
        *_EPISODE_OUTCOME,
        ("env_steps_after_branch", pa.int32()),  # environment commands from the branch turn on
        ("steps_after_branch", pa.int32()),  # agent steps (assistant turns) from the branch turn on
        ("malformed_after_branch", pa.int32()),
    ]
)

PAIR_SCHEMA = pa.schema(
    [
        ("pair_id", pa.string()),
        ("kind", pa.string()),  # episode | local
        ("task_id", pa.string()),
        ("task_type", pa.string()),
        ("round", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())),  # shared prefix (identical for both sides)
        ("chosen_ids", pa.list_(pa.int32())),
        ("rejected_ids", pa.list_(pa.int32())),
        # per completion token: its role and its assistant-turn index counted from the branch
        # (0 = the branch turn; episode pairs count from the first assistant turn). Tokens
        # that are not assistant tokens carry the index of the assistant turn before them.
        ("chosen_role", pa.list_(pa.int8())),
        ("rejected_role", pa.list_(pa.int8())),
        ("chosen_turn", pa.list_(pa.int16())),
        ("rejected_turn", pa.list_(pa.int16())),
        # no loss mask: the trainer alone builds the window from role + turn (selskill.train.pairs)
        ("label_reason", pa.string()),  # success_vs_failure | success_rate | efficiency
        ("chosen_success", pa.bool_()),
        ("rejected_success", pa.bool_()),
        # agent steps (assistant turns): after the branch for local pairs, the whole episode for episode pairs
        ("chosen_steps", pa.int32()),
        ("rejected_steps", pa.int32()),
        ("chosen_arm", pa.string()),  # invoke | skip ("" for episode pairs)
        ("rejected_arm", pa.string()),
        ("branch_id", pa.string()),
        ("branch_pool", pa.string()),
        ("branch_score", pa.float32()),
        ("branch_strategy", pa.string()),
        ("candidate_skill", pa.string()),
        ("chosen_source", pa.string()),  # rollout_id / fork_id the side came from
        ("rejected_source", pa.string()),
        # JSON lists of {"role", "content"} chat messages (roles system | user | assistant | tool, the
        # episode's own), split where the token ids are: the prompt's messages end before the branch
        # turn's assistant message (episode pairs: before the first one); each side's run from that
        # message through its last assistant message (the reply to it was never tokenized)
        ("prompt_messages", pa.string()),
        ("chosen_messages", pa.string()),
        ("rejected_messages", pa.string()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "rollout": ROLLOUT_SCHEMA,
    "branch": BRANCH_SCHEMA,
    "fork": FORK_SCHEMA,
    "pair": PAIR_SCHEMA,
}

_PER_TOKEN_GROUPS = {
    "rollout": [("token_ids", "logprob", "entropy", "role", "turn")],
    "fork": [("token_ids", "logprob", "entropy", "role", "turn")],
    "pair": [
        ("chosen_ids", "chosen_role", "chosen_turn"),
        ("rejected_ids", "rejected_role", "rejected_turn"),
    ],
}


class SchemaError(ValueError):
    """Rows that do not satisfy a stage's contract."""


def validate_table(table: pa.Table, kind: str) -> None:
    """Schema equality plus the invariant no schema can state: per-token lists align."""
    schema = SCHEMAS[kind]
    if not table.schema.equals(schema, check_metadata=False):
        missing = set(schema.names) - set(table.schema.names)
        extra = set(table.schema.names) - set(schema.names)
        # a struct that gained a field (e.g. the turn records) shows up here, not as a missing column
        retyped = [
            n
            for n in schema.names
            if n in table.schema.names and table.schema.field(n).type != schema.field(n).type
        ]
        raise SchemaError(
            f"{kind} rows do not match the {kind} schema (missing: {sorted(missing)}, extra: {sorted(extra)}, "
            f"of another type: {retyped}, or the column order differs)"
        )
    import pyarrow.compute as pc

    for group in _PER_TOKEN_GROUPS.get(kind, []):
        lengths = [pc.list_value_length(table.column(c)) for c in group]
        for name, length in zip(group[1:], lengths[1:], strict=True):
            if pc.all(pc.equal(lengths[0], length)).as_py() not in (True, None):
                raise SchemaError(f"{kind} rows: {name} does not have one entry per token of {group[0]}")


def validate_columns(table: pa.Table, kind: str) -> None:
    """A projection of `kind` rows (a reader that needs a few columns): each column there, of its schema's type."""
    schema = SCHEMAS[kind]
    wrong = [
        n
        for n in table.schema.names
        if n not in schema.names or table.schema.field(n).type != schema.field(n).type
    ]
    if wrong:
        raise SchemaError(
            f"{kind} rows: columns {wrong} are not the {kind} schema's (missing or of another type)"
        )
