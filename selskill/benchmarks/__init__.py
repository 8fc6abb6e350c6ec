"""The benchmarks that ship with selskill: each sub-package is one plugin, found by the registry
(`selskill.registry.builtin`) without a list to keep.

`DEFAULT` is the benchmark a recipe plays when it names none, and that of recorded rows that
name none: ALFWorld, the paper's first benchmark and the one selskill's recipes were written for.
"""

DEFAULT = "alfworld"
