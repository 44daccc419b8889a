"""What a pipeline run does around its stages: the plan, cron firings, side jobs, services, and the checks before a stage starts (preflight, Slurm's, the fit of the plan)."""
