"""The stages of a round (sample, branch, fork, label, eval), the round and the replication.

Each stage reads its recipe sections (`selskill.config`) and the outputs of the stages
before it, and writes its own through the run-directory contract (`selskill.data.layout`).
"""
