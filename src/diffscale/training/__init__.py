"""Training: the loop, the run state it steps, one optimizer step (eager or recorded as a
CUDA graph), telemetry, experiment trackers, and the online trainer a running simulation feeds."""
