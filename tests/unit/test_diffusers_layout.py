"""diffscale leans on diffusers' internals: ``tasks/images/lean_diffusers.py`` imports the
UNet2DModel with three packages' ``__init__`` deferred (their layout in diffusers 0.42), and a
class-conditional export's pipeline subclasses ``DiffusionPipeline``. pyproject.toml bounds diffusers
to the versions tested; these tests fail loudly, naming what moved, where an installed diffusers
is laid out otherwise, instead of the start-up quietly becoming slow again."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from diffscale.tasks.images.lean_diffusers import DEFERRED

REPO = Path(__file__).resolve().parents[2]


def _requirement() -> Requirement:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return next(r for r in map(Requirement, project["dependencies"]) if r.name == "diffusers")


def test_diffusers_is_bounded_and_the_installed_one_is_within_the_bounds():
    wanted = _requirement()
    assert any(s.operator == "<" for s in wanted.specifier), f"diffusers needs an upper bound: {wanted}"
    installed = version("diffusers")
    assert wanted.specifier.contains(installed), (
        f"diffusers {installed} is installed, outside {wanted.specifier} (the versions lean_diffusers.py and the "
        "exported pipeline were tested with): run these tests on it, then move the bound in pyproject.toml")


def test_every_deferred_package_and_name_is_where_lean_diffusers_looks():
    for package, names in DEFERRED.items():
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations is not None, f"{package} is no longer a package"
        for name, submodule in names.items():
            module = importlib.import_module(f"{package}.{submodule}")
            assert hasattr(module, name), f"{package}.{submodule} no longer defines {name}"
    from diffusers.models.unets import unet_2d

    assert hasattr(unet_2d, "UNet2DModel"), "diffusers.models.unets.unet_2d no longer holds UNet2DModel"


def test_the_unet_still_builds_with_the_packages_deferred():
    """In a fresh process, as a training start: the UNet built, each deferred package's ``__init__``
    has still not run (where one has, a change of layout made it run, and the start pays again)."""
    code = ("import sys\n"
            "from diffscale.config import ModelConfig\n"
            "from diffscale.tasks.images.network import build_unet\n"
            "from diffscale.tasks.images import lean_diffusers\n"
            "build_unet(ModelConfig(), 1)\n"
            "ran = [n for n in lean_diffusers.DEFERRED if not isinstance(sys.modules.get(n), "
            "lean_diffusers._DeferredPackage)]\n"
            "print('ran:', ran)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ran: []"), done.stdout


def test_the_exported_pipeline_builds_on_what_diffusers_still_offers():
    from diffusers import DiffusionPipeline, ImagePipelineOutput

    for name in ("register_modules", "register_to_config", "progress_bar", "numpy_to_pil", "save_pretrained"):
        assert hasattr(DiffusionPipeline, name), f"DiffusionPipeline.{name} is gone"
    assert "images" in ImagePipelineOutput.__dataclass_fields__
