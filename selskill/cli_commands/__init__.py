"""The commands of `selskill`, one module per family; `selskill.cli` builds the parser from their lists.

A benchmark's own commands (`alfworld.py`) are gathered separately, by
`selskill.cli.benchmark_commands`, so that the core lists name no benchmark.
"""
