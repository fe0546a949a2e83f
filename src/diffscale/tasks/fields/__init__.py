"""Conditional field diffusion: the task, its data, its residual MLP, evaluation (CRPS, spread-skill,
rank histograms), plots and export."""
