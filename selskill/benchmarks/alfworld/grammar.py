"""ALFWorld's old command grammar, detected and patched in memory when a game loads.

Many copies of ALFWorld's 2.1.1 game files (`game.tw-pddl`) still carry alfworld's old
grammar: objects are placed with `put X in/on Y` and going somewhere answers "You arrive at
loc N.". alfworld 0.4.2's engine data, our generated games, the skills and the expert all use
the new grammar (`move X to Y`, "You arrive at drawer 8."). Played unpatched, such a game
loads without a word and every placement our side writes is inadmissible (docs/benchmarks.md,
"ALFWorld game files with the old grammar"), so the loader detects the old grammar and, by
default, patches it.

The patch does what alfworld's own `scripts/patch_tw-pddl.py` (alfworld 0.4.2 source tree,
not installed with the wheel) does to the files on disk, but in memory, leaving the files as
they are:

* grammar: the put template `put {o} in/on {r}` becomes `move {o} to {r}`, its feedback "You
  put the {o.name} in/on the {r.name}." becomes "You move the {o.name} to the {r.name}.", and
  the go-to feedback "You arrive at {lend.name}." becomes "You arrive at {r.name}.";
* a `help` action is added to the domain and the grammar (taken from the installed alfworld's
  own `alfred.pddl` / `alfred.twl2`, so the command set equals that of new-grammar games);
* nothing else changes (problem, task text, `solvable`); a stored walkthrough's `put X in/on
  Y` commands are rewritten to `move X to Y` too.

`alfworld_grammar: strict` refuses old-grammar files instead (`OldGrammarError`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

from selskill.benchmarks.alfworld.config import GRAMMAR_MODES

OLD_PUT_TEMPLATE = "put {o} in/on {r}"
NEW_PUT_TEMPLATE = "move {o} to {r}"
OLD_PUT_FEEDBACK = "You put the {o.name} in/on the {r.name}."
NEW_PUT_FEEDBACK = "You move the {o.name} to the {r.name}."
OLD_ARRIVE = "You arrive at {lend.name}."
NEW_ARRIVE = "You arrive at {r.name}."

_PUT_COMMAND_RE = re.compile(r"^put (.+) in/on (.+)$")


class OldGrammarError(ValueError):
    """A game file with alfworld's old grammar met `alfworld_grammar: strict`."""


def check_mode(mode: str) -> str:
    if mode not in GRAMMAR_MODES:
        raise ValueError(f"alfworld_grammar must be one of {', '.join(GRAMMAR_MODES)}; got {mode!r}")
    return mode


def is_old_grammar(game: Mapping) -> bool:
    """True when the game's grammar is alfworld's old one (the put template or the loc arrival)."""
    grammar = game.get("grammar") or ""
    return OLD_PUT_TEMPLATE in grammar or OLD_ARRIVE in grammar


def old_grammar_message(path: str) -> str:
    return (
        f"{path} uses alfworld's old grammar (`put X in/on Y`, 'You arrive at loc N.'), which the skills "
        "and the expert do not speak. Either let the loader patch it in memory (alfworld_grammar: patch, "
        "the default), or patch the files once with alfworld's own script: `python scripts/patch_tw-pddl.py` "
        "from the alfworld 0.4.2 source tree (github.com/alfworld/alfworld), with ALFWORLD_DATA set"
    )


def strict_error(path: str) -> OldGrammarError:
    return OldGrammarError(old_grammar_message(path) + "; alfworld_grammar is strict, so it is refused")


def _shipped(name: str) -> str:
    from selskill.benchmarks.alfworld.generate import domain_text, grammar_text

    return domain_text() if name == "domain" else grammar_text()


@lru_cache(maxsize=1)
def help_action_pddl() -> str:
    """The `(:action help ...)` block of the installed alfworld's `alfred.pddl`."""
    text = _shipped("domain")
    start = text.index("(:action help")
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start : i + 1]
    raise ValueError("alfworld's alfred.pddl has an unbalanced help action")


@lru_cache(maxsize=1)
def help_action_grammar() -> str:
    """The `action help {...}` block of the installed alfworld's `alfred.twl2`."""
    text = _shipped("grammar")
    start = text.index("action help {")
    end = text.index('""";\n}', start) + len('""";\n}')
    return text[start:end]


def patch_game(game: Mapping) -> dict:
    """A copy of `game` moved to the new grammar (the module docstring lists every change)."""
    out = dict(game)
    grammar = out["grammar"]
    for old, new in (
        (OLD_PUT_TEMPLATE, NEW_PUT_TEMPLATE),
        (OLD_PUT_FEEDBACK, NEW_PUT_FEEDBACK),
        (OLD_ARRIVE, NEW_ARRIVE),
    ):
        grammar = grammar.replace(old, new)
    if "action help {" not in grammar:
        grammar = grammar.rstrip("\n") + "\n\n" + help_action_grammar() + "\n"
    out["grammar"] = grammar
    domain = out["pddl_domain"]
    if "(:action help" not in domain:
        before, _, after = domain.rpartition(")")  # the domain's closing parenthesis
        domain = f"{before}\n{help_action_pddl()}\n){after}"
    out["pddl_domain"] = domain
    if out.get("walkthrough"):
        out["walkthrough"] = [_PUT_COMMAND_RE.sub(r"move \1 to \2", c) for c in out["walkthrough"]]
    return out


def load_game(path: str, mode: str) -> tuple[dict, bool]:
    """A game file's data under `mode` ("patch" or "strict"), and whether it was patched."""
    import json

    with open(path) as f:
        data = json.load(f)
    if not is_old_grammar(data):
        return data, False
    if mode == "strict":
        raise strict_error(path)
    return patch_game(data), True
