"""Conditional field data: pairs of a condition ``cond`` (N, C) and a field ``x`` (N, D) or (N, D, K).

Specs (``data.source`` when ``task: fields``):

* ``builtin:fields[:N]`` -- the synthetic coarse -> fine generator below (N pairs, default 16384).
* ``npz:PATH`` -- a NumPy archive with arrays ``cond`` (N x C) and ``x`` (N x D or N x D x K).

Data that arrives while training (``online:POLICY:N``, ``spool:DIR[:N]``) fills a replay buffer
instead (``data/buffer.py``, ``data/spool.py``).

The built-in generator mimics the users' coupling case (a coarse cell and its six hexagonal
neighbours -> 16 x 16 fine values inside the cell) and its ideal probabilistic forecast is
known in closed form: given the condition, the fine field is Gaussian with a known mean and
covariance. So the CRPS of a perfect model can be computed and a trained model's measured.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from diffscale.config import FieldModelConfig
from diffscale.errors import UserError

BUILTIN_ITEMS = 16384
"""Pairs in ``builtin:fields`` unless the spec names a count."""
BUILTIN_SEED = 0
"""Seed of the built-in training pairs (fixed: every run trains on the same data)."""
HELD_OUT_SEED = 1
"""Seed of held-out pairs for evaluation (never the training stream)."""
SOURCES = ("builtin:fields[:N] or npz:PATH (arrays cond: N x C, x: N x D or N x D x K), or spool:DIR[:N] "
           "(a directory a simulation writes while training runs)")


@dataclass(frozen=True, kw_only=True)
class FieldGenerator:
    """Coarse -> fine pairs with a closed-form ideal forecast.

    The condition is the coarse value of a cell and its six hexagonal neighbours, drawn
    from a Gaussian with exponential correlation over their centres. The fine field on a
    ``side`` x ``side`` grid inside the cell is ``mean(c) + sigma(c) * e``: ``mean`` is the
    quadratic surface through the coarse values (centre value, least-squares gradient and
    curvature), shifted so its cell average is exactly the centre value; ``e`` is
    zero-mean Gaussian-process noise (squared-exponential kernel) projected to a zero cell
    average, so every true field conserves the coarse value; ``sigma(c)`` grows with the
    coarse gradient (more sub-grid variability across fronts).
    """

    side: int = 16
    """Fine grid points per side (D = side ** 2)."""
    coarse_length: float = 1.5
    """Correlation length of the coarse values, in cell spacings."""
    fine_length: float = 0.15
    """Length scale of the fine noise, in cell widths."""
    noise_base: float = 0.3
    """Noise amplitude where the coarse field is flat."""
    noise_gradient: float = 0.5
    """Extra noise amplitude per unit of coarse gradient."""

    @property
    def cond_dim(self) -> int:
        return 7

    @property
    def x_dim(self) -> int:
        return self.side * self.side

    def _geometry(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Hex directions (6, 2), fine points (D, 2) in the unit cell, the cell-averaged |p|^2."""
        angles = np.arange(6) * math.pi / 3
        hexdirs = np.stack([np.cos(angles), np.sin(angles)], axis=1)
        ticks = (np.arange(self.side) + 0.5) / self.side - 0.5
        grid = np.stack(np.meshgrid(ticks, ticks, indexing="ij"), axis=-1).reshape(-1, 2)
        return hexdirs, grid, (grid ** 2).sum(1)

    def mean_operator(self) -> np.ndarray:
        """(D, 7) linear map from the condition to the ideal mean field."""
        hexdirs, grid, r2 = self._geometry()
        # Least squares over the 6 unit directions: sum d d^T = 3 I, so g = sum_k d_k (c_k - c_0) / 3.
        grad = np.zeros((2, 7))
        grad[:, 1:] = hexdirs.T / 3
        grad[:, 0] = -hexdirs.sum(0) / 3
        curvature = np.full(7, 1 / 6)
        curvature[0] = -1.0
        centre = np.zeros(7)
        centre[0] = 1.0
        return centre[None, :] + grid @ grad + (r2 - r2.mean())[:, None] * curvature[None, :]

    def noise_factor(self) -> np.ndarray:
        """(D, D) matrix L with L L^T the covariance of the unit noise ``e`` (zero cell average)."""
        _, grid, _ = self._geometry()
        dist2 = ((grid[:, None, :] - grid[None, :, :]) ** 2).sum(-1)
        kernel = np.exp(-dist2 / (2 * self.fine_length ** 2)) + 1e-6 * np.eye(len(grid))
        centring = np.eye(len(grid)) - 1.0 / len(grid)
        return centring @ np.linalg.cholesky(kernel)

    def sigma(self, cond: torch.Tensor) -> torch.Tensor:
        """(N,) noise amplitude for conditions (N, 7)."""
        hexdirs = torch.as_tensor(self._geometry()[0], dtype=cond.dtype)
        grad = (cond[:, 1:] - cond[:, :1]) @ hexdirs / 3
        return self.noise_base + self.noise_gradient * grad.norm(dim=1)

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """(n, 7) coarse values: the cell first, then its six neighbours anticlockwise."""
        hexdirs = self._geometry()[0]
        points = np.concatenate([np.zeros((1, 2)), hexdirs])
        dist = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
        factor = torch.as_tensor(np.linalg.cholesky(np.exp(-dist / self.coarse_length)), dtype=torch.float32)
        return torch.randn((n, 7), generator=generator) @ factor.T

    def fields_for(self, cond: torch.Tensor, generator: torch.Generator, members: int = 1) -> torch.Tensor:
        """(N, members, D) draws from the ideal predictive distribution of conditions (N, 7)."""
        mean, factor = self._operators(cond.dtype)
        z = torch.randn((cond.shape[0], members, self.x_dim), generator=generator, dtype=cond.dtype)
        return (cond @ mean.T)[:, None] + self.sigma(cond)[:, None, None] * (z @ factor.T)

    def sample(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` pairs: cond (n, 7), x (n, D), float32, from ``seed``."""
        generator = torch.Generator().manual_seed(seed)
        cond = self.conditions(n, generator)
        return cond, self.fields_for(cond, generator)[:, 0]

    def ideal(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and standard deviation (N, D) of each fine value given conditions (N, 7)."""
        mean, factor = self._operators(cond.dtype)
        point_std = (factor ** 2).sum(1).sqrt()
        return cond @ mean.T, self.sigma(cond)[:, None] * point_std[None, :]

    def _operators(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.as_tensor(self.mean_operator(), dtype=dtype),
                torch.as_tensor(self.noise_factor(), dtype=dtype))


@dataclass
class FieldData:
    """Loaded pairs, float32 on the CPU; ``generator`` is set for built-in data (ideal forecast known)."""

    cond: torch.Tensor
    """(N, C) conditions."""
    x: torch.Tensor
    """(N, D) or (N, D, K) fields."""
    label: str
    """Where the data came from, for the banner."""
    generator: FieldGenerator | None = field(default=None)

    def describe(self) -> str:
        shape = " x ".join(str(s) for s in self.x.shape[1:])
        return f"{self.label} ({self.x.shape[0]} pairs, cond {self.cond.shape[1]} -> x {shape})"


def load_fields(spec: str, *, max_items: int = 0) -> FieldData:
    """Resolve a data spec (see the module docstring); ``max_items`` keeps the first rows (0: all)."""
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "builtin":
        data = _builtin(spec, rest)
    elif kind == "spool":  # FieldTask follows it into a buffer; it is never read whole
        raise UserError(f"data source '{spec}' is a spool directory, which is followed while training, "
                        "not read at once",
                        "train on it with diffscale train --data spool:DIR[:N], or merge its files into one npz:PATH")
    elif kind == "npz":
        if not rest:
            raise UserError(f"data source '{spec}' has no path", "write npz:PATH")
        data = read_npz(Path(rest))
    else:
        raise UserError(f"data source '{spec}' is not field data", f"for task fields use {SOURCES}")
    if max_items:
        data.cond, data.x = data.cond[:max_items], data.x[:max_items]
    return data


def _builtin(spec: str, rest: str) -> FieldData:
    name, _, count = rest.partition(":")
    if name not in ("", "fields"):  # plain ``builtin`` is each task's own built-in data
        raise UserError(f"data source '{spec}' holds images, not fields",
                        "for task fields use builtin:fields[:N] or npz:PATH (data.source, or --data)")
    if count and not (count.isdigit() and int(count) > 0):
        raise UserError(f"data source '{spec}': '{count}' is not a positive number of pairs",
                        "write builtin:fields or builtin:fields:N, e.g. builtin:fields:3840")
    generator = FieldGenerator()
    cond, x = generator.sample(int(count) if count else BUILTIN_ITEMS, BUILTIN_SEED)
    return FieldData(cond, x, "builtin:fields", generator)


def read_npz(path: Path) -> FieldData:
    """Read ``cond`` (N, C) and ``x`` (N, D) or (N, D, K) from a ``.npz`` archive, as float32."""
    fix = "save it with numpy.savez(PATH, cond=cond, x=x): cond N x C, x N x D (or N x D x K)"
    if not path.is_file():
        raise UserError(f"array file '{path}' does not exist", "check the path given to --data npz:PATH")
    try:
        # opened here: np.load leaves the file open when the archive turns out truncated
        with open(path, "rb") as fid, np.load(fid, allow_pickle=False) as archive:
            missing = [k for k in ("cond", "x") if k not in archive.files]
            if missing:
                raise UserError(f"array file '{path}' has no array {' or '.join(repr(k) for k in missing)} "
                                f"(it holds: {', '.join(archive.files) or 'nothing'})", fix)
            cond, x = archive["cond"], archive["x"]
    except UserError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # not an archive, truncated, or pickled objects
        raise UserError(f"cannot read array file '{path}' ({exc})", fix) from exc
    for name, array, dims in (("cond", cond, (2,)), ("x", x, (2, 3))):
        if array.ndim not in dims:
            raise UserError(f"array '{name}' in '{path}' has shape {array.shape}", fix)
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise UserError(f"array '{name}' in '{path}' has dtype {array.dtype}", "store numbers (float32 or float64)")
    if cond.shape[0] != x.shape[0]:
        raise UserError(f"'{path}' holds {cond.shape[0]} conditions but {x.shape[0]} fields",
                        "store one condition row per field (cond and x share their first dimension)")
    if cond.shape[0] == 0 or min(cond.shape[1:] + x.shape[1:]) == 0:
        raise UserError(f"array file '{path}' holds no data (cond {cond.shape}, x {x.shape})", fix)
    tensors = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in (cond, x)]
    for name, tensor in zip(("cond", "x"), tensors, strict=True):
        bad = ~torch.isfinite(tensor.reshape(tensor.shape[0], -1)).all(dim=1)
        if bad.any():
            rows = bad.nonzero()[:, 0]
            raise UserError(f"array '{name}' in '{path}' holds NaN or infinite values in {len(rows)} rows "
                            f"(first: row {int(rows[0])})", "drop or fill those rows before training")
    return FieldData(tensors[0], tensors[1], f"npz:{path}")


def sizes_of_data(m: FieldModelConfig, data: FieldData) -> tuple[int, int, int]:
    """(C, D, K) of the data, checked against the sizes the config sets (0 follows the data)."""
    cond_dim, x_dim = data.cond.shape[1], data.x.shape[1]
    fields = data.x.shape[2] if data.x.dim() == 3 else 1
    for name, found, wanted in (("cond_dim", cond_dim, m.cond_dim), ("x_dim", x_dim, m.x_dim),
                                ("fields", fields, m.fields)):
        if wanted and found != wanted:
            raise UserError(f"config model.{name} is {wanted} but {data.label} has {found}",
                            f"set model.{name} to {found}" + (" (or 0 to follow the data)" if name != "fields" else ""))
    return cond_dim, x_dim, fields


def sizes_of_signature(m: FieldModelConfig, signature: dict[str, Any] | None) -> tuple[int, int, int]:
    """(C, D, K) from a checkpoint's signature, else from the config (which must then set them)."""
    if signature is not None and signature.get("task", "fields") != "fields":
        raise UserError(f"the checkpoint was written by a '{signature.get('task')}' run, not a fields run",
                        "point at a run trained with task: fields")
    sig = signature or {}
    cond_dim, x_dim = int(sig.get("cond_dim", m.cond_dim)), int(sig.get("x_dim", m.x_dim))
    if not cond_dim or not x_dim:
        raise UserError("the field sizes are unknown without data (model.cond_dim / model.x_dim are 0)",
                        "set model.cond_dim and model.x_dim, or load the sizes from a checkpoint")
    return cond_dim, x_dim, int(sig.get("fields", m.fields))
