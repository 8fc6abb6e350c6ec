"""The offline init policy (round 0): demonstrations, tokenizer, a tiny Qwen3, SFT, and DAgger.

What a round starts from when the recipe names no model. `alfworld.py` and `bfcl.py` are
the two builders; `sft.py` is what they share (TRL SFT, the manifest + COMPLETED
contract), `dagger.py` the ALFWorld build's optional DAgger, `demos.py` and `bfcl_demos.py`
the demonstrations. The policy backends the stages sample with are `selskill.policy`.
"""
