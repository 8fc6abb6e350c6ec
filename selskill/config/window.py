"""The local pairs' loss window (`train_window_n`): its one spelling per meaning and its default.

It lives apart from the train section, which is TRL's `DPOConfig`, because readers of a
run's pairs that train nothing (`selskill export-pairs`, on an install without TRL) name the
same window.
"""

from __future__ import annotations

WINDOW_ALL = "all"  # the one recipe spelling of "every assistant turn after the branch"
DEFAULT_WINDOW_N = "3"  # the paper's n: the train section's default `train_window_n`


def parse_window_n(value: object) -> int | None:
    """`train_window_n` -> the window's one internal value: n >= 1 turns, or None for `all`.

    One spelling per meaning, so that two recipes that mean the same window are spelled the
    same (and a -1 or 0 left over from an older recipe is refused, not read as `all`).
    """
    text = str(value).strip().lower()
    if text == WINDOW_ALL:
        return None
    if text in ("-1", "0", "none", "null", ""):
        raise ValueError(
            f"train_window_n: {value!r} is not a window; every assistant turn after the branch is spelled "
            f"`train_window_n: {WINDOW_ALL}` (otherwise a positive number of assistant turns, e.g. 3)"
        )
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(
            f"train_window_n must be a positive number of assistant turns or '{WINDOW_ALL}'; got {value!r} "
            f"(the paper uses 3; its ablation compares 1, 3 and all)"
        )
    return n
