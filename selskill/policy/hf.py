"""The transformers backend: batched decoding with exact per-token logprob and entropy.

`model.generate` is not used because the method needs three things it does not give
together: (1) each request's samples depend only on its own seed, not on what it is
batched with (one `torch.Generator` per row); (2) the exact full-vocabulary entropy of the
T=1 distribution at every generated token, computed in row chunks so a 150k vocabulary
does not blow memory; (3) KV reuse of shared prefixes: the `n` samples of a request share
one prefill, and a request can continue from the stored KV of an earlier sequence (the
previous turn of its episode, or the source rollout a fork branches from).

Rows of one batch may reuse prefixes of different lengths and feed new chunks of
different lengths; they are aligned as [left pad | reused KV | left pad | new tokens] with
the pads masked out and explicit position ids, so a row's computation is the same as if
it ran alone (up to floating-point reduction order).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from selskill.policy.base import Generation, GenerationRequest, SamplingParams, ThroughputStats
from selskill.policy.kv_attention import CPU_GQA_SDPA, prealloc_layer_class, register_cpu_gqa_sdpa
from selskill.policy.settings import HFSettings

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# ragged (per-row) prefill when the rows' real attention work is below this share of a padded batch's
RAGGED_PREFILL_BELOW = 0.8


@dataclass
class _Stored:
    tokens: list[int]  # the tokens whose KV is stored (always one fewer than the sequence fed so far)
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer [heads, len, head_dim]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv)


def token_logprob_entropy(logits: torch.Tensor, chunk_rows: int = 8, entropy: bool = True):
    """log-softmax and entropy of the T=1 distribution, row-chunked to bound memory."""
    logps, ents = [], []
    for start in range(0, logits.shape[0], chunk_rows):
        block = logits[start : start + chunk_rows].float()
        lp = torch.log_softmax(block, dim=-1)
        ents.append(-(lp.exp() * lp).sum(-1) if entropy else lp.new_zeros(lp.shape[0]))
        logps.append(lp)
    return torch.cat(logps), torch.cat(ents)


def _load_model(path: str, settings: HFSettings, device: torch.device):
    """The model in the settings' dtype; on CPU with grouped attention kept grouped (`kv_attention.cpu_gqa_sdpa`)."""
    from transformers import AutoModelForCausalLM

    common = {"dtype": _DTYPES[settings.dtype], "trust_remote_code": settings.trust_remote_code}
    if device.type != "cpu" or settings.trust_remote_code:
        return AutoModelForCausalLM.from_pretrained(path, **common)
    register_cpu_gqa_sdpa()
    try:
        return AutoModelForCausalLM.from_pretrained(path, attn_implementation=CPU_GQA_SDPA, **common)
    except ValueError:  # an architecture that refuses custom attention functions
        return AutoModelForCausalLM.from_pretrained(path, **common)


@dataclass
class _Rows:
    """What each sample row of a batch has generated so far."""

    tokens: list[list[int]]
    logps: list[list[float]]
    ents: list[list[float]]
    finished: list[bool]
    reason: list[str]

    @classmethod
    def empty(cls, n: int) -> _Rows:
        return cls(
            [[] for _ in range(n)],
            [[] for _ in range(n)],
            [[] for _ in range(n)],
            [False] * n,
            ["length"] * n,
        )

    def record(
        self, chosen: list[int], logps: list[float], ents: list[float], constraints: list, stop
    ) -> None:
        """Append one step's token to every unfinished row; a stop token finishes its row."""
        for i, tok in enumerate(chosen):
            if self.finished[i]:
                continue
            self.tokens[i].append(tok)
            if constraints[i] is not None:
                constraints[i].push(tok)
            self.logps[i].append(logps[i])
            self.ents[i].append(ents[i])
            if tok in stop:
                self.finished[i] = True
                self.reason[i] = "stop"

    def generation(self, i: int) -> Generation:
        return Generation(self.tokens[i], self.logps[i], self.ents[i], self.reason[i])


def _sample_rows(requests: Sequence[GenerationRequest]) -> list[tuple[GenerationRequest, int]]:
    """(request, sample index j) of every row, in row order (a request with n samples takes n rows)."""
    return [(r, j) for r in requests for j in range(r.n)]


def _row_constraints(requests: Sequence[GenerationRequest]) -> list:
    for r in requests:
        if r.constraint is not None and r.n != 1:
            raise ValueError("a constrained generation request must have n=1 (one constraint state per row)")
    return [r.constraint for r, _ in _sample_rows(requests)]


