"""Golden rows: a small round-1 data pipeline writes exactly the rows recorded under tests/data/.

Refactors of the stages, the runner, the recipe, the executors or a benchmark's plumbing must
not change what a round writes. With the same recipe and seed, sample -> branch -> fork ->
label here must reproduce the recorded token ids, roles, turns, logprobs, entropies, branch
points, fork outcomes and preference pairs, on each benchmark: ALFWorld (generated games,
`tests/data/golden_rows.json`) and BFCL multi-turn (bfcl-eval's own tasks, backends and
checker, `tests/data/golden_rows_bfcl.json`). New columns are fine (only the recorded ones
are compared). Integers, strings and booleans compare exactly; logprobs, entropies and
branch scores to `FLOAT_TOL` absolute or `FLOAT_RTOL` relative, because another CPU rounds
matrix products differently, and the rounding grows with the position in a long cached
sequence (a logprob of -0.63 at token 1128 moves by 1% between two x86 CPUs, while every token
id, turn and outcome stays the same).

The policy is the conftest's tiny model, overfitted in place on one demonstration of the
benchmark (the shortest that calls a skill) for its case's `sft_steps` plain AdamW steps (a
random model writes only malformed turns, which give no branch point and no pair); the
training is part of the fixture so that nothing binary is stored, and runs in float64 so
that every CPU ends up with the same float32 weights (trained in float32, a different
rounding grows over the steps past any tolerance).

Regenerating a file is legitimate only when a change is *meant* to alter the rows (a new
sampling rule, a fixed bug in what a stage writes; such a change also bumps that stage's
CODE_VERSION) or when a recipe or policy below is changed on purpose. Then run, for the
benchmark concerned,

    SELSKILL_WRITE_GOLDEN=1 pytest tests/test_golden_rows.py -k alfworld   # golden_rows.json
    SELSKILL_WRITE_GOLDEN=1 pytest tests/test_golden_rows.py -k bfcl       # golden_rows_bfcl.json

(or `SELSKILL_WRITE_GOLDEN=some/folder` to write the files, under the same names, there),
review `git diff` of the file, and say in the commit why the rows changed. A failure after a
pure refactor is a bug in the refactor, not a reason to regenerate.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
WRITE_ENV = "SELSKILL_WRITE_GOLDEN"
FLOAT_TOL = 1e-3
FLOAT_RTOL = 5e-2
FLOAT_COLUMNS = {"logprob", "entropy", "score", "branch_score"}
SFT_LR = 1e-2

# sizes chosen so that the run has successes and failures, branch points in both pools,
# forks of both arms and pairs of both kinds, in about a minute on one CPU core (most of it
# the policy's training)
RECIPE = """\
exp: t
sample_k: 3
sample_max_tasks: 2
sample_temperature: 0.8
max_env_steps: 4
max_new_tokens: 32
concurrent_episodes: 4
policy_batch_size: 8
branch_top_post_skill: 1
branch_top_ordinary: 1
fork_k_invoke: 1
fork_k_skip: 1
seed: 4
"""
# two BFCL base tasks with the shortest ground truths (two user turns of one call each); the
# policy learns the first one's demonstration, so it wins that task sometimes and the other
# never, and forks at a lower temperature than samples so that both arms finish some calls
BFCL_RECIPE = """\
exp: t
benchmark: bfcl
bfcl_categories: base
bfcl_scenarios: "100,139"
sample_split: train
eval_splits: train
turn_doc_style: brief
turn_examples: false
turn_show_admissible: false
sample_k: 3
sample_max_tasks: 2
sample_temperature: 0.7
fork_temperature: 0.5
max_decisions: 8
max_new_tokens: 40
concurrent_episodes: 6
policy_batch_size: 8
branch_top_post_skill: 1
branch_top_ordinary: 1
fork_k_invoke: 1
fork_k_skip: 1
seed: 0
"""
STAGES = ("sample", "branch", "fork", "label")
KEYS = {"sample": "rollout_id", "branch": "branch_id", "fork": "fork_id", "label": "pair_id"}
MISSING = "<column missing>"


def _pipelines_dir() -> Path:
    """The entry points next to the `selskill` package imported (so the file can be recorded against another checkout)."""
    import selskill

    return Path(selskill.__file__).resolve().parents[1] / "pipelines"


def _run_stage(script: str, recipe: Path) -> int:
    spec = importlib.util.spec_from_file_location(f"golden_{script}", _pipelines_dir() / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main(["--config", str(recipe)])


def _alfworld_demos(recipe: Path, games: Path) -> list:
    from selskill.benchmarks.alfworld.demos import make_demos

    return make_demos(games, seed=0)


def _bfcl_demos(recipe: Path, games: Path) -> list:
    """The recipe's train tasks played by their ground truth, each opening with a memory skill call,
    rendered as the round's episodes are (the benchmark's turn format and env, from the registry)."""
    from selskill.benchmarks.bfcl.demos import build_bfcl_demos
    from selskill.benchmarks.bfcl.init_config import BfclDemoMix
    from selskill.config import load_recipe
    from selskill.registry import benchmark
    from selskill.sft.demos import DemoPrompts

    r = load_recipe(["--config", str(recipe)])
    spec = benchmark(r.run.benchmark)
    env = spec.env_factory(spec.task_index(r.run, r.sample.sample_split))()
    mix = BfclDemoMix(opening_memory=1.0, useful=0.0, reference_memory=0.0, wrong_executable=0.0)
    fmt = spec.turn_format(r.rollout, r.settings)
    return build_bfcl_demos(env, prompts=DemoPrompts(fmt, r.rollout.listing_style), mix=mix, seed=0).demos


@dataclass(frozen=True)
class Case:
    """One benchmark's golden round: its recipe, the demonstrations its policy learns from, and for how long."""

    golden: str  # file name under tests/data
    recipe: str
    demos: Callable[[Path, Path], list]  # (recipe file, generated games) -> winning demonstrations
    sft_steps: int
    needs: str | None = None  # a module the benchmark needs installed
    plays_games: bool = False  # its recipe names the generated games (games_dir)


