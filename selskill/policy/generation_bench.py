"""Generation speed on multi-turn episode prompts: the transformers backend against HF `generate`.

An agent's episode asks for one decision per turn, and each turn's prompt is the previous
turn's prompt, the decision and the environment's reply: most of a prompt was already read
one turn earlier. `HFPolicy` keeps each episode's KV cache across turns (`cache_key`) and
batches the episodes' rows; HF `generate` reads every prompt whole, one at a time or as a
left-padded batch. The three read the same prompts, greedily, with the same stop tokens, and
each reports prefill (reading the prompt) and decode (writing the answer) apart, because the
first is compute-bound and the second memory-bound: a single tokens/s figure hides which one
a change helped. The policy's figures include what the rounds need of it and `generate` does
not compute: each generated token's log-prob and the exact entropy of its distribution.

Where the episodes come from is the benchmark's business (a benchmark plays greedy episodes
and hands over `turn_prompts` of their rows); this module only needs token ids.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

from selskill.policy.base import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from selskill.data.records import Episode

Episodes = Sequence[Sequence[Sequence[int]]]  # episode -> turn -> that turn's prompt ids


@dataclass
class Figures:
    """One way of generating the episodes' turns, timed."""

    method: str
    calls: int = 0  # generate calls (batches)
    prompt_tokens: int = 0  # tokens of the prompts asked for
    prefill_tokens: int = 0  # tokens run through the model to read them (KV reuse: fewer; padding: more)
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0

    @property
    def wall_seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    def as_dict(self) -> dict:
        rate = _rate
        return {
            **asdict(self),
            "wall_seconds": round(self.wall_seconds, 3),
            "prompt_tokens_per_s": rate(self.prompt_tokens, self.prefill_seconds),
            "prefill_tokens_per_s": rate(self.prefill_tokens, self.prefill_seconds),
            "decode_tokens_per_s": rate(self.generated_tokens, self.decode_seconds),
        }

    def line(self) -> str:
        d = self.as_dict()
        return (
            f"{self.method:34} wall {self.wall_seconds:8.2f} s | prefill {self.prefill_seconds:7.2f} s, "
            f"{self.prefill_tokens} tokens run ({d['prefill_tokens_per_s']:.0f}/s), {self.prompt_tokens} prompt "
            f"tokens ({d['prompt_tokens_per_s']:.0f}/s) | decode {self.decode_seconds:7.2f} s, "
            f"{self.generated_tokens} tokens ({d['decode_tokens_per_s']:.1f}/s) | {self.calls} calls"
        )


def _rate(tokens: int, seconds: float) -> float:
    return round(tokens / seconds, 1) if seconds > 0 else 0.0


def turn_prompts(episodes: Sequence[Episode], turns: int) -> list[list[list[int]]]:
    """Each episode's first `turns` decision prompts: its tokens before each turn's answer."""
    return [[list(ep.token_ids[: t.start]) for t in ep.turns[:turns]] for ep in episodes]


def stop_token_ids(model, tokenizer) -> tuple[int, ...]:
    """The ids that end an answer: the generation config's end-of-sequence ids and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = [*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id]
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def _until_stop(tokens: Sequence[int], stop: tuple[int, ...]) -> list[int]:
    """The answer as the policy returns it: up to and including the first stop token."""
    out = []
    for tok in tokens:
        out.append(int(tok))
        if tok in stop:
            break
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_policy(policy, episodes: Episodes, params: SamplingParams) -> tuple[Figures, dict]:
    """Every turn as one batch of the episodes' rows, each episode continuing from its own KV cache."""
    policy.clear_cache()
    stats = policy.stats()
    before = (stats.prompt_tokens, stats.generated_tokens, stats.seconds, stats.prefill_seconds)
    outputs, asked, calls = {}, 0, 0
    for t in range(max(len(ep) for ep in episodes)):
        live = [e for e, ep in enumerate(episodes) if t < len(ep)]
        requests = [GenerationRequest(list(episodes[e][t]), cache_key=f"episode-{e}") for e in live]
        for e, gens in zip(live, policy.generate(requests, params), strict=True):
            outputs[e, t] = list(gens[0].token_ids)
        asked += sum(len(r.prompt_ids) for r in requests)
        calls += -(-len(requests) // policy.batch_size)
    prefill_s = stats.prefill_seconds - before[3]
    figures = Figures(
        "selskill HFPolicy (KV kept)",
        calls=calls,
        prompt_tokens=asked,
        prefill_tokens=stats.prompt_tokens - before[0],
        prefill_seconds=prefill_s,
        generated_tokens=stats.generated_tokens - before[1],
        decode_seconds=stats.seconds - before[2] - prefill_s,
    )
    policy.clear_cache()
    return figures, outputs


class _FirstToken:
    """A `generate` streamer that notes when the first answer token arrives (the end of prefill).

    `generate` hands it the prompt first, then each step's tokens, copied to the host (a sync).
    """

    def __init__(self):
        self.puts, self.at = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def _generate(model, batch: list[list[int]], config, pad_id: int) -> tuple[list[list[int]], float, float]:
    """(answers, prefill seconds, decode seconds) of one left-padded `model.generate` call."""
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    clock = _FirstToken()
    _sync(model.device)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids.to(model.device),
        attention_mask=mask.to(model.device),
        generation_config=config,
        streamer=clock,
    )
    _sync(model.device)
    end = time.perf_counter()
    first = clock.at or end
    return [row[width:].tolist() for row in out.cpu()], first - start, end - first


