"""A tokenizer and a small Qwen3-architecture model built locally, for machines with no hub.

The offline default recipe has no model to start from, so it makes one: a byte-level BPE
trained on the environment's own text, wrapped as a `PreTrainedTokenizerFast` with a
ChatML template whose `{% generation %}` markers let TRL train on assistant tokens only,
and a `Qwen3ForCausalLM` built from a config. Both round-trip through
`save_pretrained`/`from_pretrained`, so every later stage loads them like any hub model.
Their sizes are the init section's settings (`TinyArch`, `InitTraining` in `selskill.config.init`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from selskill.config.init import InitTraining, TinyArch

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
# The turn-format tags are single tokens, so the decision between <action> and <tool_call>
# is one next-token choice whose entropy the branch stage can read directly.
TAG_TOKENS = ("<think>", "</think>", "<action>", "</action>", "<tool_call>", "</tool_call>")

# ChatML, as Qwen uses it; assistant content sits inside generation markers (TRL's
# assistant_only_loss and `return_assistant_tokens_mask` read them).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = InitTraining.vocab_size):
    """Byte-level BPE over `texts` (no unknown tokens, any text encodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    fast.add_tokens(list(TAG_TOKENS))
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = TinyArch.max_position_embeddings
    return fast


def build_model(tokenizer, arch: TinyArch | None = None, seed: int = 0):
    """A freshly initialised Qwen3ForCausalLM sized for `tokenizer` (deterministic per seed)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    arch = arch or TinyArch()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        **dataclasses.asdict(arch),  # TinyArch's fields are Qwen3Config's names
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.bos_token_id = None
    return model
