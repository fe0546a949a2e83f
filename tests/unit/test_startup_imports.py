"""What a ``diffscale train`` start imports: nothing it does not use (start-up time:
docs/benchmarks.md, "Start-up and compile time")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)


def test_a_training_start_imports_no_scipy_plotting_or_transformer_models():
    done = _python(
        "import json, sys\n"
        "from diffscale import cli\n"
        "cli.build_parser('train')\n"
        "import diffscale.training.loop, diffscale.tasks.images.task\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    unused = {"scipy", "matplotlib", "imageio", "tensorboard", "torch._inductor.compile_fx",
              "diffscale.cluster.planning.plan", "diffscale.doctor", "diffusers.loaders.single_file_utils",
              "diffusers.models.unets.unet_2d_condition",
              "diffusers.models.transformers.auraflow_transformer_2d"}
    assert not unused & loaded, unused & loaded
    assert "diffusers.models.unets.unet_2d" in loaded  # the network diffscale trains


def test_deferred_diffusers_packages_still_give_every_model():
    done = _python(
        "import diffusers, sys\n"
        "from diffscale.tasks.images.network import build_unet\n"
        "from diffscale.tasks.images.lean_diffusers import UNet2DModel\n"
        "assert UNet2DModel is diffusers.UNet2DModel\n"
        "from diffusers.models.unets import unet_2d\n"  # a submodule: the package's __init__ still waits
        "assert 'diffusers.models.unets.unet_2d_condition' not in sys.modules\n"
        "from diffusers.models.unets import UNet2DConditionModel\n"  # a name: the __init__ runs now
        "assert UNet2DConditionModel is diffusers.UNet2DConditionModel\n"
        "import diffusers.models.transformers as t\n"
        "assert t.Transformer2DModel is diffusers.Transformer2DModel and t.SD3Transformer2DModel\n"
        "print('ok')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")


def test_defer_package_init_leaves_imported_and_missing_packages_alone():
    from diffscale.tasks.images.lean_diffusers import defer_package_init

    assert defer_package_init("json") is False  # imported already
    assert defer_package_init("diffusers.models.no_such_package") is False
    assert "diffusers.models.no_such_package" not in sys.modules


def test_the_train_verb_parses_without_the_registered_verbs():
    from diffscale.cli import CORE_VERBS, build_parser

    def verbs(parser) -> set[str]:
        sub = next(a for a in parser._actions if a.dest == "command")
        return set(sub.choices)

    assert verbs(build_parser("train")) == CORE_VERBS  # a verb added to cli.py is added there too
    assert {"plan", "submit", "bench", "doctor"} <= verbs(build_parser()) - CORE_VERBS
    args = build_parser("train").parse_args(["train", "--preset", "tiny", "--max-steps", "3"])
    assert args.preset == "tiny" and args.max_steps == 3


def test_installed_packages_map_is_kept_until_an_import_path_changes(tmp_path, monkeypatch):
    """diffusers and transformers each list every installed file at import
    (``importlib.metadata.packages_distributions``); the answer is kept per import paths and times."""
    from diffscale.runtime.package_index import KEEP, cached

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site), str(tmp_path / "missing")])
    calls = []

    def compute():
        calls.append(1)
        return {"pkg": ["dist-a"], f"n{len(calls)}": ["dist-b"]}

    folder = tmp_path / "kept"
    first = cached(compute, folder)
    assert first == {"pkg": ["dist-a"], "n1": ["dist-b"]} and len(calls) == 1
    assert cached(compute, folder) == first and len(calls) == 1  # read back, not computed
    (site / "runs").mkdir()  # a run dir in the working directory (an import path) changes nothing
    assert cached(compute, folder) == first and len(calls) == 1
    (site / "new_dist-1.0.dist-info").mkdir()  # an install
    assert cached(compute, folder) == {"pkg": ["dist-a"], "n2": ["dist-b"]} and len(calls) == 2
    os.utime(site / "new_dist-1.0.dist-info", ns=(1, 10**9))  # reinstalled in place: rewritten
    assert cached(compute, folder) == {"pkg": ["dist-a"], "n3": ["dist-b"]} and len(calls) == 3
    calls.clear()
    for kept in folder.glob("*.json"):
        kept.write_text("{not json")
    assert cached(compute, folder)["n1"] == ["dist-b"]  # a damaged file: computed again
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert cached(compute, blocked / "sub")["n2"] == ["dist-b"]  # nowhere to keep it: still answered
    for version in range(12):  # environments come and go: the newest answers are kept
        (site / f"churn-{version}.dist-info").mkdir()
        cached(compute, folder)
    assert len(list(folder.glob("*.json"))) == KEEP


def test_the_first_diffusers_import_reads_the_kept_packages_map(tmp_path):
    """...and the finder waiting for that import leaves every finder after it asked (the import
    system iterates ``sys.meta_path`` while it asks: one that removed itself there made it skip the next)."""
    code = ("import sys, diffscale, importlib.metadata as m\n"
            "from diffscale.runtime.package_index import BeforeDiffusers\n"
            "diffscale.fast_start()\n"
            "asked = []\n"
            "class Recorder:\n"
            "    @classmethod\n"
            "    def find_spec(cls, name, path=None, target=None):\n"
            "        asked.append(name)\n"
            "sys.meta_path.insert(sys.meta_path.index(BeforeDiffusers) + 1, Recorder)\n"
            "import diffusers.utils\n"
            "assert m.packages_distributions.__wrapped__ is not None\n"
            "print('diffusers' in asked, m.packages_distributions() == m.packages_distributions.__wrapped__())\n")
    first = _python(code, DIFFSCALE_CACHE_DIR=str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith("True True")
    kept = list((tmp_path / "packages").glob("*.json"))
    assert len(kept) == 1 and '"diffusers"' in kept[0].read_text()
    light = _python("import diffscale, sys\nprint('importlib.metadata' in sys.modules)\n",
                    DIFFSCALE_CACHE_DIR=str(tmp_path))
    assert light.stdout.strip() == "False"  # import diffscale alone installs nothing


@pytest.mark.parametrize("asked", ["", "1"])
def test_import_diffscale_changes_the_interpreter_only_when_asked(tmp_path, asked):
    """A notebook's ``import diffscale`` leaves the import system, importlib.metadata and the
    bytecode location as they were; DIFFSCALE_FAST_START=1 (a job of one's own) asks for what the
    command line does."""
    code = ("import sys, importlib.metadata as m\n"
            "finders, prefix = list(sys.meta_path), sys.pycache_prefix\n"
            "import diffscale\n"
            "import diffusers.utils\n"
            "print(sys.meta_path[:len(finders)] == finders, getattr(m.packages_distributions, '__wrapped__', None) "
            "is not None, sys.pycache_prefix == prefix)\n")
    done = _python(code, DIFFSCALE_CACHE_DIR=str(tmp_path), DIFFSCALE_FAST_START=asked)
    assert done.returncode == 0, done.stderr
    patched = done.stdout.split()[-3:]
    assert patched[:2] == (["True", "False"] if not asked else ["False", "True"])


def test_an_installed_transformers_is_not_imported_by_the_unet(tmp_path):
    """``diffusers.quantizers`` imports transformers where it is installed; the UNet needs two of
    its classes only. A stand-in transformers on the path shows who imports it."""
    stub = tmp_path / "site" / "transformers"
    (stub / "utils").mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "utils" / "__init__.py").write_text("")
    (stub / "utils" / "quantization_config.py").write_text("class QuantizationConfigMixin:\n    pass\n")
    code = ("import sys\n"
            "from diffscale.tasks.images.network import build_unet\n"
            "from diffusers.models.modeling_utils import ModelMixin\n"
            "from diffusers.quantizers import DiffusersAutoQuantizer\n"
            "print('unet', 'transformers' in sys.modules)\n"
            "from diffusers.quantizers import PipelineQuantizationConfig\n"  # the real __init__ runs now
            "print('pipeline config', 'transformers' in sys.modules)\n")
    done = _python(code, PYTHONPATH=f"{SRC}{os.pathsep}{tmp_path / 'site'}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-3:-1] == ["unet False", "pipeline config True"]



def _installation_without_bytecode(root: Path) -> Path:
    """A site folder whose ``torch`` (first on the path) has no ``__pycache__``, and one more module."""
    site = root / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "later_module.py").write_text("VALUE = 1\n")
    return site


_KEEP_AND_IMPORT = (
    "import os, subprocess, sys\n"
    "from diffscale.runtime.bytecode import keep_bytecode\n"
    "print(keep_bytecode())\n"
    "import later_module\n"
    "print(subprocess.run([sys.executable, '-c', 'import sys; print(sys.pycache_prefix, sys.dont_write_bytecode)'],"
    " capture_output=True, text=True).stdout.strip())\n"
)


def test_bytecode_is_kept_in_the_cache_where_torch_has_none(tmp_path):
    site = _installation_without_bytecode(tmp_path)
    cache = tmp_path / "cache"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    done = subprocess.run(
        [sys.executable, "-c", _KEEP_AND_IMPORT], capture_output=True, text=True, timeout=120,
        env={**environ, "PYTHONPATH": f"{site}{os.pathsep}{SRC}", "PYTHONDONTWRITEBYTECODE": "1",
             "DIFFSCALE_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    folder = cache / "bytecode"
    assert done.stdout.splitlines() == [str(folder), f"{folder} False"]  # this process and the ones it starts
    kept = [p.name for p in folder.rglob("*.pyc")]
    assert any(name.startswith("later_module.") for name in kept), kept
    assert not (site / "__pycache__").exists()  # nothing written into the installation


def test_bytecode_stays_where_the_user_or_the_installation_keeps_it(tmp_path):
    site = _installation_without_bytecode(tmp_path)
    environ = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{SRC}", "DIFFSCALE_CACHE_DIR": str(tmp_path / "cache")}
    mine = tmp_path / "mine"
    done = subprocess.run([sys.executable, "-c", _KEEP_AND_IMPORT], capture_output=True, text=True, timeout=120,
                          env={**environ, "PYTHONPYCACHEPREFIX": str(mine), "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["None", f"{mine} True"]  # the user's settings, untouched
    import py_compile

    py_compile.compile(str(site / "torch" / "__init__.py"))  # torch installed with its bytecode
    environ.pop("PYTHONPYCACHEPREFIX", None)
    done = subprocess.run([sys.executable, "-c", _KEEP_AND_IMPORT], capture_output=True, text=True, timeout=120,
                          env=environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "None"
    assert not (tmp_path / "cache" / "bytecode").exists()


def test_the_command_line_keeps_bytecode_before_it_imports_anything_heavy(tmp_path):
    site = _installation_without_bytecode(tmp_path)
    cache = tmp_path / "cache"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    done = subprocess.run([sys.executable, "-m", "diffscale", "presets"], capture_output=True, text=True, timeout=120,
                          env={**environ, "PYTHONPATH": f"{site}{os.pathsep}{SRC}", "DIFFSCALE_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    assert "small" in done.stdout
    assert list((cache / "bytecode").rglob("*.pyc"))  # the verb's own imports came after keep_bytecode
