"""The agent's side of an episode: chat messages in, one parsed decision out per turn.

Callers import the module whose job they need: `turn_format` (the chat format and the exact
decision renderers), `parser` (a turn's text -> action | skill call | malformed),
`transcript`, `runner` (batched episodes) and the rest beside them.
"""
