"""The vLLM backend against a teacher-forced transformers forward pass of the same model.

The engine tests need vllm (`make test-vllm` runs them in `.venv-vllm`); in the main suite
they skip and only the pure-math checks of the entropy estimate and the lazy import run.

Tolerances (float32 model on CPU; measured differences are ~1e-6):
- chosen-token logprobs: |vLLM - transformers| <= LOGPROB_TOL = 1e-4 (nats);
- exact entropies (full vocabulary): |vLLM - transformers| <= ENTROPY_TOL = 1e-4;
- top-k estimate H_est (see selskill/policy/vllm_backend.py):
  H_est <= H + ENTROPY_TOL and H <= H_est + entropy_gap_bound(r, k, V) + ENTROPY_TOL, with
  the leftover mass r in [0, 1] and within 1e-4 of 1 - (sum of transformers' top-k probs);
- greedy: identical tokens, except at a documented near-tie (transformers' top-2 logits
  closer than GREEDY_TIE = 1e-4), after which the sequences may legitimately differ.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest

from selskill.policy.base import GenerationRequest, SamplingParams
from selskill.policy.vllm_backend import entropy_bounds, entropy_gap_bound, topk_entropy_estimate

LOGPROB_TOL = 1e-4
ENTROPY_TOL = 1e-4
GREEDY_TIE = 1e-4
K = 5  # small k on a ~400-token vocabulary so the leftover mass is often far from 0


# -- pure math (runs everywhere) -----------------------------------------------------------


def _random_logdist(rng: random.Random, vocab: int, temperature: float) -> list[float]:
    logits = [rng.gauss(0.0, 1.0) / temperature for _ in range(vocab)]
    m = max(logits)
    z = m + math.log(math.fsum(math.exp(x - m) for x in logits))
    return [x - z for x in logits]


@pytest.mark.parametrize("temperature", [0.1, 0.5, 1.0, 3.0])
def test_topk_estimate_brackets_the_exact_entropy(temperature):
    rng = random.Random(int(temperature * 10))
    for vocab, k in [(50, 1), (50, 5), (400, 20), (400, 400)]:
        lp = _random_logdist(rng, vocab, temperature)
        exact = -math.fsum(math.exp(x) * x for x in lp)
        top = sorted(lp, reverse=True)[:k]
        est, r, _ = topk_entropy_estimate(top)
        lo, hi = entropy_bounds(top, vocab)
        assert 0.0 <= r <= 1.0
        assert lo == est
        assert est <= exact + 1e-9 <= hi + 2e-9
        assert exact <= est + entropy_gap_bound(r, k, vocab) + 1e-9
        if k == vocab:
            assert abs(est - exact) < 1e-9 and r < 1e-9


def test_module_imports_without_loading_vllm():
    code = (
        "import sys, selskill.policy.vllm_backend as m; assert 'vllm' not in sys.modules; print(m.VLLMPolicy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_engine_arguments_keep_per_request_seeds_working_on_cpu(monkeypatch):
    """On CPU a seeded request's prefill must not be chunked; asking for chunking drops the seeds."""
    from selskill.policy.settings import VLLMSettings
    from selskill.policy.vllm_backend import GiB, _engine_kwargs

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kwargs, seeded = _engine_kwargs("/nowhere", VLLMSettings(max_model_len=8192), is_cpu=True)
    assert seeded and kwargs["enable_chunked_prefill"] is False
    assert kwargs["max_num_batched_tokens"] == 8192 and kwargs["max_model_len"] == 8192
    assert kwargs["kv_cache_memory_bytes"] == GiB and kwargs["logprobs_mode"] == "raw_logprobs"
    chunked = VLLMSettings(engine_kwargs={"enable_chunked_prefill": True})
    kwargs, seeded = _engine_kwargs("/nowhere", chunked, is_cpu=True)
    assert not seeded and kwargs["enable_chunked_prefill"] is True and "max_num_batched_tokens" not in kwargs
    kwargs, seeded = _engine_kwargs("/nowhere", VLLMSettings(), is_cpu=False)
    assert seeded and "enable_chunked_prefill" not in kwargs and "kv_cache_memory_bytes" not in kwargs


def test_the_recipe_picks_the_backend_and_its_settings():
    from selskill.config.rollout import RolloutConfig
    from selskill.config.run import PolicyConfig
    from selskill.policy.settings import HFSettings, VLLMSettings, backend_settings

    rollout = RolloutConfig(policy_batch_size=8)
    pol = PolicyConfig(policy_device="cuda", policy_dtype="bfloat16", trust_remote_code=True)
    assert backend_settings(pol, rollout, seed=3) == HFSettings(
        device="cuda", dtype="bfloat16", trust_remote_code=True, batch_size=8
    )
    vllm = PolicyConfig(policy_backend="vllm", policy_dtype="bfloat16")
    assert backend_settings(vllm, rollout, seed=3) == VLLMSettings(dtype="bfloat16", seed=3)


