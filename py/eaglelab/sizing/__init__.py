"""What fits: GPU memory, host RAM, disk and time per stage, from the model's own numbers (issue 28).

Pure arithmetic on frozen dataclasses, stdlib and PyYAML only (no torch), so that the controller's
`lab plan --offline` and a host alike can import it:

  facts.py     the model's shape (from its config.json, or a facts file kept with the profile), the
               hosts' capacities and the workload's priors, each figure with its source
  memory.py    GPU memory per GPU: a vLLM server (weights / TP, KV cache, margin) and the drafter's
               training (parameters, gradients, optimizer state, frozen weights, activations, the
               offline-acceptance copy)
  timeline.py  every stage's GPUs, memory, RAM, disk and time, what runs beside what, and what does
               not fit (a GPU, a disk, a time budget), with the fix
"""
