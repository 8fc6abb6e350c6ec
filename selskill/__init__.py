"""selskill: preference data and DPO training that teach agents when to invoke a skill."""

__version__ = "0.1.0"