# BFCL's demonstration is about 7k tokens (the system prompt holds the function docs), so its
# policy trains for fewer steps, about as long as ALFWorld's
CASES = {
    "alfworld": Case("golden_rows.json", RECIPE, _alfworld_demos, sft_steps=100, plays_games=True),
    "bfcl": Case("golden_rows_bfcl.json", BFCL_RECIPE, _bfcl_demos, sft_steps=60, needs="bfcl_eval"),
}


def _overfit_policy(model_dir: Path, demos: list, steps: int, out: Path) -> Path:
    """The tiny model after `steps` AdamW steps on the shortest demonstration that calls skills."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    demo = min((d for d in demos if d.n_skill_calls), key=lambda d: len(d.messages))
    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok.apply_chat_template(
        demo.messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = torch.tensor([list(enc["input_ids"])])
    labels = torch.tensor(
        [[i if m else -100 for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True)]]
    )
    torch.manual_seed(0)
    # float64: another CPU's rounding then stays far below float32's precision, so the
    # saved float32 weights (and every row sampled from them) do not depend on the machine
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    warmup = max(1, steps // 20)  # linear warm-up, then cosine decay
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    model.to(torch.float32).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


# --- canonical rows ----------------------------------------------------------------------------


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).hexdigest()[:16]


def _rle(values) -> list[list]:
    """[[value, count], ...]: roles, turns and masks are long runs."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def _floats(values) -> list[float]:
    return [round(float(v), 6) for v in values]


def _tokens(row: dict, start: int) -> dict:
    """A sequence's per-token columns from `start` on."""
    return {
        "token_ids": list(row["token_ids"][start:]),
        "logprob": _floats(row["logprob"][start:]),
        "entropy": _floats(row["entropy"][start:]),
        "role": _rle(row["role"][start:]),
        "turn": _rle(row["turn"][start:]),
    }


TURN_FIELDS = ("start", "end", "text", "kind", "reason", "action", "skill", "arguments", "exec_precise",
               "exec_error", "env_steps", "commands", "forced")  # fmt: skip
OUTCOME = ("success", "env_steps", "n_turns", "n_skill_calls", "n_precise_calls", "n_malformed", "termination",
           "error")  # fmt: skip
BRANCH = ("rollout_id", "task_id", "task_type", "round", "turn_index", "token_offset", "pool", "score",
          "strategy", "candidate_skill", "original_decision", "source_env_steps_before")  # fmt: skip
FORK = ("branch_id", "rollout_id", "task_id", "arm", "k", "seed", "prefix_len", "env_steps_after_branch",
        "steps_after_branch", "malformed_after_branch")  # fmt: skip
