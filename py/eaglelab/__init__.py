"""eaglelab: run, watch and time EAGLE-3 drafter pipelines on a lab's GPU workstations."""

__version__ = "0.1.0"
