"""Hand-built pair and sample rows (PAIR_SCHEMA, ROLLOUT_SCHEMA) and a very small offline model for the train tests."""

from __future__ import annotations

import json

from selskill.data.schema import ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_PROMPT, ROLE_SKILL_RETURN
from selskill.policy.bootstrap import TinyArch, build_model, train_tokenizer

A, B, S, P = ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_SKILL_RETURN, ROLE_PROMPT

MICRO_ARCH = TinyArch(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=2048,
)

CORPUS = [
    "You are an agent solving a task in a text-based household environment.",
    "Your task is to: put a hot apple in fridge. You are in the middle of a room.",
    "<think>I should find the apple first.</think><action>go to countertop 1</action>",
    '<tool_call>{"name": "heat_object"}</tool_call>',
    "On the countertop 1, you see a apple 1, a knife 2, and a mug 3.",
    "You pick up the apple 1 from the countertop 1. You heat the apple 1 using the microwave 1.",
    "Nothing happens. You open the fridge 1. The fridge 1 is open. You put the apple 1 in the fridge 1.",
    "skill heat_object returned: go to microwave 1, heat apple 1 with microwave 1",
]


def micro_tokenizer():
    return train_tokenizer(CORPUS * 4, vocab_size=400)


def micro_model(tokenizer, seed: int = 0):
    return build_model(tokenizer, MICRO_ARCH, seed=seed)


def _encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def render_side(tok, messages: list[tuple[str, str]], first_turn: int = 0):
    """(ids, role, turn) of ChatML messages; `first_turn` = turn index of the first assistant message.

    An assistant message's generated tokens (content + <|im_end|>) get role 1; its header and the
    trailing newline are scaffolding of the message around it. Non-assistant tokens carry the
    index of the assistant turn before them (-1 before the first when counted from the branch).
    """
    ids, role, turn = [], [], []
    current = first_turn - 1
    for who, text in messages:
        if who == "assistant":
            current += 1
            head = _encode(tok, "<|im_start|>assistant\n")
            body = _encode(tok, text + "<|im_end|>")
            tail = _encode(tok, "\n")
            ids += head + body + tail
            role += [B] * len(head) + [A] * len(body) + [B] * len(tail)
            turn += [current - 1] * len(head) + [current] * len(body) + [current] * len(tail)
        else:
            code = {"system": P, "user": B, "skill": S}[who]
            chat_role = "user" if who == "skill" else who
            seg = _encode(tok, f"<|im_start|>{chat_role}\n{text}<|im_end|>\n")
            ids += seg
            role += [code] * len(seg)
            turn += [current] * len(seg)
    return ids, role, turn


def chat_messages(messages: list[tuple[str, str]]) -> str:
    """A pair row's JSON messages for `render_side`'s tuples: a skill's return is a `tool` message, as the
    runner writes it."""
    return json.dumps(
        [{"role": "tool" if who == "skill" else who, "content": text} for who, text in messages]
    )


def pair_row(
    tok,
    pair_id: str,
    kind: str,
    prompt: list[tuple[str, str]],
    chosen: list[tuple[str, str]],
    rejected: list[tuple[str, str]],
) -> dict:
    """A valid PAIR_SCHEMA row; the completions start with the branch turn (turn 0)."""
    prompt_ids, _, _ = render_side(tok, prompt)
    c_ids, c_role, c_turn = render_side(tok, chosen)
    r_ids, r_role, r_turn = render_side(tok, rejected)
    return {
        "pair_id": pair_id,
        "kind": kind,
        "task_id": "task-0",
        "task_type": "pick_heat_then_place_in_recep",
        "round": 1,
        "prompt_ids": prompt_ids,
        "chosen_ids": c_ids,
        "rejected_ids": r_ids,
        "chosen_role": c_role,
        "rejected_role": r_role,
        "chosen_turn": c_turn,
        "rejected_turn": r_turn,
        "label_reason": "success_vs_failure",
        "chosen_success": True,
        "rejected_success": False,
        "chosen_steps": 3,
        "rejected_steps": 9,
        "chosen_arm": "invoke" if kind == "local" else "",
        "rejected_arm": "skip" if kind == "local" else "",
        "branch_id": f"{pair_id}-b" if kind == "local" else "",
        "branch_pool": "post_skill" if kind == "local" else "",
        "branch_score": 1.5,
        "branch_strategy": "entropy" if kind == "local" else "",
        "candidate_skill": "heat_object" if kind == "local" else "",
        "chosen_source": f"{pair_id}-c",
        "rejected_source": f"{pair_id}-r",
        "prompt_messages": chat_messages(prompt),
        "chosen_messages": chat_messages(chosen),
        "rejected_messages": chat_messages(rejected),
    }


