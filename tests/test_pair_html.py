"""selskill.outputs.pair_html: pair HTML marks the branch point, highlights exactly the masked-in
tokens, colours by role, escapes text; filters and the yield table."""

from html.parser import HTMLParser

import pytest

from selskill.outputs import pair_html as si


class _Spans(HTMLParser):
    """Token spans and branch markers with the section they sit in (prefix/chosen/rejected)."""

    def __init__(self):
        super().__init__()
        self.stack: list[str | None] = []
        self.tokens: list[dict] = []
        self.markers: list[tuple[str, int]] = []  # (section, number of tokens seen in it before)
        self.text: list[str] = []

    def section(self):
        return next((s for s in reversed(self.stack) if s), None)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        sec = None
        if tag == "details" and "prefix" in classes:
            sec = "prefix"
        elif tag == "div" and "side" in classes:
            sec = "chosen" if "chosen" in classes else "rejected"
        if tag in (
            "div",
            "details",
            "span",
            "table",
            "tr",
            "td",
            "th",
            "h4",
            "summary",
            "b",
            "thead",
            "tbody",
        ):
            self.stack.append(sec)
        if tag == "span" and "tok" in classes:
            self.tokens.append({"section": self.section(), "classes": set(classes), "i": int(a["data-i"])})
        if tag == "span" and si.BRANCH_CLASS in classes:
            sec = self.section()
            self.markers.append((sec, sum(1 for t in self.tokens if t["section"] == sec)))

    def handle_endtag(self, tag):
        if tag in (
            "div",
            "details",
            "span",
            "table",
            "tr",
            "td",
            "th",
            "h4",
            "summary",
            "b",
            "thead",
            "tbody",
        ):
            self.stack.pop()

    def handle_data(self, data):
        if self.tokens and self.stack and self.stack[-1] is None:
            self.text.append(data)


def parse(html: str) -> _Spans:
    p = _Spans()
    p.feed(html)
    return p


# the trainer's n=3 window of make_pair's sides (turn 3 and non-assistant tokens outside)
MASK_N3 = {"chosen": [1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0], "rejected": [1, 1, 0, 1, 0]}


def make_pair(prefix_len=5, kind="local"):
    return {
        "pair_id": "local/a>b",
        "kind": kind,
        "task_id": "train/x/t0",
        "task_type": "pick_and_place_simple",
        "round": 1,
        "prompt_ids": list(range(100, 100 + prefix_len)),
        #                 branch turn        obs      turn 1     skill ret  turn 2  turn 3 (outside n=3)
        "chosen_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
        "chosen_role": [1, 1, 2, 2, 1, 1, 3, 3, 1, 2, 1, 1],
        "chosen_turn": [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3],
        "rejected_ids": [21, 22, 23, 24, 25],
        "rejected_role": [1, 1, 3, 1, 2],
        "rejected_turn": [0, 0, 0, 1, 1],
        "label_reason": "efficiency",
        "chosen_success": True,
        "rejected_success": True,
        "chosen_steps": 4,
        "rejected_steps": 9,
        "chosen_arm": "skip",
        "rejected_arm": "invoke",
        "branch_id": "b0",
        "branch_pool": "post_skill",
        "branch_score": 1.25,
        "branch_strategy": "entropy",
        "candidate_skill": "heat_object",
        "chosen_source": "fork/skip0",
        "rejected_source": "fork/invoke0",
    }


def test_branch_point_marked_once_per_side_before_the_completion():
    p = parse(si.render_pair(make_pair()))
    assert sorted(p.markers) == [("chosen", 0), ("rejected", 0)]
    n = {s: sum(1 for t in p.tokens if t["section"] == s) for s in ("prefix", "chosen", "rejected")}
    assert n == {"prefix": 5, "chosen": 12, "rejected": 5}
    # completion token positions continue after the prefix
    assert [t["i"] for t in p.tokens if t["section"] == "chosen"] == list(range(5, 17))


def test_exactly_the_masked_in_tokens_are_highlighted():
    pair = make_pair()
    p = parse(si.render_pair(pair))
    for side in ("chosen", "rejected"):
        toks = [t for t in p.tokens if t["section"] == side]
        highlighted = [k for k, t in enumerate(toks) if si.IN_LOSS in t["classes"]]
        assert highlighted == [k for k, m in enumerate(MASK_N3[side]) if m == 1]
    assert not any(si.IN_LOSS in t["classes"] for t in p.tokens if t["section"] == "prefix")