PAIR = ("kind", "task_id", "task_type", "round", "chosen_ids", "rejected_ids", "label_reason",
        "chosen_success", "rejected_success", "chosen_steps", "rejected_steps", "chosen_arm", "rejected_arm",
        "branch_id", "branch_pool", "branch_score", "branch_strategy", "candidate_skill", "chosen_source",
        "rejected_source")  # fmt: skip
PAIR_RUNS = ("chosen_role", "rejected_role", "chosen_turn", "rejected_turn")
# Label stored a loss mask (for n = 3, the recipe's window when the rows were recorded) and its n
# until the trainer became the one owner of the window. The masks are now the ones the trainer
# builds for n = 3 from the stored roles and turns, compared with the recorded ones; `window_n`
# is gone from the rows and not compared.
RECORDED_WINDOW_N = 3
REMOVED_COLUMNS = {"label": {"window_n"}}


def _built_masks(row: dict) -> dict:
    from selskill.train.pairs import loss_mask

    n = RECORDED_WINDOW_N if row["kind"] == "local" else None
    return {
        f"{side}_loss_mask": _rle(
            loss_mask(row[f"{side}_role"], row[f"{side}_turn"], row["kind"], n).tolist()
        )
        for side in ("chosen", "rejected")
    }


def _pick(row: dict, cols) -> dict:
    out = {c: row.get(c, MISSING) for c in cols}
    return {c: round(v, 6) if isinstance(v, float) else v for c, v in out.items()}


def _turns(row: dict) -> list[dict]:
    return [_pick(t, TURN_FIELDS) for t in row.get("turns") or []]