SYSTEM = ("system", CORPUS[0])
TASK = ("user", CORPUS[1])
GOOD = [
    ("assistant", CORPUS[3]),
    ("skill", CORPUS[7]),
    ("user", CORPUS[5]),
    ("assistant", "<action>go to fridge 1</action>"),
    ("user", CORPUS[6]),
    ("assistant", "<action>open fridge 1</action>"),
    ("user", "The fridge 1 is open."),
    ("assistant", "<action>put apple 1 in fridge 1</action>"),
]
BAD = [
    ("assistant", "<action>go to countertop 1</action>"),
    ("user", CORPUS[4]),
    ("assistant", "<action>look</action>"),
    ("user", "Nothing happens."),
    ("assistant", "<action>go to fridge 1</action>"),
    ("user", "Nothing happens."),
    ("assistant", "<action>look</action>"),
]


def fixture_rows(tok, n_pairs: int = 8) -> list[dict]:
    """Alternating local/episode pairs with slightly different prompts (for training runs)."""
    rows = []
    for i in range(n_pairs):
        kind = "local" if i % 2 == 0 else "episode"
        head = [SYSTEM, ("user", CORPUS[1] + f" Attempt {i}.")]
        if kind == "local":
            prompt = head + [("assistant", CORPUS[2]), ("user", CORPUS[4])]
            chosen, rejected = GOOD[: 4 + (i % 3)], BAD[: 5 + (i % 2)]
        else:
            prompt = head
            chosen, rejected = [("assistant", CORPUS[2]), ("user", CORPUS[4])] + GOOD, BAD
        rows.append(pair_row(tok, f"p{i:03d}", kind, prompt, chosen, rejected))
    return rows


def write_label_stage(
    runs_dir, exp: str, round_: int, shards: list[list[dict]], seed: int = 0, redo: bool = False
):
    """Round `round_`'s label stage as the stage writes it (through `run_rank`): each list of pair rows
    one rank's shard with its completion marker, at world size len(shards) (`redo`: over a complete one)."""
    return write_stage(runs_dir, exp, round_, "label", "pair", shards, seed, redo)


def write_stage(
    runs_dir, exp: str, round_: int, name: str, kind: str, shards: list[list[dict]], seed: int = 0,
    redo: bool = False,
):  # fmt: skip
    """Round `round_`'s stage `name` of `kind` rows as a stage writes it (`write_label_stage`'s, any stage)."""
    from selskill.config import RunConfig
    from selskill.data.inputs import StageInputs
    from selskill.data.layout import StageDir
    from selskill.data.rank_writer import run_rank

    stage = StageDir.of(runs_dir, exp, round_, name)
    for rank, rows in enumerate(shards):
        run = RunConfig(
            exp=exp, runs_dir=str(runs_dir), round=round_, rank=rank, world_size=len(shards), redo=redo
        )
        run_rank(
            stage, kind, run, StageInputs([run], seed, 1), lambda stats, rows=rows: rows, log=lambda s: None
        )
    return stage


def rollout_row(
    tok, task_id: str, sample_idx: int, turns: list[tuple[str, str]], success: bool, malformed: int = 0
) -> dict:
    """A valid ROLLOUT_SCHEMA row (a sample episode) of the system message, the task and `turns`; its
    assistant tokens are each message's content and end of turn (`render_side`)."""
    messages = [SYSTEM, TASK, *turns]
    ids, role, turn = render_side(tok, messages)
    n_turns = sum(1 for who, _ in turns if who == "assistant")
    return {
        "rollout_id": f"r1/{task_id}/{sample_idx}",
        "run": "t",
        "round": 1,
        "task_id": task_id,
        "task_type": "pick_heat_then_place_in_recep",
        "split": "train",
        "sample_idx": sample_idx,
        "policy_id": "round_0",
        "seed": 0,
        "n_prompt_tokens": len(render_side(tok, messages[:2])[0]),
        "token_ids": ids,
        "logprob": [0.0] * len(ids),
        "entropy": [0.0] * len(ids),
        "role": role,
        "turn": turn,
        "success": success,
        "env_steps": n_turns,
        "n_turns": n_turns,
        "n_skill_calls": 0,
        "n_precise_calls": 0,
        "n_malformed": malformed,
        "termination": "won" if success else "step_limit",
        "error": None,
        "turns": [],
        "messages": chat_messages(messages),
        "pseudo_skills": [],
    }
