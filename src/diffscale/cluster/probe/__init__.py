"""``diffscale probe``: run a user's command for a bounded time and measure what one rank uses
(/proc, NVML); its result file and its CLI."""
