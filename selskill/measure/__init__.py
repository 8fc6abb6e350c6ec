"""What a run's numbers are: the paper's metrics over rollout rows (`metrics`) and the skills'
headroom, with-skills against no-skills on the same tasks (`headroom`).

The stages, the report and `selskill bench` all compute their figures here, so a metric has
one definition whichever of them shows it.
"""
