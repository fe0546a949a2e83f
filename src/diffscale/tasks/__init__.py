"""Diffusion tasks, one folder each (images/, fields/, policy/): data readers and built-in data,
a single-device network, the task class, evaluation, plots and export. The loop, checkpoints,
distributed code, bench and export reach a task only through the ``Task`` protocol (base.py);
registry.py names each task's class. Importing this package loads nothing (no torch)."""
