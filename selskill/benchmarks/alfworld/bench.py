"""`selskill bench rollout`: what batching, prefix reuse and exact entropy cost or save; and
`selskill bench generation`'s episodes (`selskill.policy.generation_bench` times their turns).

Figures come from one run on one machine, so they are comparable with each other; the
numbers to quote go to docs/benchmarks.md with the command that printed them.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from selskill.policy.settings import HFSettings


def _random_tiny():
    """(tokenizer, model): an untrained tiny Qwen3 whose tokenizer knows the turn format's text."""
    from selskill.benchmarks.alfworld import load_alfworld_skills
    from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat
    from selskill.policy.bootstrap import build_model, train_tokenizer
    from selskill.skills import render_listing

    texts = [AlfworldTurnFormat(style="compact").system_text(render_listing(load_alfworld_skills()))] * 4
    tok = train_tokenizer(texts, vocab_size=1024)
    return tok, build_model(tok)


def _policy(model_dir: str | None, settings: HFSettings | None = None):
    from selskill.policy.hf import HFPolicy

    if model_dir:
        return HFPolicy(model_dir, settings), model_dir
    tok, model = _random_tiny()
    return HFPolicy("random-tiny", settings, model=model, tokenizer=tok), "random-tiny (untrained)"


def _runner(policy, index, config):
    """The episode runner of recipes/tiny.yaml's turn format, playing `index`'s games."""
    import functools

    from selskill.agent.runner import EpisodeRunner
    from selskill.benchmarks.alfworld import load_alfworld_skills
    from selskill.benchmarks.alfworld.env import AlfworldEnv, clear_engine_caches
    from selskill.benchmarks.alfworld.episode import AlfworldHooks
    from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat

    clear_engine_caches()  # every setting starts as a fresh stage process (or episode child) does
    return EpisodeRunner(
        policy,
        functools.partial(AlfworldEnv, index),  # picklable: episodes may run in a child process
        load_alfworld_skills(),
        AlfworldTurnFormat(style="compact", admissible_style="all"),
        config,
        hooks=AlfworldHooks(),
    )


def bench_episodes(
    policy, index, n_episodes: int, concurrency: int, max_env_steps: int, env_overlap: bool = True
) -> dict:
    from selskill.agent.episode_host import EpisodeSpec
    from selskill.agent.runner import RunnerConfig

    config = RunnerConfig(
        max_env_steps=max_env_steps,
        max_new_tokens=32,
        concurrent_episodes=concurrency,
        env_overlap=env_overlap,
    )
    runner = _runner(policy, index, config)
    tasks = [g.task_id for g in index.games]
    specs = [EpisodeSpec(f"b{i}", tasks[i % len(tasks)], seed=i) for i in range(n_episodes)]
    policy.clear_cache()
    before, policy_before = policy.stats().generated_tokens, policy.stats().seconds
    t0 = time.perf_counter()
    episodes = runner.run(specs)
    dt = time.perf_counter() - t0
    runner.close()
    gen = policy.stats().generated_tokens - before
    return {
        "concurrency": concurrency,
        "episodes": n_episodes,
        "seconds": round(dt, 2),
        "episodes_per_s": round(n_episodes / dt, 3),
        "generated_tokens_per_s": round(gen / dt, 1),
        # time inside the policy; the rest is the environment and the runner (or, with the
        # episode process, the part of the environment's time the policy did not hide)
        "policy_seconds": round(policy.stats().seconds - policy_before, 2),
        "episode_process": runner.overlap,
        "ragged_prefill": policy.ragged_prefill,
        "turns": sum(e.n_turns for e in episodes),
    }


def bench_env(index, games: int = 6, steps: int = 8) -> dict:
    """Engine cost alone: reset of a game not seen before, reset of a seen one, one step."""
    from selskill.benchmarks.alfworld.env import AlfworldEnv

    env = AlfworldEnv(index)
    tasks = [g.task_id for g in index.games][:games]
    env.reset(tasks[0])  # engine start-up is not a reset
    timings: dict[str, list[float]] = {"reset_new": [], "reset_seen": [], "step": []}
    for key in ("reset_new", "reset_seen"):
        for task in tasks[1:]:
            t0 = time.perf_counter()
            state = env.reset(task)
            timings[key].append(time.perf_counter() - t0)
            if key == "reset_seen":
                for command in [c for c in state.admissible_commands if c.startswith("go to ")][:steps]:
                    t0 = time.perf_counter()
                    env.step(command)
                    timings["step"].append(time.perf_counter() - t0)
    return {f"{k}_ms": round(1000 * sum(v) / len(v), 1) for k, v in timings.items() if v}


def bench_forks(policy, prefix_len: int = 800, k: int = 4, new_tokens: int = 32, repeats: int = 3) -> dict:
    from selskill.policy.base import GenerationRequest, SamplingParams

    vocab = len(policy.tokenizer)
    prefix = [(i * 7919) % (vocab - 10) + 5 for i in range(prefix_len)]
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=())
    timings = {}
    for mode in ("reuse", "recompute"):
        best = float("inf")
        for _ in range(repeats):
            policy.clear_cache()
            t0 = time.perf_counter()
            if mode == "reuse":
                policy.prefill(prefix, cache_key="p")
                reqs = [GenerationRequest(prefix + [5 + j], seed=j, cache_from="p") for j in range(k)]
            else:
                reqs = [GenerationRequest(prefix + [5 + j], seed=j) for j in range(k)]
            policy.generate(reqs, params)
            best = min(best, time.perf_counter() - t0)
        timings[mode] = round(best, 3)
    return {
        "prefix_tokens": prefix_len,
        "k": k,
        "new_tokens": new_tokens,
        "seconds": timings,
        "speedup": round(timings["recompute"] / timings["reuse"], 2),
    }


