"""Data sources (built-in, image folders, arrays, torchvision sets) and on-device batching."""
