"""Token ids for an episode, built incrementally and never re-tokenized.

Chat templates are not prefix-stable (Qwen3 drops earlier <think> blocks once a new user
turn arrives), so rendering the whole conversation again each turn would change tokens the
policy already saw. Instead: the opening (system + first observation + generation prompt)
is rendered once; each later message contributes only its own segment — the template's
text between the end of the previous assistant turn and the next generation prompt —
rendered against a fixed sentinel conversation and tokenized on its own.
"""

from __future__ import annotations

from functools import lru_cache

_SENTINEL = "\u2063selskill-sentinel\u2063"


class ChatTokens:
    def __init__(self, tokenizer, chat_template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        eos = tokenizer.eos_token
        if eos is None:
            raise ValueError("the tokenizer has no eos_token: cannot tell where an assistant turn ends")
        self.end_of_turn_text = eos
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids(eos)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_forced(self, prefix: str, canonical: str = "") -> list[int]:
        """Tokens that open a turn with `prefix`, cut from the tokenization of `canonical`.

        A prefix tokenized on its own can end on a token boundary the policy never produced:
        a BPE that merges `"}` writes every trained call as `... object "}`, so a forced
        `... object "` is a state no demonstration contains, from which invoke arms continue with
        malformed JSON (docs/benchmarks.md, "Rounds at the tiny scale, and why no local pair ever
        preferred invoking"). The shortest token prefix of the canonical decision
        that covers `prefix` is what the policy itself would have emitted (it may run a few
        characters past `prefix`, e.g. through that `"}`).
        """
        if not canonical:
            return self.encode(prefix)
        if not canonical.startswith(prefix):
            raise ValueError(f"the forced prefix {prefix!r} does not open its decision {canonical!r}")
        ids = self.encode(canonical)
        for n in range(1, len(ids) + 1):
            if self.decode(ids[:n]).startswith(prefix):
                return ids[:n]
        return ids

    def opening(self, messages: list[dict]) -> list[int]:
        """System + first observation, ending with the generation prompt of turn 0."""
        return self.encode(self._render(messages, add_generation_prompt=True))

    def segment(self, message: dict) -> list[int]:
        """Tokens that follow an assistant turn's end-of-turn token, up to the next generation prompt."""
        return list(self._segment(message["role"], message["content"]))

    @lru_cache(maxsize=4096)  # noqa: B019 (one instance per runner; bounded)
    def _segment(self, role: str, content: str) -> tuple[int, ...]:
        base = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _SENTINEL},
        ]
        text = self._render([*base, {"role": role, "content": content}], add_generation_prompt=True)
        marker = _SENTINEL + self.end_of_turn_text
        at = text.rfind(marker)
        if at < 0:
            raise ValueError("the chat template does not end assistant turns with the tokenizer's eos_token")
        return tuple(self.encode(text[at + len(marker) :]))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def split_end(self, ids: list[int]) -> tuple[list[int], bool]:
        """A generation's tokens without its closing end-of-turn token, and whether it had one."""
        ended = bool(ids) and ids[-1] == self.end_of_turn_id
        return (list(ids[:-1]) if ended else list(ids)), ended


def decision_token_index(tokenizer, ids: list[int], char_offset: int) -> int:
    """Index of the token where the decision text (at `char_offset` of the decoded turn) begins.

    The first token whose prefix decodes past the offset: a token that straddles the opening
    tag (a BPE merge of the space before it, say) counts as the decision's.
    """
    if char_offset <= 0:
        return 0
    for i in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:i], skip_special_tokens=False)) > char_offset:
            return i - 1
    return len(ids)
