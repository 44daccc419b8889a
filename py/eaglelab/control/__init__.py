"""Controller side: what runs on the machine that drives the lab: the lab core, the run
registry, executors that reach hosts, status, notify, cron, plan, preflight, sync, the CLI."""
