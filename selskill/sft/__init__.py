"""The offline init policy (round 0): what every benchmark's init builder shares.

What a round starts from when the recipe names no model. Each benchmark plugin builds its
own (`selskill/benchmarks/<name>/init_policy.py`: its demonstrations, then these): `build.py`
is the TRL SFT, the manifest and the COMPLETED contract; `demos.py` the record of a
demonstration and the prompts it is written in. The policy backends the stages sample with
are `selskill.policy`.
"""
