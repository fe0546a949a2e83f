"""The images as the common hand-written loop reads them (``diffscale bench``'s plain recipe): a
Dataset of uint8 rows on the CPU and a collate function doing the augmentation in loader workers."""

from __future__ import annotations

import torch

from diffscale.data.device_loader import shift_augment


class ImageRows(torch.utils.data.Dataset):
    """uint8 images (N, C, H, W) on the CPU, one per item, as a user's Dataset serves them."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.images[index]


class ShiftCollate:
    """Scaling and shift augmentation in the loader workers, on the CPU, as torchvision transforms would do it."""

    def __init__(self, max_shift: int, seed: int) -> None:
        self.max_shift = max_shift
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, items: list[torch.Tensor]) -> torch.Tensor:
        images = torch.stack(items).float() / 127.5 - 1.0
        if self.max_shift:
            shifts = torch.randint(-self.max_shift, self.max_shift + 1, (images.shape[0], 2), generator=self.generator)
            images = shift_augment(images, shifts, self.max_shift)
        return images