# -- fixtures: a tiny offline model, the vLLM policy and a transformers reference ----------

TEXTS = [
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 2, "
    "a fridge 1, and a sinkbasin 1.",
    "Your task is to: put a hot mug in cabinet.",
    "<think>I need a mug first.</think><action>go to countertop 2</action>",
    "On the countertop 2, you see a mug 1, a knife 3, and a apple 2.",
    '<tool_call>{"name": "heat_object"}</tool_call>',
    "You pick up the mug 1 from the countertop 2.",
]


@pytest.fixture(scope="module")
def vllm_module():
    return pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def model_dir(vllm_module, tmp_path_factory):
    """Tokenizer + Qwen3 model from selskill.policy.bootstrap, trained for a few steps so that
    its next-token distributions range from peaked to flat."""
    import torch

    from selskill.policy.bootstrap import TinyArch, build_model, train_tokenizer

    tok = train_tokenizer(TEXTS * 10, vocab_size=400)
    arch = TinyArch(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
    )
    model = build_model(tok, arch, seed=0)
    rng = random.Random(0)
    rows = []
    for _ in range(48):
        msgs = [
            {"role": "user", "content": rng.choice(TEXTS)},
            {"role": "assistant", "content": rng.choice(TEXTS)},
        ]
        rows.append(tok(tok.apply_chat_template(msgs, tokenize=False))["input_ids"])
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(30):
        batch = rng.sample(rows, 8)
        width = max(map(len, batch))
        ids = torch.full((8, width), tok.pad_token_id)
        mask = torch.zeros((8, width), dtype=torch.long)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    path = tmp_path_factory.mktemp("tiny_qwen3")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def policy(model_dir):
    from selskill.policy.settings import VLLMSettings
    from selskill.policy.vllm_backend import VLLMPolicy

    settings = VLLMSettings(
        dtype="float32",
        seed=0,
        logprobs_k=K,
        max_model_len=256,
        in_process=True,
        kv_cache_memory_bytes=64 << 20,
        engine_kwargs={"enforce_eager": True},
    )
    pol = VLLMPolicy(str(model_dir), settings)
    yield pol
    pol.close()


@pytest.fixture(scope="module")
def reference(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logdists(ids: list[int]):
        """log_softmax (T=1, float64) of the next-token logits after every prefix of `ids`."""
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, -1)

    return logdists


@pytest.fixture(scope="module")
def prompts(policy):
    tok = policy.tokenizer
    chat = tok.apply_chat_template(
        [{"role": "user", "content": TEXTS[1]}], add_generation_prompt=True, tokenize=False
    )
    rng = random.Random(1)
    return {
        "chat": tok(chat)["input_ids"],  # in-distribution: peaked next-token distributions
        "noise": [rng.randrange(3, policy.vocab_size) for _ in range(12)],  # flat ones
    }


def _reference_fields(reference, prompt, tokens, k=K):
    lp = reference(prompt + tokens)
    P = len(prompt)
    rows = lp[P - 1 : P - 1 + len(tokens)]
    chosen = [float(rows[i, t]) for i, t in enumerate(tokens)]
    exact = [float(-(row.exp() * row).sum()) for row in rows]
    leftover = [float(1.0 - row.topk(k).values.exp().sum()) for row in rows]
    return chosen, exact, leftover


# -- the backend ---------------------------------------------------------------------------


def test_chosen_logprobs_match_transformers_and_estimates_are_bounded(policy, reference, prompts):
    reqs = [GenerationRequest(prompts["chat"], seed=1, n=2), GenerationRequest(prompts["noise"], seed=2, n=2)]
    results = policy.generate(reqs, SamplingParams(temperature=1.0, max_new_tokens=12))
    assert [len(g) for g in results] == [2, 2]
    loose = 0
    for req, gens in zip(reqs, results, strict=True):
        for g in gens:
            assert len(g.token_ids) == len(g.logprobs) == len(g.entropies) == len(g.leftover_mass)
            assert g.entropy_exact is False and g.finish_reason == "length"
            chosen, exact, leftover = _reference_fields(reference, req.prompt_ids, g.token_ids)
            for i in range(len(g.token_ids)):
                assert abs(g.logprobs[i] - chosen[i]) <= LOGPROB_TOL
                r = g.leftover_mass[i]
                assert 0.0 <= r <= 1.0
                assert abs(r - max(0.0, leftover[i])) <= 1e-4
                assert g.entropies[i] <= exact[i] + ENTROPY_TOL
                assert exact[i] <= g.entropies[i] + entropy_gap_bound(r, K, policy.vocab_size) + ENTROPY_TOL
                loose += r > 0.05
    assert loose > 0, "the test model should have some flat distributions (large leftover mass)"


