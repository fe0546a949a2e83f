"""Files diffscale writes and reads back outside checkpoints: output paths checked before any work,
image grids and animations, and a run folder read without torch (status, report, model card)."""
