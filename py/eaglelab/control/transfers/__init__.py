"""Moving things between hosts: a run's log mirror, a stage's outputs, the project and its wheels."""