def test_tokens_are_coloured_by_role():
    pair = make_pair()
    p = parse(si.render_pair(pair, prompt_roles=[0, 0, 1, 2, 3]))
    for side in ("chosen", "rejected"):
        toks = [t for t in p.tokens if t["section"] == side]
        assert [next(c for c in t["classes"] if c.startswith("r-")) for t in toks] == [
            si.ROLE_CLASSES[r] for r in pair[f"{side}_role"]
        ]
    prefix = [t for t in p.tokens if t["section"] == "prefix"]
    assert [si.ROLE_CLASSES[r] in t["classes"] for r, t in zip([0, 0, 1, 2, 3], prefix, strict=True)] == [
        True
    ] * 5
    # without prefix roles the prefix is neutral
    assert all(
        si.UNKNOWN_ROLE in t["classes"]
        for t in parse(si.render_pair(pair)).tokens
        if t["section"] == "prefix"
    )


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        (i,) = ids
        return {1: "<script>alert(1)</script>", 2: 'a "quoted" & <b>'}.get(i, f"t{i}")


def test_decoded_text_is_escaped():
    html = si.render_pair(make_pair(), tokenizer=FakeTokenizer())
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "a &#34;quoted&#34; &amp; &lt;b&gt;" in html  # (markupsafe's entity for ")
    assert ">t3<" in html  # decoded, not ids
    bad = make_pair() | {"pair_id": "<img src=x onerror=alert(1)>", "task_type": "</td>"}
    out = si.render_pair(bad)
    assert "<img src=x" not in out and "</td></td>" not in out


def test_token_ids_without_tokenizer():
    html = si.render_pair(make_pair())
    assert 'data-i="5" title="#5 id=1 role=assistant turn=0 loss=1">1</span>' in html


def test_long_prefix_is_collapsed_and_truncated():
    pair = make_pair(prefix_len=1000)
    html = si.render_pair(pair, max_prefix_tokens=100)
    p = parse(html)
    prefix = [t["i"] for t in p.tokens if t["section"] == "prefix"]
    assert (
        len(prefix) == 100 and prefix[0] == 0 and prefix[-1] == 999
    )  # head and the tokens right before the branch
    assert "900 prefix tokens omitted" in html
    assert '<details class="prefix"><summary>' in html  # collapsed (not open)
    assert '<details class="prefix" open>' in si.render_pair(make_pair())


def test_prefix_roles_from_sources():
    pair = make_pair()
    src = {"fork/skip0": {"token_ids": pair["prompt_ids"] + [1, 2], "role": [0, 0, 1, 1, 2, 1, 1]}}
    assert si.prefix_roles(pair, src) == [0, 0, 1, 1, 2]
    wrong = {"fork/skip0": {"token_ids": [9] * 7, "role": [0] * 7}}
    assert si.prefix_roles(pair, wrong) is None and si.prefix_roles(pair, {}) is None


PAIRS = [
    {
        "round": 1,
        "kind": "episode",
        "label_reason": "success_vs_failure",
        "task_type": "a",
        "chosen_arm": "",
        "chosen_steps": 10,
        "rejected_steps": 30,
    },
    {
        "round": 1,
        "kind": "local",
        "label_reason": "efficiency",
        "task_type": "a",
        "chosen_arm": "skip",
        "chosen_steps": 3,
        "rejected_steps": 5,
    },
    {
        "round": 1,
        "kind": "local",
        "label_reason": "efficiency",
        "task_type": "b",
        "chosen_arm": "invoke",
        "chosen_steps": 2,
        "rejected_steps": 6,
    },
    {
        "round": 1,
        "kind": "local",
        "label_reason": "success_vs_failure",
        "task_type": "b",
        "chosen_arm": "invoke",
        "chosen_steps": 4,
        "rejected_steps": 20,
    },
]


def test_filters():
    assert len(si.filter_pairs(PAIRS)) == 4
    assert len(si.filter_pairs(PAIRS, kind="local")) == 3
    assert len(si.filter_pairs(PAIRS, kind="local", reason="efficiency")) == 2
    assert len(si.filter_pairs(PAIRS, task_type=["b"])) == 2
    assert len(si.filter_pairs(PAIRS, kind="local", reason="efficiency", task_type="b")) == 1
    assert si.filter_pairs(PAIRS, kind="nope") == []