def _read(runs: Path, stage: str) -> list[dict]:
    import pyarrow.parquet as pq

    files = sorted((runs / "t" / "round_1" / stage / "shards").glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def canonical_rows(runs: Path) -> dict:
    """Each stage's rows by id, reduced to what must not change.

    A rollout's initial prompt (every per-token column up to `n_prompt_tokens`) is stored
    once per task under its digest; a fork's prefix is checked against its source rollout
    exactly (`prefix_is_source`) and only its continuation is stored; a pair's shared
    prompt is stored as a digest. That keeps the file small without losing a token.
    """
    out: dict = {"prompts": {}}
    sample = {}
    for r in _read(runs, "sample"):
        n = r["n_prompt_tokens"]
        head = {c: list(r[c][:n]) for c in ("token_ids", "logprob", "entropy", "role", "turn")}
        digest = _sha(head)
        out["prompts"][digest] = head["token_ids"]
        sample[r["rollout_id"]] = {
            **_pick(r, ("task_id", "task_type", "sample_idx", "seed", "n_prompt_tokens")),
            "prompt": digest,
            **_tokens(r, n),
            **_pick(r, OUTCOME),
            "turns": _turns(r),
        }
    out["sample"] = sample
    sources = {r["rollout_id"]: r for r in _read(runs, "sample")}
    out["branch"] = {r["branch_id"]: _pick(r, BRANCH) for r in _read(runs, "branch")}
    forks = {}
    for r in _read(runs, "fork"):
        p, src = r["prefix_len"], sources.get(r["rollout_id"])
        same = src is not None and all(
            list(r[c][:p]) == list(src[c][:p]) for c in ("token_ids", "logprob", "entropy", "role", "turn")
        )
        forks[r["fork_id"]] = {
            **_pick(r, FORK),
            "prefix_is_source": same,
            **_tokens(r, p),
            **_pick(r, OUTCOME),
            "turns": _turns(r),
        }
    out["fork"] = forks
    pairs = {}
    for r in _read(runs, "label"):
        pairs[r["pair_id"]] = {
            **_pick(r, PAIR),
            "prompt_ids": {"len": len(r["prompt_ids"]), "sha": _sha(list(r["prompt_ids"]))},
            **{c: _rle(r[c]) for c in PAIR_RUNS},
            **_built_masks(r),
        }
    out["label"] = pairs
    return out


def dump(golden: dict) -> str:
    """JSON with one row per line, so that a regenerated file diffs row by row."""
    lines = ["{"]
    for i, (section, value) in enumerate(sorted(golden.items())):
        comma = "," if i < len(golden) - 1 else ""
        if not isinstance(value, dict) or not value:
            lines.append(f"{json.dumps(section)}: {json.dumps(value)}{comma}")
            continue
        lines.append(f"{json.dumps(section)}: {{")
        items = sorted(value.items())
        for j, (key, row) in enumerate(items):
            sep = "," if j < len(items) - 1 else ""
            lines.append(f" {json.dumps(key)}: {json.dumps(row, sort_keys=True, separators=(',', ':'))}{sep}")
        lines.append("}" + comma)
    return "\n".join(lines + ["}"]) + "\n"


# --- comparison --------------------------------------------------------------------------------


def _first_difference(got, want, float_ok: bool, path: str = "") -> str | None:
    """Where `got` first departs from `want` (None: equal), floats within the tolerances where allowed."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in want:
            if k not in got:
                return f"{path}.{k} missing"
            d = _first_difference(got[k], want[k], float_ok, f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(want, list) and isinstance(got, list):
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            d = _first_difference(g, w, float_ok, f"{path}[{i}]")
            if d:
                return d
        if len(got) != len(want):
            return f"{path}: length {len(got)} != {len(want)}"
        return None
    if float_ok and isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        close = math.isclose(got, want, rel_tol=FLOAT_RTOL, abs_tol=FLOAT_TOL)
        return (
            None if close else f"{path}: {got!r} != {want!r} (tolerance {FLOAT_TOL}, relative {FLOAT_RTOL})"
        )
    if type(got) is not type(want) and not (isinstance(got, (int, float)) and isinstance(want, (int, float))):
        return f"{path}: {got!r} != {want!r}"
    return None if got == want else f"{path}: {got!r} != {want!r}"


def differences(got: dict, want: dict) -> list[str]:
    """One line per (stage, column): the first id (sorted) where it differs, and how."""
    problems = []
    for stage in ("prompts", *STAGES):
        g, w = got.get(stage, {}), want[stage]
        missing, extra = sorted(set(w) - set(g)), sorted(set(g) - set(w))
        if missing or extra:
            problems.append(f"{stage}: ids differ (missing {missing[:3]}, extra {extra[:3]})")
        if stage == "prompts":
            continue
        seen = set()
        for key in sorted(set(w) & set(g)):
            for col, want_value in w[key].items():
                if col in seen or col in REMOVED_COLUMNS.get(stage, ()):
                    continue
                d = _first_difference(g[key].get(col, MISSING), want_value, col in FLOAT_COLUMNS, col)
                if d:
                    seen.add(col)
                    problems.append(f"{stage}: column {col} differs first at {KEYS[stage]} {key}: {d}")
    return problems


# --- the test ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(CASES))
def golden_run(request, tmp_path_factory, small_games, tiny_model_dir):
    """(case, the canonical rows of its round)."""
    case = CASES[request.param]
    if case.needs:
        pytest.importorskip(case.needs)
    root = tmp_path_factory.mktemp(f"golden_{request.param}")
    recipe = root / "recipe.yaml"
    games = f"games_dir: {small_games}\n" if case.plays_games else ""
    recipe.write_text(
        case.recipe + f"runs_dir: {root / 'runs'}\n{games}model_name_or_path: {root / 'policy'}\n"
    )
    _overfit_policy(tiny_model_dir, case.demos(recipe, small_games), case.sft_steps, root / "policy")
    for stage in STAGES:
        assert _run_stage(stage, recipe) == 0, stage
    return case, canonical_rows(root / "runs")


def test_round_rows_equal_the_recorded_ones(golden_run):
    case, got = golden_run
    golden = DATA / case.golden
    target = os.environ.get(WRITE_ENV)
    if target:
        # a recording is only useful if every stage has rows worth comparing
        assert any(r["success"] for r in got["sample"].values()) and got["branch"] and got["fork"]
        assert {p["kind"] for p in got["label"].values()} == {"episode", "local"}, "tune the recipe: pairs"
        assert {b["pool"] for b in got["branch"].values()} == {"post_skill", "ordinary"}, "tune the recipe"
        path = golden if target == "1" else Path(target) / case.golden
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump({"recipe": case.recipe, **got}))
        pytest.skip(f"recorded {path}")
    want = json.loads(golden.read_text())
    assert want.pop("recipe") == case.recipe, (
        f"the recipe is not the one {golden.name} was recorded with: regenerate it"
    )
    problems = differences(got, want)
    assert not problems, "rows differ from the recorded ones:\n" + "\n".join(problems)
