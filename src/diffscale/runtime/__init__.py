"""What a run runs on: device and precision policy, the process group, parallelism and
compilation applied from outside the network, checkpoints, signals, host resources and readings."""
