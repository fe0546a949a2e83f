"""Built-in data that ships inside installed dependencies: nothing is downloaded.

* ``glyphs``: digits 0-9 and letters A-Z rendered from the fonts matplotlib ships
  (DejaVu, STIX, Computer Modern), each with several seeded rotations and scales.
* ``numerals``: only the digits 0-9 from those fonts (10 classes: the CPU demo learns them in minutes).
* ``digits``: the 1,797 real handwritten 8x8 digits scikit-learn ships.
* ``mix``: both, with 20 jittered renders per glyph (~11k images; the GPU presets' default).

Every image is white-on-black ``uint8`` of shape (N, 1, S, S).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import string
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from diffscale.errors import UserError
from diffscale.io.atomic import atomic_path
from diffscale.io.paths import cache_dir

GLYPH_CHARS = string.digits + string.ascii_uppercase
GLYPH_FONTS = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf",
)
VARIANTS = ("glyphs", "numerals", "digits", "mix")
_RENDER_PX = 48  # render large, then area-downsample: smooth strokes at any target size


def _package_dir(name: str, fix: str) -> Path:
    """Where an installed package lives, found without importing it (importing matplotlib or
    scikit-learn takes seconds; the built-in data needs only files they ship)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the built-in data needs the package '{name}', which is not installed", fix)
    return Path(next(iter(spec.submodule_search_locations)))


def _font_dir() -> Path:
    return _package_dir("matplotlib", "pip install matplotlib, or use --data builtin:digits") / "mpl-data/fonts/ttf"


@functools.lru_cache(maxsize=1)
def _digits_table() -> np.ndarray:
    """scikit-learn's digits file: (1797, 65) floats, 64 pixels (0..16) and the digit; read as
    ``sklearn.datasets.load_digits`` reads it."""
    path = _package_dir("sklearn", "pip install scikit-learn, or use --data builtin:glyphs")
    return np.loadtxt(path / "datasets" / "data" / "digits.csv.gz", delimiter=",")


def render_glyphs(size: int, *, chars: str = GLYPH_CHARS, variants_per_glyph: int = 6, seed: int = 0) -> torch.Tensor:
    """Render every glyph in every font with seeded rotation/scale jitter -> (N, 1, size, size) uint8."""
    return _to_size(_rendered(chars, variants_per_glyph, seed), size)


@functools.lru_cache(maxsize=4)
def _rendered(chars: str, variants_per_glyph: int, seed: int) -> torch.Tensor:
    """The glyphs at render size, float (N, 1, 48, 48); cached: rendering takes seconds."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    images: list[np.ndarray] = []
    for font_name in GLYPH_FONTS:
        path = _font_dir() / font_name
        if not path.is_file():
            continue
        fonts: dict[int, ImageFont.FreeTypeFont] = {}  # loading a font file costs more than rendering with it
        for char in chars:
            for _ in range(variants_per_glyph):
                px = int(_RENDER_PX * rng.uniform(0.7, 0.9))
                font = fonts.get(px)
                if font is None:
                    font = fonts[px] = ImageFont.truetype(str(path), px)
                canvas = Image.new("L", (_RENDER_PX, _RENDER_PX), 0)
                draw = ImageDraw.Draw(canvas)
                left, top, right, bottom = draw.textbbox((0, 0), char, font=font)
                x = (_RENDER_PX - (right - left)) / 2 - left
                y = (_RENDER_PX - (bottom - top)) / 2 - top
                draw.text((x, y), char, fill=255, font=font)
                canvas = canvas.rotate(float(rng.uniform(-12, 12)), resample=Image.Resampling.BILINEAR)
                images.append(np.asarray(canvas))
    if not images:
        raise UserError("no fonts found for the built-in glyphs data set",
                        "reinstall matplotlib, or use --data builtin:digits")
    return torch.from_numpy(np.stack(images)).unsqueeze(1).float()


def load_digits(size: int) -> torch.Tensor:
    """scikit-learn's handwritten digits (values 0..16) -> (1797, 1, size, size) uint8."""
    raw = torch.from_numpy(_digits_table()[:, :-1].reshape(-1, 8, 8)).float() * (255.0 / 16.0)
    # Pad one pixel so strokes do not touch the border once upscaled, like the glyphs.
    raw = F.pad(raw.unsqueeze(1), (1, 1, 1, 1))
    return _to_size(raw, size)