def test_exact_entropy_modes_match_transformers(policy, reference, prompts):
    prompt = prompts["noise"]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    try:
        # full vocabulary at every generated token (logprobs=-1)
        policy.exact_entropy_rescore = True
        (gens,) = policy.generate([GenerationRequest(prompt, seed=3)], params)
        g = gens[0]
        assert g.entropy_exact and g.leftover_mass == [0.0] * len(g.token_ids)
        chosen, exact, _ = _reference_fields(reference, prompt, g.token_ids)
        assert max(abs(a - b) for a, b in zip(g.entropies, exact, strict=True)) <= ENTROPY_TOL
        assert max(abs(a - b) for a, b in zip(g.logprobs, chosen, strict=True)) <= LOGPROB_TOL

        # the first m positions rescored exactly, the rest estimated
        policy.exact_entropy_rescore = 3
        (gens,) = policy.generate([GenerationRequest(prompt, seed=3, n=2)], params)
        for g in gens:
            _, exact, leftover = _reference_fields(reference, prompt, g.token_ids)
            assert not g.entropy_exact
            for i in range(3):
                assert abs(g.entropies[i] - exact[i]) <= ENTROPY_TOL and g.leftover_mass[i] == 0.0
            for i in range(3, len(g.token_ids)):
                assert abs(g.leftover_mass[i] - max(0.0, leftover[i])) <= 1e-4
                assert g.entropies[i] <= exact[i] + ENTROPY_TOL
    finally:
        policy.exact_entropy_rescore = False

    # rescore chosen positions of an estimated generation
    (gens,) = policy.generate([GenerationRequest(prompt, seed=4)], params)
    g = policy.rescore_entropy(prompt, gens[0], positions=[1, 4])
    _, exact, _ = _reference_fields(reference, prompt, g.token_ids)
    for i in (1, 4):
        assert abs(g.entropies[i] - exact[i]) <= ENTROPY_TOL and g.leftover_mass[i] == 0.0
    policy.rescore_entropy(prompt, g)
    assert g.entropy_exact


def test_score_is_exact_teacher_forcing(policy, reference, prompts):
    prompt = prompts["chat"]
    cont = prompts["noise"][:6] + prompts["chat"][3:9]
    chosen, exact, _ = _reference_fields(reference, prompt, cont)
    lps, ents = policy.score(prompt, cont)
    assert max(abs(a - b) for a, b in zip(lps, chosen, strict=True)) <= LOGPROB_TOL
    assert max(abs(a - b) for a, b in zip(ents, exact, strict=True)) <= ENTROPY_TOL
    # the one-request-per-position path (used for large vocabularies) agrees
    policy.score_budget = 0
    try:
        lps2, ents2 = policy.score(prompt, cont)
    finally:
        del policy.score_budget
    assert max(abs(a - b) for a, b in zip(lps, lps2, strict=True)) <= LOGPROB_TOL
    assert max(abs(a - b) for a, b in zip(ents, ents2, strict=True)) <= ENTROPY_TOL
    totals = policy.score_continuations(prompt, [cont, cont[:3]])
    assert abs(totals[0] - sum(chosen)) <= 10 * LOGPROB_TOL
    assert abs(totals[1] - sum(chosen[:3])) <= 10 * LOGPROB_TOL


def _reference_greedy(reference, prompt, steps):
    ids, ties = list(prompt), []
    for _ in range(steps):
        row = reference(ids)[-1]
        top = row.topk(2)
        ties.append(float(top.values[0] - top.values[1]) < GREEDY_TIE)
        ids.append(int(top.indices[0]))
    return ids[len(prompt) :], ties


def test_greedy_matches_transformers_greedy(policy, reference, prompts):
    steps = 16
    reqs = [GenerationRequest(prompts["chat"], n=3), GenerationRequest(prompts["noise"])]
    results = policy.generate(reqs, SamplingParams(temperature=0.0, max_new_tokens=steps))
    assert len(results[0]) == 3 and all(g.token_ids == results[0][0].token_ids for g in results[0])
    for req, gens in zip(reqs, results, strict=True):
        ref, ties = _reference_greedy(reference, req.prompt_ids, steps)
        got = gens[0].token_ids
        assert len(got) == steps
        for i, (a, b) in enumerate(zip(got, ref, strict=True)):
            if a != b:
                assert ties[i], f"greedy differs at step {i} without a near-tie: {got} vs {ref}"
                break


def test_n_samples_per_request(policy, prompts):
    results = policy.generate(
        [GenerationRequest(prompts["noise"], seed=5, n=4), GenerationRequest(prompts["chat"], seed=6, n=1)],
        SamplingParams(temperature=1.0, max_new_tokens=6),
    )
    assert [len(r) for r in results] == [4, 1]
    assert len({tuple(g.token_ids) for g in results[0]}) > 1  # flat distribution: samples differ


