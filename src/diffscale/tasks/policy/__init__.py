"""Diffusion policy: the task, demonstration readers, the temporal UNet and pictures of action
chunks. Environments and their rollout loop are shared (diffscale.tasks.policy.envs)."""