def bench_entropy(model_dir: str | None, new_tokens: int = 64, rows: int = 32) -> dict:
    from selskill.policy.base import GenerationRequest, SamplingParams

    out = {}
    for exact in (True, False):
        policy, _ = _policy(model_dir, HFSettings(exact_entropy=exact))
        prompt = [5 + (i % 50) for i in range(200)]
        params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=())
        policy.generate([GenerationRequest(prompt, seed=0)], SamplingParams(max_new_tokens=4))
        t0 = time.perf_counter()
        policy.generate([GenerationRequest(prompt, seed=i) for i in range(rows)], params)
        out["exact" if exact else "none"] = round(time.perf_counter() - t0, 3)
    out["overhead"] = round(out["exact"] / out["none"] - 1, 3)
    return out


def bench_rollout(
    model_dir: str | None = None, games_dir: str | None = None, episodes: int = 32, max_env_steps: int = 10
) -> dict:
    import torch

    from selskill.benchmarks.alfworld.env import find_games
    from selskill.benchmarks.alfworld.generate import generate_games

    if games_dir is None:
        games_dir = tempfile.mkdtemp(prefix="selskill-bench-")
        generate_games(games_dir, per_type=2, seed=0, split="valid_seen")
    index = find_games(games_dir, splits="valid_seen")
    policy, name = _policy(model_dir)
    result = {"model": name, "threads": torch.get_num_threads(), "env": bench_env(index), "episodes": []}
    for conc in (1, 16, 32):
        result["episodes"].append(bench_episodes(policy, index, episodes, conc, max_env_steps))
    seq = result["episodes"][0]["episodes_per_s"]
    result["batched_speedup"] = {
        str(e["concurrency"]): round(e["episodes_per_s"] / seq, 2) for e in result["episodes"]
    }
    # what each of the two CPU measures buys at 32 concurrent: one switched off at a time
    result["ablations_32"] = {
        "no_episode_process": bench_episodes(policy, index, episodes, 32, max_env_steps, env_overlap=False)
    }
    ragged = policy.ragged_prefill
    policy.ragged_prefill = False
    result["ablations_32"]["padded_prefill"] = bench_episodes(policy, index, episodes, 32, max_env_steps)
    policy.ragged_prefill = ragged
    result["forks"] = bench_forks(policy)
    result["entropy"] = bench_entropy(model_dir)
    return result


def main_scenes(args) -> int:
    """`selskill bench scenes`: one row of scene figures per games root (real or generated)."""
    from selskill.benchmarks.alfworld.env import find_games
    from selskill.benchmarks.alfworld.scene_stats import index_stats

    result = {}
    for root in args.dirs:
        index = find_games(root, splits=args.split)
        result[root] = index_stats(index, admissible=args.admissible, progress=not args.quiet)
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main(args) -> int:
    result = bench_rollout(args.model, args.games, args.episodes, args.max_env_steps)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def main_generation(args) -> int:
    """`selskill bench generation`: greedy episodes on ALFWorld games, their turns' prompts timed three ways
    (`selskill.policy.generation_bench`)."""
    import torch

    from selskill.agent.episode_host import EpisodeSpec
    from selskill.agent.runner import RunnerConfig
    from selskill.benchmarks.alfworld.env import find_games
    from selskill.benchmarks.alfworld.generate import generate_games
    from selskill.policy.generation_bench import bench_generation, turn_prompts
    from selskill.policy.hf import HFPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="selskill-bench-generation-") as tmp:
        model_dir = args.model
        if not model_dir:  # saved, so that HF's stock loading reads the same weights
            model_dir = f"{tmp}/random-tiny"
            for part in _random_tiny():
                part.save_pretrained(model_dir)
        games = args.games
        if not games:
            games = f"{tmp}/games"
            generate_games(games, per_type=1, seed=0, split=args.split, size="small")
        index = find_games(games, splits=args.split)
        settings = HFSettings(device=args.device, dtype=args.dtype, batch_size=args.episodes)
        policy = HFPolicy(model_dir, settings)
        print(f"playing {args.episodes} greedy episodes of {args.turns} turns on {games}", flush=True)
        config = RunnerConfig(
            max_decisions=args.turns,
            max_new_tokens=args.max_new_tokens,
            temperature=0.0,
            concurrent_episodes=args.episodes,
            env_overlap=False,
        )
        runner = _runner(policy, index, config)
        tasks = [g.task_id for g in index.games]
        rows = runner.run([EpisodeSpec(f"g{i}", tasks[i % len(tasks)], seed=i) for i in range(args.episodes)])
        runner.close()
        episodes = [turns for turns in turn_prompts(rows, args.turns) if turns]
        bench_generation(
            policy, episodes, args.max_new_tokens, lambda line: print(line, flush=True), args.json
        )
    return 0
