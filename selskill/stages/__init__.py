"""The stages of a round (sample, branch, fork, label, eval), the round and the replication.

Each stage is a step (`selskill.executors.base.Step`) built from its recipe sections
(`selskill.config`); it reads the outputs of the stages before it and writes its own
through the run-directory contract (`selskill.data.contract`, `selskill.data.rank_writer`).
"""
