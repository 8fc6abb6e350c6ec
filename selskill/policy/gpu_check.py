"""`selskill bench policy-gpu`: the transformers backend on a CUDA device, checked and timed.

What the CPU tests cannot show: that on a GPU (and in bf16) sampled log-probs and entropies
still equal the teacher-forced ones, that a request's tokens do not depend on what else is in
its batch, that reusing a turn's KV cache changes nothing, and what batching and fork prefix
reuse buy. Figures go to docs/benchmarks.md with the command that printed them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from selskill.policy.base import GenerationRequest as Request
from selskill.policy.base import SamplingParams

TEXTS = [
    "<|im_start|>user\nYou arrive at desk 1. On the desk 1, you see a mug 1.<|im_end|>\n<action>go to desk 1</action>"
] * 50


def _ids(tok, n: int, step: int) -> list[int]:
    """`n` deterministic token ids spread over the vocabulary, special tokens left out."""
    return [5 + (i * step) % (len(tok) - 10) for i in range(n)]


def exactness(pol, tok) -> dict:
    """Batch independence, sampled vs teacher-forced log-probs and entropies, and turn KV reuse."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    p1, p2 = _ids(tok, 300, 37), _ids(tok, 500, 11)
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, stop_token_ids=(eos,))
    a = pol.generate([Request(p1, seed=1), Request(p2, seed=2, n=3)], sp)
    b = pol.generate([Request(p2, seed=2, n=3)], sp)
    r = {"batch_independent": [g.token_ids for g in a[1]] == [g.token_ids for g in b[0]]}
    diffs_lp, diffs_h = [], []
    for g, p in [(a[0][0], p1)] + [(x, p2) for x in a[1]]:
        lp, h = pol.score(p, g.token_ids)
        diffs_lp += [abs(x - y) for x, y in zip(lp, g.logprobs, strict=True)]
        diffs_h += [abs(x - y) for x, y in zip(h, g.entropies, strict=True)]
    r["max_logprob_diff_vs_teacher_forced"] = max(diffs_lp)
    r["max_entropy_diff_vs_teacher_forced"] = max(diffs_h)
    pol.clear_cache()
    t1 = pol.generate([Request(p1, seed=5, cache_key="ep")], sp)[0][0]
    nxt = p1 + t1.token_ids + [7, 8, 9, 10]
    c = pol.generate([Request(nxt, seed=6, cache_key="ep")], sp)[0][0]
    pol.clear_cache()
    d = pol.generate([Request(nxt, seed=6)], sp)[0][0]
    r["turn_reuse_same_tokens"] = c.token_ids == d.token_ids
    r["turn_reuse_max_lp_diff"] = (
        max(abs(x - y) for x, y in zip(c.logprobs, d.logprobs, strict=True))
        if c.token_ids == d.token_ids
        else None
    )
    return r


def speed(pol, tok) -> dict:
    """Decode tokens/s by batch size at a 1500-token context, and a K=4 fork with vs without prefix reuse."""
    import torch

    prompt = _ids(tok, 1500, 13)
    sp = SamplingParams(temperature=1.0, max_new_tokens=64, stop_token_ids=())
    by_batch = {}
    for bs in (1, 16, 32, 64):
        pol.clear_cache()
        torch.cuda.synchronize()
        t = time.perf_counter()
        pol.generate([Request(prompt + [i], seed=i) for i in range(bs)], sp)
        torch.cuda.synchronize()
        by_batch[bs] = round(bs * 64 / (time.perf_counter() - t), 1)
    forks = {}
    for mode in ("reuse", "recompute"):
        best = 1e9
        for _ in range(3):
            pol.clear_cache()
            torch.cuda.synchronize()
            t = time.perf_counter()
            if mode == "reuse":
                pol.prefill(prompt, cache_key="p")
                reqs = [Request(prompt + [5 + j], seed=j, cache_from="p") for j in range(4)]
            else:
                reqs = [Request(prompt + [5 + j], seed=j) for j in range(4)]
            pol.generate(reqs, SamplingParams(temperature=1.0, max_new_tokens=32, stop_token_ids=()))
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        forks[mode] = round(best, 4)
    return {"tokens_per_s_by_batch_ctx1500": by_batch, "fork_k4_prefix1500": forks}


def gpu_check(out: str | None = None) -> dict:
    """Both checks on an untrained tiny model in fp32 and a 100M-parameter one in bf16; one JSON line
    per model as it finishes, and all of it to `out` when given."""
    import torch

    from selskill.policy.bootstrap import TinyArch, build_model, train_tokenizer
    from selskill.policy.hf import HFPolicy
    from selskill.policy.settings import HFSettings

    if not torch.cuda.is_available():
        raise ValueError("selskill bench policy-gpu needs a CUDA device; this machine has none")
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    tok = train_tokenizer(TEXTS, vocab_size=1024)
    big = TinyArch(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
    )
    for name, arch, dtype in [("tiny-fp32", TinyArch(), torch.float32), ("100M-bf16", big, torch.bfloat16)]:
        model = build_model(tok, arch).to(dtype)
        pol = HFPolicy("x", HFSettings(device="cuda", batch_size=64), model=model, tokenizer=tok)
        result[name] = {**exactness(pol, tok), **speed(pol, tok)}
        print(name, json.dumps(result[name]), flush=True)
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    return result