def test_token_ids_are_fed_as_given(policy, reference):
    tok = policy.tokenizer
    # "mug" and "cabinet" spelled one byte-level character per token: not what BPE produces
    ids = tok("Your task is to: put a hot")["input_ids"]
    ids += [tok.convert_tokens_to_ids(c) for c in "Ġmug"] + [tok.convert_tokens_to_ids(c) for c in "Ġin"]
    assert tok.unk_token_id not in ids and None not in ids
    assert tok(tok.decode(ids))["input_ids"] != ids, "the prompt must not round-trip through text"
    (gens,) = policy.generate([GenerationRequest(ids)], SamplingParams(temperature=0.0, max_new_tokens=4))
    ref, _ = _reference_greedy(reference, ids, 4)
    chosen, _, _ = _reference_fields(reference, ids, gens[0].token_ids)
    assert max(abs(a - b) for a, b in zip(gens[0].logprobs, chosen, strict=True)) <= LOGPROB_TOL
    # the re-tokenized prompt would give a different first-token distribution
    retok = tok(tok.decode(ids))["input_ids"]
    other = float(reference(retok)[-1][gens[0].token_ids[0]])
    assert abs(other - gens[0].logprobs[0]) > LOGPROB_TOL


def test_stop_tokens_lengths_and_limits(policy, prompts):
    prompt = prompts["chat"]
    (free,) = policy.generate([GenerationRequest(prompt)], SamplingParams(temperature=0.0, max_new_tokens=10))
    toks = free[0].token_ids
    assert free[0].finish_reason == "length" and len(toks) == 10  # EOS is no implicit stop
    stop = toks[3]
    (stopped,) = policy.generate(
        [GenerationRequest(prompt)],
        SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop,)),
    )
    g = stopped[0]
    first = toks.index(stop)
    assert g.finish_reason == "stop" and g.token_ids == toks[: first + 1]  # stop token kept
    # the context limit caps max_new_tokens; a full context is an error
    (capped,) = policy.generate(
        [GenerationRequest(list(range(3, 3 + 250)))], SamplingParams(temperature=0.0, max_new_tokens=20)
    )
    assert len(capped[0].token_ids) == 6 and capped[0].finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len"):
        policy.generate([GenerationRequest(list(range(3, 3 + 256)))], SamplingParams(max_new_tokens=4))
    # a request vLLM rejects (id outside the vocabulary) raises and leaves the engine usable
    with pytest.raises(Exception, match="(?i)vocab|token"):
        policy.generate([GenerationRequest([5, policy.vocab_size + 7])], SamplingParams(max_new_tokens=2))
    (again,) = policy.generate(
        [GenerationRequest(prompt)], SamplingParams(temperature=0.0, max_new_tokens=10)
    )
    assert again[0].token_ids == toks


def test_per_request_seeds_are_batch_independent(policy, prompts):
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=8)
    alone = policy.generate([GenerationRequest(prompts["noise"], seed=7, n=2)], params)[0]
    batched = policy.generate(
        [GenerationRequest(prompts["chat"], seed=8, n=3), GenerationRequest(prompts["noise"], seed=7, n=2)],
        params,
    )[1]
    neighbour = policy.generate([GenerationRequest(prompts["noise"], seed=8, n=2)], params)[0]
    # a batch larger than one scheduler step (4096 tokens): with chunked prefill a seeded
    # request would be split across steps, which crashes vLLM CPU (see the backend docstring)
    rng = random.Random(3)
    crowd = [
        GenerationRequest([rng.randrange(3, policy.vocab_size) for _ in range(240)], seed=100 + i)
        for i in range(20)
    ]
    crowded = policy.generate(crowd + [GenerationRequest(prompts["noise"], seed=7, n=2)], params)[-1]
    if not policy.per_request_seeds:
        pytest.skip("this vLLM build rejected per-request seeds; the backend fell back to engine seeding")
    assert [g.token_ids for g in alone] == [g.token_ids for g in batched] == [g.token_ids for g in crowded]
    # consecutive request seeds do not share samples (vLLM seeds sample j with seed + j)
    assert alone[1].token_ids != neighbour[0].token_ids


def test_stats_report_tokens_per_second(policy, prompts):
    before = policy.stats().generated_tokens
    policy.generate([GenerationRequest(prompts["chat"], seed=9, n=4)], SamplingParams(max_new_tokens=8))
    stats = policy.stats()
    assert stats.generated_tokens - before == 32
    assert stats.seconds > 0 and stats.tokens_per_second > 0
    assert stats.extra["backend"] == "vllm" and stats.extra["logprobs_k"] == K


def test_trust_remote_code_is_off_by_default(policy):
    assert policy.llm.llm_engine.model_config.trust_remote_code is False
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"  # in_process=True was honoured
