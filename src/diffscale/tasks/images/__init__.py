"""Image diffusion: the task, its data readers and built-in data, its UNet, its diffusers export."""
