"""The tailer: follow growing logs incrementally (byte offsets, constant memory) into state JSON."""

from .run import follow_run, run_state

__all__ = ["follow_run", "run_state"]
