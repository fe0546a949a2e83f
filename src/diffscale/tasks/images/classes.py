"""The classes of a class-conditional image run: the data's labels checked, the classes a user
asks for (names or indices) resolved, and how the asked classes are laid out over a grid."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffscale.errors import UserError
from diffscale.io.media import grid_shape

LABELLED_DATA = ("builtin:glyphs, an image folder with one folder per class (imagefolder:DIR), "
                 "emnist:ROOT[:split] or mnist:ROOT, or an npz holding 'labels'")


def training_classes(found: tuple[torch.Tensor, list[str]] | None, source: str) -> tuple[torch.Tensor, list[str]]:
    """The class index of each training image (N,) int64 and the class names (those the data
    names, else the indices as text), or one line saying the data has no labels."""
    if found is None:
        raise UserError(f"model.class_conditional is on, but data '{source}' has no labels",
                        f"set model.class_conditional to off, or train on labelled data: {LABELLED_DATA}")
    labels, names = found
    labels = labels.long().reshape(-1)
    if labels.numel() and int(labels.min()) < 0:
        raise UserError(f"data '{source}' holds negative labels (e.g. {int(labels.min())}), which name no class",
                        "number the classes from 0, or set model.class_conditional to off")
    count = max(len(names), int(labels.max()) + 1 if labels.numel() else 0)
    names = list(names) + [str(i) for i in range(len(names), count)]
    if count < 2:
        raise UserError(f"data '{source}' holds a single class, so there is nothing to condition on",
                        "set model.class_conditional to off, or add images of other classes")
    return labels, names


def _listed(names: Sequence[str], most: int = 12) -> str:
    shown = ", ".join(names[:most])
    return f"{shown}, ... ({len(names)} in all)" if len(names) > most else shown


def pick_classes(asked: Sequence[str], names: Sequence[str]) -> list[int]:
    """The indices of the classes ``asked`` (each a name, or an index into ``names``; a name is
    matched first, so a class named "3" is that class; comma lists are split)."""
    picked: list[int] = []
    for item in (part.strip() for entry in asked for part in str(entry).split(",")):
        if item in names:
            picked.append(list(names).index(item))
        elif item.isdigit() and int(item) < len(names):
            picked.append(int(item))
        else:
            raise UserError(f"--class '{item}' is not a class of this run (its classes: {_listed(names)})",
                            f"pass a class name or an index from 0 to {len(names) - 1}")
    return picked


def spread(classes: int, count: int) -> list[int]:
    """The classes a grid of ``count`` samples shows when none are asked: one a row, spread evenly
    over the ``classes`` (all of them where the grid has as many rows)."""
    rows = grid_shape(count)[0]
    shown = min(classes, rows)
    return [k * classes // shown for k in range(shown)]


def grid_labels(chosen: Sequence[int], count: int) -> torch.Tensor:
    """The class of each of ``count`` samples (count,) int64: the ``chosen`` classes in turn, a block
    of whole grid rows each (``io/media.make_grid``'s layout) where there are no more of them than
    rows, else a block of samples each."""
    rows, columns = grid_shape(count)
    index = torch.arange(count)
    if len(chosen) <= rows:
        block = (index // columns) * len(chosen) // rows
    else:
        block = index * len(chosen) // count
    return torch.as_tensor(list(chosen), dtype=torch.long)[block]


def balanced_labels(classes: int, count: int) -> torch.Tensor:
    """Every class in turn, ``count`` (count,) int64: the labels quality evaluations generate."""
    return torch.arange(count) % classes