def _row_generators(requests: Sequence[GenerationRequest], device: torch.device) -> list[torch.Generator]:
    """One generator per row, seeded from its request's seed and its sample index alone."""
    generators = []
    for r, j in _sample_rows(requests):
        g = torch.Generator(device=device)
        g.manual_seed((int(r.seed) * 1_000_003 + j) % (2**63 - 1))
        generators.append(g)
    return generators


class HFPolicy:
    """A causal LM from a local directory (or a hub id, when the user asks for one)."""

    def __init__(
        self, model_name_or_path: str, settings: HFSettings | None = None, *, model=None, tokenizer=None
    ):
        """`model` / `tokenizer`: already built ones (a test's or a benchmark's), else loaded from the path."""
        from transformers import AutoTokenizer

        settings = settings or HFSettings()
        if settings.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got {settings.dtype!r}")
        self.policy_id = str(model_name_or_path)
        self.device = torch.device(settings.device)
        self._tokenizer = tokenizer or AutoTokenizer.from_pretrained(
            model_name_or_path, trust_remote_code=settings.trust_remote_code
        )
        model = model if model is not None else _load_model(model_name_or_path, settings, self.device)
        self.model = model.to(self.device).eval()
        self.batch_size = settings.batch_size
        self.entropy_chunk_rows = settings.entropy_chunk_rows
        self.exact_entropy = settings.exact_entropy
        ragged = settings.ragged_prefill  # None: on for CPU only (see HFSettings)
        self.ragged_prefill = self.device.type == "cpu" if ragged is None else ragged
        self.max_cached_sequences = settings.max_cached_sequences
        self.max_cached_bytes = settings.max_cached_bytes
        self._cached_bytes = 0
        self._cache: OrderedDict[str, _Stored] = OrderedDict()
        self._stats = ThroughputStats()
        pad = self._tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self._tokenizer.eos_token_id or 0)

    @property
    def tokenizer(self):
        return self._tokenizer

    def stats(self) -> ThroughputStats:
        return self._stats

    def clear_cache(self) -> None:
        self._cache.clear()
        self._cached_bytes = 0

    # -- prefix store ------------------------------------------------------------------

    def _lookup(self, request: GenerationRequest) -> tuple[int, _Stored | None]:
        """Longest stored prefix of the request's prompt (leaving >= 1 token to feed)."""
        best, best_len = None, 0
        keys = [k for k in (request.cache_key, request.cache_from) if k]
        for key in keys:
            stored = self._cache.get(key)
            if stored is None:
                continue
            limit = min(len(stored.tokens), len(request.prompt_ids) - 1)
            n = 0
            while n < limit and stored.tokens[n] == request.prompt_ids[n]:
                n += 1
            if n > best_len:
                best, best_len = stored, n
        return best_len, best

    def _store(self, key: str, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep `kv` under `key`; the least recent entries go once either bound is passed (never the
        newest: the next turn of its episode needs it)."""
        if key in self._cache:
            self._cached_bytes -= self._cache.pop(key).nbytes
        stored = _Stored(tokens, kv)
        self._cache[key] = stored
        self._cached_bytes += stored.nbytes
        while len(self._cache) > 1 and (
            len(self._cache) > self.max_cached_sequences or self._cached_bytes > self.max_cached_bytes
        ):
            self._cached_bytes -= self._cache.popitem(last=False)[1].nbytes

    @torch.inference_mode()
    def prefill(self, prompt_ids: Sequence[int], cache_key: str) -> None:
        """Compute and store the KV of `prompt_ids` so requests naming `cache_key` skip it."""
        from transformers import DynamicCache

        ids = list(prompt_ids)
        if len(ids) < 2:
            return
        cache = DynamicCache()
        t0 = time.perf_counter()
        self.model(
            input_ids=torch.tensor([ids], device=self.device),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        kv = [(layer.keys[0].clone(), layer.values[0].clone()) for layer in cache.layers]
        self._store(cache_key, ids, kv)
        self._stats.prompt_tokens += len(ids)
        seconds = time.perf_counter() - t0
        self._stats.seconds += seconds
        self._stats.prefill_seconds += seconds

    # -- generation --------------------------------------------------------------------

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        out: list[list[Generation]] = []
        # group by rows (a request with n samples takes n rows)
        batch: list[GenerationRequest] = []
        rows = 0
        for req in requests:
            if batch and rows + req.n > self.batch_size:
                out.extend(self._generate_batch(batch, params))
                batch, rows = [], 0
            batch.append(req)
            rows += req.n
        if batch:
            out.extend(self._generate_batch(batch, params))
        return out

    @torch.inference_mode()
    def _generate_batch(
        self, requests: list[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        t0 = time.perf_counter()
        reuse = [self._lookup(r) for r in requests]
        new_chunks = [r.prompt_ids[n:] for r, (n, _) in zip(requests, reuse, strict=True)]
        prefilled = self._expand_samples(
            requests, *self._prefill_batch(reuse, new_chunks, params.max_new_tokens)
        )
        if self.device.type == "cuda":  # the prefill's kernels are queued, not done
            torch.cuda.synchronize(self.device)
        self._stats.prefill_seconds += time.perf_counter() - t0
        rows, cache, mask = self._decode(requests, params, *prefilled)
        # store each row's KV (valid positions only) for reuse by its next turn
        for i, (r, j) in enumerate(_sample_rows(requests)):
            if r.cache_key:
                key = r.cache_key if r.n == 1 else f"{r.cache_key}:{j}"
                self._store_row(key, cache, mask, i, r.prompt_ids + rows.tokens[i])
        gens = iter([rows.generation(i) for i in range(len(rows.tokens))])
        self._stats.prompt_tokens += sum(len(c) for c in new_chunks)
        self._stats.generated_tokens += sum(len(t) for t in rows.tokens)
        self._stats.seconds += time.perf_counter() - t0
        return [[next(gens) for _ in range(r.n)] for r in requests]

    def _prefill_batch(self, reuse, new_chunks, max_new_tokens: int):
        """(last logits, cache, mask, next positions) of every request's prompt, by the cheaper layout.

        A row's new chunk is computed once, however the others differ: with uneven rows, one
        forward per row into one shared buffer beats a padded batch (prefill is compute).
        """
        past_lens = [n for n, _ in reuse]
        P, N, B = max(past_lens), max(len(c) for c in new_chunks), len(new_chunks)
        real = sum(len(c) * (L + len(c)) for L, c in zip(past_lens, new_chunks, strict=True))
        if self.ragged_prefill and B > 1 and real < RAGGED_PREFILL_BELOW * B * N * (P + N):
            return self._prefill_rows(reuse, new_chunks, max_new_tokens)
        return self._prefill_padded(reuse, new_chunks, max_new_tokens)

    def _expand_samples(self, requests, logits, cache, mask, next_pos):
        """One row per sample: a request's n samples share its prefilled row."""
        ns = [r.n for r in requests]
        if all(n == 1 for n in ns):
            return logits, cache, mask, next_pos
        index = torch.repeat_interleave(torch.arange(len(requests)), torch.tensor(ns)).to(self.device)
        cache.batch_select_indices(index)
        return (
            logits.index_select(0, index),
            cache,
            mask.index_select(0, index.cpu()),
            next_pos.index_select(0, index.cpu()),
        )

    def _decode(self, requests, params: SamplingParams, logits, cache, mask, next_pos):
        """Sample up to `max_new_tokens` per row; returns the rows and the final (cache, mask)."""
        constraints = _row_constraints(requests)
        generators = _row_generators(requests, self.device)
        stop = set(params.stop_token_ids)
        rows = _Rows.empty(len(constraints))
        for step in range(params.max_new_tokens):
            lp, ent = token_logprob_entropy(logits, self.entropy_chunk_rows, self.exact_entropy)
            chosen = self._choose(self._constrain(logits, constraints, rows.finished), params, generators)
            # one device->host transfer per step (not one per row): matters on GPU
            picked = torch.stack(
                [chosen.float(), lp.gather(1, chosen.view(-1, 1)).flatten(), ent.float()]
            ).cpu()
            rows.record(picked[0].long().tolist(), picked[1].tolist(), picked[2].tolist(), constraints, stop)
            if all(rows.finished) or step == params.max_new_tokens - 1:
                break
            logits, cache, mask = self._feed(rows, cache, mask, next_pos)
            next_pos = next_pos + 1
        return rows, cache, mask

    def _feed(self, rows: _Rows, cache, mask, positions):
        """One decode step over every row's last token: (next logits, cache, mask)."""
        dev, R = self.device, len(rows.tokens)
        feed = torch.tensor(
            [[rows.tokens[i][-1] if not rows.finished[i] else self.pad_id] for i in range(R)],
            dtype=torch.long,
        )
        # finished rows feed a pad that must neither be attended to nor stored
        live = torch.tensor([[0 if done else 1] for done in rows.finished], dtype=torch.long)
        mask = torch.cat([mask, live], 1)
        out = self.model(
            input_ids=feed.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.view(R, 1).to(dev),
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits[:, -1, :], out.past_key_values, mask

    def _prefill_padded(self, reuse, new_chunks, max_new_tokens: int):
        """All rows in one forward, aligned as [left pad | reused KV | left pad | new tokens]."""
        from transformers import DynamicCache

        dev = self.device
        n_layers = self.model.config.get_text_config().num_hidden_layers
        past_lens = [n for n, _ in reuse]
        P, N, B = max(past_lens), max(len(c) for c in new_chunks), len(new_chunks)
        mask = torch.zeros(B, P + N, dtype=torch.long)
        input_ids = torch.full((B, N), self.pad_id, dtype=torch.long)
        positions = torch.zeros(B, N, dtype=torch.long)
        for i, (L, chunk) in enumerate(zip(past_lens, new_chunks, strict=True)):
            mask[i, P - L : P] = 1
            mask[i, P + N - len(chunk) :] = 1
            input_ids[i, N - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
            positions[i, N - len(chunk) :] = torch.arange(L, L + len(chunk))
        # one preallocated buffer per layer: [left pad | reused KV] now, the new chunk and every
        # generated token written in place later (no per-step concatenation of the whole cache)
        cache = DynamicCache()
        layer_cls = prealloc_layer_class()
        if P > 0:
            ref = next(st for _, st in reuse if st is not None)
            layers = []
            for layer in range(n_layers):
                h, d = ref.kv[layer][0].shape[0], ref.kv[layer][0].shape[2]
                k = torch.zeros(B, h, P, d, dtype=ref.kv[layer][0].dtype, device=dev)
                v = torch.zeros_like(k)
                for i, (L, stored) in enumerate(reuse):
                    if stored is not None and L > 0:
                        k[i, :, P - L :] = stored.kv[layer][0][:, :L]
                        v[i, :, P - L :] = stored.kv[layer][1][:, :L]
                layers.append(layer_cls(k, v, N + max_new_tokens))
            cache.layers = layers
        out = self.model(
            input_ids=input_ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        if not all(isinstance(layer, layer_cls) for layer in cache.layers):  # fresh prompts: switch once
            cache.layers = [layer_cls(lay.keys, lay.values, max_new_tokens) for lay in cache.layers]
        return out.logits[:, -1, :], cache, mask, positions[:, -1] + 1

    def _prefill_rows(self, reuse, new_chunks, extra: int):
        """One forward per row, each writing its KV in place into one right-aligned batch buffer.

        Row i occupies the last L_i + N_i positions of the buffer (its reused KV, then its new
        chunk); the positions before are masked pads. No padded token is ever computed and
        no KV is copied twice.
        """
        from transformers import DynamicCache

        dev = self.device
        layer_cls = prealloc_layer_class()
        lens = [L + len(c) for (L, _), c in zip(reuse, new_chunks, strict=True)]
        W, B = max(lens), len(new_chunks)
        cfg = self.model.config.get_text_config()
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        dtype = next(self.model.parameters()).dtype
        bufs = []
        for _ in range(cfg.num_hidden_layers):
            k = torch.zeros(B, heads, W + extra, head_dim, dtype=dtype, device=dev)
            bufs.append((k, torch.zeros_like(k)))
        mask = torch.zeros(B, W, dtype=torch.long)
        logits = []
        for i, ((L, stored), chunk) in enumerate(zip(reuse, new_chunks, strict=True)):
            start = W - lens[i]
            row_cache = DynamicCache()
            row_layers = []
            for layer, (k, v) in enumerate(bufs):
                if L:
                    k[i, :, start : start + L] = stored.kv[layer][0][:, :L]
                    v[i, :, start : start + L] = stored.kv[layer][1][:, :L]
                row_layers.append(layer_cls.over(k[i : i + 1, :, start:W], v[i : i + 1, :, start:W], L))
            row_cache.layers = row_layers
            out = self.model(
                input_ids=torch.tensor([chunk], dtype=torch.long, device=dev),
                attention_mask=torch.ones(1, lens[i], dtype=torch.long, device=dev),
                position_ids=torch.arange(L, lens[i], device=dev).view(1, -1),
                past_key_values=row_cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits.append(out.logits[0, -1])
            mask[i, start:] = 1
        cache = DynamicCache()
        cache.layers = [layer_cls.over(k, v, W) for k, v in bufs]
        return torch.stack(logits), cache, mask, torch.tensor(lens, dtype=torch.long)

    def _store_row(self, key, cache, mask, row: int, sequence: list[int]) -> None:
        # the cache covers every position fed so far; the last generated token was never fed
        width = cache.layers[0].keys.shape[-2]
        valid = mask[row, :width].nonzero().flatten().to(self.device)
        kv = [
            (layer.keys[row].index_select(1, valid), layer.values[row].index_select(1, valid))
            for layer in cache.layers
        ]
        fed = len(valid)
        self._store(key, sequence[:fed], kv)

    @staticmethod
    def _constrain(logits: torch.Tensor, constraints: list, finished: list[bool]) -> torch.Tensor:
        """The logits the next token is chosen from: -inf where a row's constraint forbids a token."""
        masks = [(i, c.mask()) for i, c in enumerate(constraints) if c is not None and not finished[i]]
        masks = [(i, m) for i, m in masks if m is not None]
        if not masks:
            return logits
        out = logits.clone()
        for i, (ids, keep) in masks:
            index = torch.tensor(ids, dtype=torch.long, device=logits.device)
            if keep:
                row = torch.full_like(out[i], float("-inf"))
                row[index] = out[i, index]
                out[i] = row
            else:
                out[i, index] = float("-inf")
        return out

    @staticmethod
    def _choose(logits: torch.Tensor, params: SamplingParams, generators) -> torch.Tensor:
        """Next token per row (on the logits' device): argmax, or a draw from that row's own generator."""
        if params.greedy:
            return logits.argmax(-1)
        out = []
        for i, g in enumerate(generators):
            probs = torch.softmax(logits[i].float() / params.temperature, -1)
            if params.top_p < 1.0:
                sorted_p, idx = probs.sort(descending=True)
                keep = sorted_p.cumsum(0) - sorted_p < params.top_p
                filtered = torch.zeros_like(probs)
                filtered[idx[keep]] = sorted_p[keep]
                probs = filtered / filtered.sum()
            out.append(torch.multinomial(probs, 1, generator=g))
        return torch.cat(out)

    # -- scoring -----------------------------------------------------------------------

    @torch.inference_mode()
    def score_continuations(
        self, prefix_ids: Sequence[int], continuations: Sequence[Sequence[int]]
    ) -> list[float]:
        """Total logprob of each continuation after one shared prefix (one prefill, one batch)."""
        from transformers import DynamicCache

        prefix = list(prefix_ids)
        conts = [list(c) for c in continuations]
        if not conts:
            return []
        cache = DynamicCache()
        out = self.model(
            input_ids=torch.tensor([prefix], device=self.device),
            attention_mask=torch.ones(1, len(prefix), dtype=torch.long, device=self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        first = torch.log_softmax(out.logits[0, -1].float(), -1)
        B, width = len(conts), max(len(c) for c in conts)
        cache.batch_repeat_interleave(B)
        ids = torch.full((B, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(B, len(prefix) + width, dtype=torch.long)
        mask[:, : len(prefix)] = 1
        for i, c in enumerate(conts):
            ids[i, : len(c)] = torch.tensor(c)
            mask[i, len(prefix) : len(prefix) + len(c)] = 1
        positions = torch.arange(len(prefix), len(prefix) + width).expand(B, width)
        logits = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=cache,
            use_cache=True,
        ).logits
        totals = []
        for i, c in enumerate(conts):
            lp = torch.log_softmax(logits[i, : len(c) - 1].float(), -1) if len(c) > 1 else None
            total = float(first[c[0]])
            if lp is not None:
                total += float(lp.gather(1, torch.tensor(c[1:], device=lp.device).view(-1, 1)).sum())
            totals.append(total)
        self._stats.prompt_tokens += len(prefix) + sum(len(c) for c in conts)
        return totals

    @torch.inference_mode()
    def score(
        self, prompt_ids: Sequence[int], continuation_ids: Sequence[int]
    ) -> tuple[list[float], list[float]]:
        ids = torch.tensor([list(prompt_ids) + list(continuation_ids)], dtype=torch.long, device=self.device)
        n = len(continuation_ids)
        if n == 0:
            return [], []
        # an explicit mask puts teacher forcing through the same attention kernel as generation
        mask = torch.ones_like(ids)
        logits = self.model(input_ids=ids, attention_mask=mask, logits_to_keep=n + 1).logits[0, :-1]
        lp, ent = token_logprob_entropy(logits, self.entropy_chunk_rows)
        target = torch.tensor(list(continuation_ids), device=lp.device)
        return lp.gather(1, target.view(-1, 1)).flatten().tolist(), ent.tolist()
