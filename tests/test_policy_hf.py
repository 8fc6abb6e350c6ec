"""The transformers backend's two prefill layouts compute the same thing."""

import random

from selskill.policy.base import GenerationRequest, SamplingParams
from selskill.policy.hf import HFPolicy
from selskill.policy.settings import HFSettings


def _turns(policy, prompts, params, turns=3, seed=0):
    """Multi-turn generation with KV reuse: each turn extends every row's last sequence."""
    rng = random.Random(seed)
    vocab = policy.tokenizer.vocab_size
    seqs = [list(p) for p in prompts]
    out = []
    for turn in range(turns):
        gens = policy.generate(
            [GenerationRequest(s, seed=100 * turn + i, cache_key=f"row{i}") for i, s in enumerate(seqs)],
            params,
        )
        out.append([g[0] for g in gens])
        for i, g in enumerate(gens):
            # the next turn appends an "observation" of a different length per row
            seqs[i] = seqs[i] + g[0].token_ids + [rng.randrange(3, vocab) for _ in range(5 + 17 * i)]
    return out


def test_ragged_prefill_matches_the_padded_batch(tiny_model_dir):
    ragged = HFPolicy(str(tiny_model_dir), HFSettings(batch_size=8))
    padded = HFPolicy(str(tiny_model_dir), HFSettings(batch_size=8, ragged_prefill=False))
    calls = []
    inner = ragged._prefill_rows
    ragged._prefill_rows = lambda *a, **k: calls.append(1) or inner(*a, **k)
    rng = random.Random(1)
    vocab = ragged.tokenizer.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (7, 60, 23, 140)]
    for params in (SamplingParams(0.0, max_new_tokens=6), SamplingParams(1.0, max_new_tokens=6)):
        ragged.clear_cache()
        padded.clear_cache()
        a = _turns(ragged, prompts, params)
        b = _turns(padded, prompts, params)
        for ga, gb in zip((g for turn in a for g in turn), (g for turn in b for g in turn), strict=True):
            assert ga.token_ids == gb.token_ids
            assert max(abs(x - y) for x, y in zip(ga.logprobs, gb.logprobs, strict=True)) < 1e-4
            assert max(abs(x - y) for x, y in zip(ga.entropies, gb.entropies, strict=True)) < 1e-4
    assert calls, "uneven rows with reused prefixes should take the per-row path"


def test_ragged_prefill_records_match_teacher_forcing(tiny_model_dir):
    policy = HFPolicy(str(tiny_model_dir), HFSettings(batch_size=8))
    rng = random.Random(2)
    vocab = policy.tokenizer.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 90, 31)]
    seqs = [list(p) for p in prompts]
    params = SamplingParams(1.0, max_new_tokens=8)
    for turn in range(2):
        gens = policy.generate(
            [GenerationRequest(s, seed=turn * 10 + i, cache_key=f"t{i}") for i, s in enumerate(seqs)], params
        )
        for i, g in enumerate(gens):
            lp, ent = policy.score(seqs[i], g[0].token_ids)
            assert max(abs(x - y) for x, y in zip(lp, g[0].logprobs, strict=True)) < 1e-4
            assert max(abs(x - y) for x, y in zip(ent, g[0].entropies, strict=True)) < 1e-4
            seqs[i] = seqs[i] + g[0].token_ids + [rng.randrange(3, vocab) for _ in range(3 + 11 * i)]


def test_the_kv_store_keeps_to_its_byte_bound_and_generates_the_same(tiny_model_dir):
    """Evicted prefixes are recomputed: a store bounded to about one sequence samples what an unbounded one does."""
    unbounded = HFPolicy(str(tiny_model_dir), HFSettings(batch_size=8))
    rng = random.Random(3)
    vocab = unbounded.tokenizer.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (12, 70, 33)]
    params = SamplingParams(1.0, max_new_tokens=6)
    a = _turns(unbounded, prompts, params)
    one_sequence = max(s.nbytes for s in unbounded._cache.values())
    assert sum(s.nbytes for s in unbounded._cache.values()) > one_sequence
    bounded = HFPolicy(str(tiny_model_dir), HFSettings(batch_size=8, max_cached_bytes=one_sequence))
    b = _turns(bounded, prompts, params)
    assert len(bounded._cache) == 1
    assert bounded._cached_bytes == sum(s.nbytes for s in bounded._cache.values()) <= one_sequence
    for ga, gb in zip((g for turn in a for g in turn), (g for turn in b for g in turn), strict=True):
        assert ga.token_ids == gb.token_ids
        assert max(abs(x - y) for x, y in zip(ga.logprobs, gb.logprobs, strict=True)) < 1e-4
