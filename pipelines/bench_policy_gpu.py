"""GPU check of the transformers backend: exact logprob/entropy, batch independence, prefix reuse, speed.

Run on a CUDA machine from the repository root: `python pipelines/bench_policy_gpu.py` (writes
$OUT/gpu_check.json when OUT is set). Figures: docs/benchmarks.md.
"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, ".")
from selskill.policy.base import GenerationRequest as R
from selskill.policy.base import SamplingParams as S
from selskill.policy.bootstrap import TinyArch, build_model, train_tokenizer
from selskill.policy.hf import HFPolicy
from selskill.policy.settings import HFSettings

out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
texts = [
    "<|im_start|>user\nYou arrive at desk 1. On the desk 1, you see a mug 1.<|im_end|>\n<action>go to desk 1</action>"
] * 50
tok = train_tokenizer(texts, vocab_size=1024)
for name, arch, dtype in [
    ("tiny-fp32", TinyArch(), torch.float32),
    (
        "100M-bf16",
        TinyArch(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
        ),
        torch.bfloat16,
    ),
]:
    model = build_model(tok, arch).to(dtype)
    pol = HFPolicy("x", HFSettings(device="cuda", batch_size=64), model=model, tokenizer=tok)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    p1 = [5 + (i * 37) % (len(tok) - 10) for i in range(300)]
    p2 = [5 + (i * 11) % (len(tok) - 10) for i in range(500)]
    sp = S(temperature=1.0, max_new_tokens=24, stop_token_ids=(eos,))
    a = pol.generate([R(p1, seed=1), R(p2, seed=2, n=3)], sp)
    b = pol.generate([R(p2, seed=2, n=3)], sp)
    r = {"batch_independent": [g.token_ids for g in a[1]] == [g.token_ids for g in b[0]]}
    diffs_lp, diffs_h = [], []
    for g, p in [(a[0][0], p1)] + [(x, p2) for x in a[1]]:
        lp, h = pol.score(p, g.token_ids)
        diffs_lp += [abs(x - y) for x, y in zip(lp, g.logprobs, strict=True)]
        diffs_h += [abs(x - y) for x, y in zip(h, g.entropies, strict=True)]
    r["max_logprob_diff_vs_teacher_forced"] = max(diffs_lp)
    r["max_entropy_diff_vs_teacher_forced"] = max(diffs_h)
    pol.clear_cache()
    t1 = pol.generate([R(p1, seed=5, cache_key="ep")], sp)[0][0]
    nxt = p1 + t1.token_ids + [7, 8, 9, 10]
    c = pol.generate([R(nxt, seed=6, cache_key="ep")], sp)[0][0]
    pol.clear_cache()
    d = pol.generate([R(nxt, seed=6)], sp)[0][0]
    r["turn_reuse_same_tokens"] = c.token_ids == d.token_ids
    r["turn_reuse_max_lp_diff"] = (
        max(abs(x - y) for x, y in zip(c.logprobs, d.logprobs, strict=True))
        if c.token_ids == d.token_ids
        else None
    )
    # speed: decode throughput by batch size at a 1500-token context
    prompt = [5 + (i * 13) % (len(tok) - 10) for i in range(1500)]
    sp2 = S(temperature=1.0, max_new_tokens=64, stop_token_ids=())
    speed = {}
    for bs in (1, 16, 32, 64):
        pol.clear_cache()
        torch.cuda.synchronize()
        t = time.perf_counter()
        pol.generate([R(prompt + [i], seed=i) for i in range(bs)], sp2)
        torch.cuda.synchronize()
        speed[bs] = round(bs * 64 / (time.perf_counter() - t), 1)
    r["tokens_per_s_by_batch_ctx1500"] = speed
    times = {}
    for mode in ("reuse", "recompute"):
        best = 1e9
        for _ in range(3):
            pol.clear_cache()
            torch.cuda.synchronize()
            t = time.perf_counter()
            if mode == "reuse":
                pol.prefill(prompt, cache_key="p")
                reqs = [R(prompt + [5 + j], seed=j, cache_from="p") for j in range(4)]
            else:
                reqs = [R(prompt + [5 + j], seed=j) for j in range(4)]
            pol.generate(reqs, S(temperature=1.0, max_new_tokens=32, stop_token_ids=()))
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        times[mode] = round(best, 4)
    r["fork_k4_prefix1500"] = times
    out[name] = r
    print(name, json.dumps(r), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "gpu_check.json"), "w"), indent=1)