def time_generate(
    model, episodes: Episodes, params: SamplingParams, pad_id: int, batched: bool
) -> tuple[Figures, dict]:
    """HF `generate` on the same turns: one prompt per call, or each turn's prompts as one padded batch."""
    from transformers import GenerationConfig

    stop = tuple(params.stop_token_ids)
    config = GenerationConfig(
        do_sample=False, max_new_tokens=params.max_new_tokens, eos_token_id=list(stop), pad_token_id=pad_id
    )
    keys = [
        (e, t) for t in range(max(len(ep) for ep in episodes)) for e, ep in enumerate(episodes) if t < len(ep)
    ]
    groups: list[list[tuple[int, int]]] = []
    for key in keys:
        if batched and groups and groups[-1][0][1] == key[1]:
            groups[-1].append(key)
        else:
            groups.append([key])
    name = f"HF generate, {'batched (left pad)' if batched else 'one prompt at a time'}"
    figures, outputs = Figures(name), {}
    for group in groups:
        batch = [list(episodes[e][t]) for e, t in group]
        answers, prefill_s, decode_s = _generate(model, batch, config, pad_id)
        for key, answer in zip(group, answers, strict=True):
            outputs[key] = _until_stop(answer, stop)
        figures.calls += 1
        figures.prompt_tokens += sum(len(p) for p in batch)
        figures.prefill_tokens += len(batch) * max(len(p) for p in batch)
        figures.prefill_seconds += prefill_s
        figures.decode_seconds += decode_s
        figures.generated_tokens += sum(len(outputs[key]) for key in group)
    return figures, outputs


@torch.inference_mode()
def agreement(model, episodes: Episodes, reference: dict, other: dict) -> dict:
    """How many answers equal the reference's, and for those that do not, how close a call the first
    different token was: the gap between the two best log-probs there, under `model` fed the prompt
    and the common part alone (unpadded). A gap near 0 is a tie that floating-point order breaks."""
    differ, gaps = [], []
    for key, ref in reference.items():
        got = other[key]
        if got == ref:
            continue
        k = next(
            (i for i, (a, b) in enumerate(zip(ref, got, strict=False)) if a != b), min(len(ref), len(got))
        )
        differ.append({"episode": key[0], "turn": key[1], "first_difference": k})
        ids = torch.tensor([list(episodes[key[0]][key[1]]) + ref[:k]], device=model.device)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1).logits[0, -1]
        top2 = torch.log_softmax(logits.float(), -1).topk(2).values
        gaps.append(float(top2[0] - top2[1]))
    return {
        "answers": len(reference),
        "equal": len(reference) - len(differ),
        "differ": differ,
        "max_top2_gap_at_difference": max(gaps, default=0.0),
    }


def _agreement_line(name: str, result: dict) -> str:
    n, equal = result["answers"], result["equal"]
    line = f"greedy answers, {name} vs selskill: {equal}/{n} equal"
    if equal < n:
        line += (
            f"; {n - equal} differ, each first where the two best tokens' log-probs are within "
            f"{result['max_top2_gap_at_difference']:.2e} (a near tie that padding and kernel order break)"
        )
    return line


def bench_generation(
    policy, episodes: Episodes, max_new_tokens: int, say: Callable[[str], None], json_out: str | None = None
) -> dict:
    """The three ways on the same prompts, each figure said (`say`) as soon as it is measured."""
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(policy.policy_id, dtype=policy.model.dtype)
    stock = stock.to(policy.device).eval()
    params = SamplingParams(
        temperature=0.0,
        max_new_tokens=max_new_tokens,
        stop_token_ids=stop_token_ids(stock, policy.tokenizer),
    )
    lengths = [len(p) for ep in episodes for p in ep]
    result = {
        "model": policy.policy_id,
        "device": str(policy.device),
        "dtype": str(policy.model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "episodes": len(episodes),
        "turns": max(len(ep) for ep in episodes),
        "answers": len(lengths),
        "max_new_tokens": max_new_tokens,
        "prompt_tokens": {"mean": round(sum(lengths) / len(lengths), 1), "max": max(lengths)},
    }
    say(json.dumps(result))
    _warm_up(policy, stock, episodes[0][0], params)
    figures, outputs = {}, {}
    for name, run in (
        ("selskill", lambda: time_policy(policy, episodes, params)),
        ("hf_generate_single", lambda: time_generate(stock, episodes, params, policy.pad_id, False)),
        ("hf_generate_batched", lambda: time_generate(stock, episodes, params, policy.pad_id, True)),
    ):
        figures[name], outputs[name] = run()
        say(figures[name].line())
    result["methods"] = {name: f.as_dict() for name, f in figures.items()}
    result["agreement"] = {}
    for name in ("hf_generate_single", "hf_generate_batched"):
        result["agreement"][name] = agreement(stock, episodes, outputs["selskill"], outputs[name])
        say(_agreement_line(figures[name].method, result["agreement"][name]))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _warm_up(policy, stock, prompt: Sequence[int], params: SamplingParams) -> None:
    """One short call of each, untimed: first calls pay one-time costs (allocations, kernel choice)."""
    short = SamplingParams(temperature=0.0, max_new_tokens=2, stop_token_ids=params.stop_token_ids)
    policy.generate([GenerationRequest(list(prompt))], short)
    time_generate(stock, [[prompt]], short, policy.pad_id, batched=False)
    policy.clear_cache()