def test_yield_rows_and_table():
    rows = si.yield_rows(PAIRS, n_tasks={1: 2})
    got = {(r["kind"], r["label_reason"]): r for r in rows}
    assert got[("local", "efficiency")]["pairs"] == 2
    assert got[("local", "efficiency")]["pairs_per_task"] == 1.0
    assert got[("local", "efficiency")]["invoke_preferred_share"] == 0.5
    assert got[("local", "efficiency")]["mean_chosen_steps"] == 2.5
    assert got[("episode", "success_vs_failure")]["invoke_preferred_share"] is None
    assert si.yield_rows(PAIRS)[0]["pairs_per_task"] is None
    html = si.yield_table(PAIRS, n_tasks=2)
    assert html.count("<tr>") == 1 + 3 + 1  # header, 3 groups, total
    assert "<td>all</td><td></td><td></td><td>4</td>" in html


def test_html_table_escapes():
    html = si.html_table(["<a>"], [["x & y"]])
    assert "&lt;a&gt;" in html and "x &amp; y" in html


@pytest.mark.parametrize("kind", ["episode", "local"])
def test_meta_mentions_kind_and_window(kind):
    html = si.render_pair(make_pair(kind=kind))
    assert f"{kind} / efficiency" in html
    # the window the trainer builds: n turns for local pairs, every assistant turn for episode pairs
    assert ("first 3 assistant turns" in html) == (kind == "local")
    assert ("all assistant turns" in html) == (kind == "episode")
    assert "first 1 assistant turns" in si.render_pair(make_pair(), window_n=1)
    assert ("branch</b>" in html) == (kind == "local")


def _with_messages(pair: dict) -> dict:
    """make_pair's sides as the chat messages a label-stage row carries (one assistant message per turn)."""
    import json

    chosen = [
        {"role": "assistant", "content": "<action>heat</action>"},
        {"role": "user", "content": "You heat it."},
        {"role": "assistant", "content": '<tool_call>{"name": "heat_object"}'},
        {"role": "tool", "content": "heated <b>"},
        {"role": "assistant", "content": "<action>put</action>"},
        {"role": "user", "content": "Done."},
        {"role": "assistant", "content": "<action>look</action>"},
    ]
    rejected = [
        {"role": "assistant", "content": '<tool_call>{"name": "heat_object"}'},
        {"role": "assistant", "content": "<action>go to desk 1</action>"},
    ]
    prompt = [{"role": "system", "content": "protocol & skills"}, {"role": "user", "content": "heat an egg"}]
    return pair | {
        "prompt_messages": json.dumps(prompt),
        "chosen_messages": json.dumps(chosen),
        "rejected_messages": json.dumps(rejected),
    }


class _Messages(HTMLParser):
    def __init__(self):
        super().__init__()
        self.messages: list[dict] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and "msg" in (a.get("class") or "").split():
            self.messages.append({"classes": set(a["class"].split()), "title": a["title"]})


@pytest.mark.parametrize("window_n, trained", [(1, {"chosen": [0], "rejected": [0]}), (3, None)])
def test_without_a_tokenizer_the_pair_is_its_messages_with_the_window_highlighted(window_n, trained):
    """Token ids say nothing to a reader: a row that carries its messages is shown as them, as text, and the
    assistant turns the trainer's window covers (its loss_mask, in turns) are the highlighted ones."""
    pair = _with_messages(make_pair())
    html = si.render_pair(pair, window_n=window_n)
    assert 'class="tok ' not in html and " id=" not in html
    assert "protocol &amp; skills" in html and "heated &lt;b&gt;" in html  # escaped
    assert "shared prefix: 2 messages, 5 tokens" in html
    p = _Messages()
    p.feed(html)
    assert len(p.messages) == 2 + 7 + 2
    by_side = {"chosen": p.messages[2:9], "rejected": p.messages[9:]}
    # chosen turns 0-3 are assistant messages 0, 2, 4, 6; the n=3 window holds turns 0-2 (MASK_N3)
    expected = trained or {"chosen": [0, 1, 2], "rejected": [0, 1]}
    for side, messages in by_side.items():
        assistant = [m for m in messages if "r-assistant" in m["classes"]]
        assert [i for i, m in enumerate(assistant) if si.IN_LOSS in m["classes"]] == expected[side]
        assert all(si.IN_LOSS not in m["classes"] for m in messages if "r-assistant" not in m["classes"])
    assert {m["title"].split(": ")[1].split(",")[0] for m in by_side["chosen"]} == {
        "assistant",
        "user",
        "tool",
    }
    # with a tokenizer, or without messages in the row, tokens as before
    assert 'class="tok ' in si.render_pair(make_pair(), window_n=window_n)