def _to_size(images: torch.Tensor, size: int) -> torch.Tensor:
    if images.shape[-1] > size:
        out = F.interpolate(images, size=(size, size), mode="area")
    else:
        out = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return out.round().clamp(0, 255).to(torch.uint8)


CACHE_FORMAT = 1
"""Bump when rendering changes: cached images of an older format are rendered again."""


def _cache_file(variant: str, size: int) -> Path:
    from importlib.metadata import PackageNotFoundError, version

    versions = []
    for package in ("matplotlib", "pillow", "scikit-learn"):  # the fonts, the renderer, the digits
        try:
            versions.append(version(package))
        except PackageNotFoundError:
            versions.append("-")
    key = hashlib.sha256(repr((CACHE_FORMAT, variant, size, versions)).encode()).hexdigest()[:16]
    return cache_dir() / "builtin" / f"{variant}-{size}px-{key}.npy"


def load_builtin(variant: str, size: int) -> torch.Tensor:
    """The built-in images (N, 1, size, size) uint8. Rendered once, then read from the cache
    folder: rendering takes seconds at every start (docs/decisions.md, "Built-in data and bytecode
    cached"), reading the file milliseconds."""
    variant = variant or "glyphs"
    if variant not in VARIANTS:
        raise UserError(f"unknown built-in data set '{variant}'",
                        f"use one of: {', '.join('builtin:' + v for v in VARIANTS)}")
    path = _cache_file(variant, size)
    try:
        cached = np.load(path, allow_pickle=False)
        if cached.dtype == np.uint8 and cached.ndim == 4 and cached.shape[1:] == (1, size, size) and len(cached):
            return torch.from_numpy(cached)
    except (OSError, ValueError):  # not there yet, unreadable or cut short: render again
        pass
    images = _render_builtin(variant, size)
    with contextlib.suppress(OSError):  # a cache only: where it cannot be written, the next start renders again
        with atomic_path(path) as tmp:
            np.save(tmp, images.numpy(), allow_pickle=False)
    return images


def builtin_labels(variant: str, count: int) -> tuple[torch.Tensor, list[str]]:
    """The class of each of the ``count`` images ``load_builtin(variant, ...)`` returns: (count,)
    int64 indices into the class names (the characters), in the order the images are rendered
    (font, character, jittered variant) and, for ``mix``, scikit-learn's digits after the glyphs."""
    variant = variant or "glyphs"
    names = list(string.digits if variant in ("numerals", "digits") else GLYPH_CHARS)
    digits = (torch.from_numpy(_digits_table()[:, -1].astype(np.int64)) if variant in ("digits", "mix")
              else torch.zeros(0))
    if variant == "digits":
        return digits[:count], names
    per_glyph = {"glyphs": 6, "numerals": 12, "mix": 20}[variant]
    fonts = sum((_font_dir() / name).is_file() for name in GLYPH_FONTS)  # as _rendered skips missing ones
    glyphs = torch.arange(len(names)).repeat_interleave(per_glyph).repeat(fonts)
    return torch.cat([glyphs, digits.long()])[:count], names


def _render_builtin(variant: str, size: int) -> torch.Tensor:
    if variant == "glyphs":
        return render_glyphs(size)
    if variant == "numerals":
        return render_glyphs(size, chars=string.digits, variants_per_glyph=12)
    if variant == "digits":
        return load_digits(size)
    if variant == "mix":
        # More jittered variants: ~11k images, enough for one 4-GPU batch of the small preset.
        return torch.cat([render_glyphs(size, variants_per_glyph=20), load_digits(size)])
    raise AssertionError(variant)  # load_builtin checked the name
