"""selskill: preference data and DPO training that teach agents when to invoke a skill.

The loaders of `selskill.api` (`load_pairs`, `load_rollouts`, ...) are reachable from here
but imported on first use, so that `import selskill` stays cheap: it loads neither torch,
transformers, datasets nor pyarrow.
"""

__version__ = "0.1.0"

_API = (
    "export_pairs",
    "load_branches",
    "load_eval",
    "load_forks",
    "load_pairs",
    "load_rollouts",
    "load_stage",
    "rounds",
)
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from selskill import api

        return getattr(api, name)
    raise AttributeError(f"module 'selskill' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
