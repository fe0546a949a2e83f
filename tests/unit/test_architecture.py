"""The seams new tasks rely on: one config precedence, checkpoints of the previous format,
verbs that never vanish, and a loop that reaches the task only through its protocol."""

import json
import re
from pathlib import Path

import pytest
import yaml

from diffscale.cli import build_parser, main
from diffscale.config import ConfigSources, resolve_config
from diffscale.errors import UserError
from diffscale.runtime import checkpoint as ckpt

from helpers import REPO, micro_args


def test_config_precedence_is_preset_then_file_then_flags_then_set_then_fixed(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"preset": "small", "train": {"steps": 11, "seed": 5},
                                      "data": {"source": "builtin:digits"}, "runtime": {"device": "cuda"}}))
    cfg = resolve_config(ConfigSources(config_file=config, data="builtin:glyphs", device="cpu",
                                       overrides=["train.seed=7", "runtime.device=mps"],
                                       fixed={"train": {"seed": 9}}))
    assert cfg.preset == "small" and cfg.model.sample_size == 28  # the file's preset
    assert cfg.train.steps == 11  # the file over the preset
    assert cfg.data.source == "builtin:glyphs"  # --data over the file
    assert cfg.runtime.device.value == "mps"  # --set over --device
    assert cfg.train.seed == 9  # what the verb fixes comes last
    assert resolve_config(ConfigSources(preset="tiny", config_file=config)).preset == "tiny"  # --preset names the base


def test_every_verb_resolves_configs_the_same_way():
    """train, plan/submit and the bench worker all build configs through resolve_config."""
    sources = {path: path.read_text() for path in (REPO / "src/diffscale").rglob("*.py")}
    callers = sorted(str(p.relative_to(REPO)) for p, text in sources.items() if "resolve_config(" in text)
    assert {"src/diffscale/cli.py", "src/diffscale/cluster/cli.py", "src/diffscale/bench/worker.py"} <= set(callers)
    for path, text in sources.items():  # nobody merges presets by hand any more
        assert not re.search(r"merge\(get_preset\(", text), path


def test_a_task_change_in_a_config_file_starts_from_that_tasks_network(tmp_path):
    config = tmp_path / "field.yaml"
    config.write_text(yaml.safe_dump({"task": "policy", "model": {"obs_horizon": 3}}))
    cfg = resolve_config(ConfigSources(config_file=config))
    assert cfg.task == "policy" and cfg.model.obs_horizon == 3 and cfg.model.pred_horizon == 16
    with pytest.raises(UserError, match=r"config task: 'imagse' is not one of images, fields, policy "
                                        r"\(did you mean 'images'\?\)"):
        resolve_config(ConfigSources(overrides=["task=imagse"]))


def _as_format_1(checkpoint: Path) -> None:
    """Rewrite a checkpoint as the format-1 writer left it: ``format`` instead of ``version``,
    no task.safetensors, the manifest over the remaining files."""
    state = json.loads((checkpoint / "state.json").read_text())
    state["format"] = 1
    del state["version"]
    (checkpoint / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    (checkpoint / "task.safetensors").unlink()
    files = {p.name: {"sha256": ckpt._sha256(p), "bytes": p.stat().st_size}
             for p in sorted(checkpoint.iterdir()) if p.name != "manifest.json"}
    (checkpoint / "manifest.json").write_text(json.dumps({"format": 1, "step": state["step"], "files": files}))


def test_a_format_1_checkpoint_loads_and_the_run_resumes_from_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--max-steps", "4", *micro_args(steps=6)]) == 0
    newest = ckpt.list_checkpoints(run)[-1]
    _as_format_1(newest)
    state = ckpt.load_checkpoint(newest)
    assert state.meta.version == 1 and state.task == {} and state.meta.signature["task"] == "images"
    assert state.meta.data_position["offset"] > 0 and state.meta.world_size == 1
    assert main(["train", "--out", str(run), "--resume", "auto", *micro_args(steps=6)]) == 0
    assert "resumed from step 4" in capsys.readouterr().err
    assert ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1]).meta.version == ckpt.FORMAT_VERSION


def test_a_checkpoint_from_a_newer_format_is_skipped_with_the_reason(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    newest = ckpt.list_checkpoints(run)[-1]
    state = json.loads((newest / "state.json").read_text())
    state["version"] = 99
    (newest / "state.json").write_text(json.dumps(state))
    manifest = json.loads((newest / "manifest.json").read_text())
    path = newest / "state.json"
    manifest["files"]["state.json"] = {"sha256": ckpt._sha256(path), "bytes": path.stat().st_size}
    (newest / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ckpt.CorruptCheckpoint, match="format 99 is newer than this diffscale reads"):
        ckpt.load_checkpoint(newest)


def test_every_verb_is_registered():
    parser = build_parser()
    verbs = set(parser._subparsers._group_actions[0].choices)  # argparse keeps them here
    assert {"train", "sample", "export", "eval", "presets", "plan", "submit", "status", "logs", "cancel", "bench",
            "doctor", "cluster"} <= verbs


TASK_NAMES = ("images", "fields", "policy")
TASK_ENTRY_POINTS = ("diffscale.online", "diffscale.policy")
"""Public entry points of one task each (online training of fields, the policy controller): the
only modules outside tasks/ that may import a task's own modules."""


def _outside_tasks(module: str) -> bool:
    return not module.startswith("diffscale.tasks") and not any(
        module == entry or module.startswith(entry + ".") for entry in TASK_ENTRY_POINTS)


def test_nothing_outside_tasks_imports_a_tasks_own_modules():
    """Outside tasks/ a task is reached through tasks.base (the protocol) and tasks.registry only."""
    allowed = ("diffscale.tasks", "diffscale.tasks.base", "diffscale.tasks.registry")
    found = sorted(f"{module} -> {target}" for module, targets in _imports(typing_too=True).items()
                   if _outside_tasks(module) for target in targets
                   if target.startswith("diffscale.tasks") and target not in allowed)
    assert not found


def _task_name_tests(tree) -> list[int]:
    """Lines comparing something with a task's name (``cfg.task != "fields"``, ``in ("images", ...)``)."""
    import ast

    def names(node) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(names(e) for e in node.elts)) if node.elts else set()
        return set()

    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(names(side) & set(TASK_NAMES) for side in (node.left, *node.comparators))]


def test_nothing_outside_tasks_asks_which_task_it_is():
    """No comparison with a task's name outside tasks/, config/ (each task's config section) and
    the task entry points: a new task would need an ``if`` there."""
    import ast

    found = []
    for path in (REPO / "src/diffscale").rglob("*.py"):
        module = ".".join(path.relative_to(REPO / "src").with_suffix("").parts).removesuffix(".__init__")
        if not _outside_tasks(module) or module.startswith("diffscale.config"):
            continue
        found += [f"{module}:{line}" for line in _task_name_tests(ast.parse(path.read_text()))]
    assert not found


def test_the_task_boundary_checks_would_catch_what_they_forbid():
    """The two checks above, run on code that breaks them."""
    import ast

    assert _task_name_tests(ast.parse('if cfg.task != "fields":\n    pass'))
    assert _task_name_tests(ast.parse('ok = run.cfg.task in ("images", "policy")'))
    assert not _task_name_tests(ast.parse('label = f"{cfg.task} run"'))
    graph = _imports(typing_too=True, extra={"diffscale.cluster.fake": "from diffscale.tasks.images import datasize"})
    assert "diffscale.tasks.images.datasize" in graph["diffscale.cluster.fake"]
    assert _outside_tasks("diffscale.cluster.fake") and not _outside_tasks("diffscale.online.trainer")


def test_no_file_over_400_lines():
    """A longer module holds more than one concern: split it along them."""
    long = [f"{p.relative_to(REPO)}: {n}" for p in (REPO / "src/diffscale").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400]
    assert not long


def test_no_function_over_60_lines():
    """A longer function is a sign it does two things: split it where it reads better. (A module may be
    long where it is one concern: its boundaries are held by the import rules below.)"""
    import ast

    too_long = []
    for path in (REPO / "src/diffscale").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long


def _imports(*, typing_too: bool = False, extra: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the diffscale modules it imports, anywhere in it (inside functions too); under
    ``if TYPE_CHECKING:`` (annotations only) too where ``typing_too``. ``extra``: more modules,
    name -> source (the checks' own test)."""
    import ast

    root = REPO / "src"
    modules: dict[str, tuple[Path | None, bool]] = {}
    for path in (root / "diffscale").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    for name in extra or {}:
        modules[name] = (None, False)
    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        tree = ast.parse(path.read_text() if path is not None else (extra or {})[name])
        typing_only = set() if typing_too else {
            id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test) for stmt in node.body for n in ast.walk(stmt)}
        found = set()
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - (0 if package else 1) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name and target.startswith("diffscale"):
                    found.add(target)
        graph[name] = found
    return graph


def test_no_import_cycles_counting_imports_inside_functions_and_for_type_hints():
    graph, cycles = _imports(typing_too=True), []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles


LOWER = ("config", "errors", "data", "runtime", "diffusion", "envs", "evaluation", "io")
"""Packages every other layer may build on; they import nothing above them."""
UPPER = ("tasks", "training", "inference", "cluster", "bench", "doctor", "report", "studies", "cli", "online", "policy")


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


@pytest.mark.parametrize("lower,forbidden", [
    (LOWER, UPPER),
    (("tasks",), tuple(p for p in UPPER if p != "tasks")),
])
def test_lower_layers_never_import_upper_ones(lower, forbidden):
    upward = sorted(f"{module} -> {target}" for module, targets in _imports().items() if _layer(module) in lower
                    for target in targets if _layer(target) in forbidden)
    assert not upward


def test_the_package_never_imports_the_research_benchmarks():
    """benchmarks/ (at the repository root, not installed) builds on the package; an import the
    other way would break every installed copy. Every import statement counts, inside functions
    and under ``if TYPE_CHECKING:`` too."""
    import ast

    found = []
    for path in (REPO / "src/diffscale").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(REPO)}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] == "benchmarks"]
    assert not found


LIGHT_VERBS = [["--version"], ["--help"], *[[verb, "--help"] for verb in (
    "train", "sample", "export", "eval", "presets", "plan", "submit", "status", "logs", "cancel", "doctor", "probe",
    "cluster", "bench", "report", "env", "sweep")], ["cluster", "discover", "--help"], ["presets"], ["env"],
    *[["sweep", verb, "--help"] for verb in ("plan", "submit", "run", "status", "collect", "report")]]


def test_light_verbs_leave_torch_unloaded(tmp_path):
    """What a user runs on a login node most answers without loading torch (seconds each), each
    verb doing its real work: status, logs and doctor read a whole run directory (metrics,
    checkpoints, a job log, jobs.json), and every verb must succeed (exit 0), so an early error
    path cannot stand in for the work."""
    import subprocess
    import sys

    from helpers import fake_run

    code = ("import json, sys\nfrom diffscale.cli import main\ncodes = []\nfor argv in json.loads(sys.argv[1]):\n"
            "    try:\n        codes.append(main(argv))\n    except SystemExit as done:\n"
            "        codes.append(done.code or 0)\n"
            "print('codes:', json.dumps(codes))\n"
            "print('loaded:', json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers'))))")
    plan = ["plan", "--cluster", "purdue-gilbreth", "--nodes", "1", "--gpus-per-node", "4", "--preset", "small",
            "--account", "lab"]
    policy_plan = [*plan[:-3], "policy", *plan[-2:]]
    submitted = fake_run(tmp_path / "submitted")  # jobs.json, a job log the doctor reads a CUDA OOM in
    local = fake_run(tmp_path / "local")  # trained here: no jobs.json, status reads its records
    for name in ("jobs.json", "continuations.tsv"):
        (local / name).unlink()
    sweep = tmp_path / "sweep"
    (sweep / "runs" / "000").mkdir(parents=True)
    (sweep / "sweep.yaml").write_text("base: {preset: tiny}\naxes: {optim.lr: [1e-4]}\n")
    (sweep / "elements.json").write_text(json.dumps([{"index": 0, "values": {"optim.lr": "1e-4"},
                                                      "run_dir": "runs/000"}]))
    (sweep / "runs" / "000" / "metrics.jsonl").write_text('{"step": 2, "loss": 0.5}\n')
    sweep_plan = ["sweep", "plan", "--preset", "small", "--axis", "optim.lr=1e-4,3e-4", "--cluster", "purdue-gilbreth",
                  "--gpus-per-node", "1", "--account", "lab"]
    verbs = [*LIGHT_VERBS, plan, policy_plan, ["status", str(local)], ["doctor", str(submitted)],
             ["logs", str(submitted)], sweep_plan, ["sweep", "status", str(sweep)], ["sweep", "collect", str(sweep)]]
    env = {k: v for k, v in __import__("os").environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(verbs)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    lines = done.stdout.strip().splitlines()
    codes = json.loads(next(line for line in lines if line.startswith("codes:")).split(" ", 1)[1])
    failed = [(" ".join(argv), c) for argv, c in zip(verbs, codes, strict=True) if c != 0]
    assert not failed, (failed, done.stderr[-2000:])
    assert f"run {local}: step 40/40 (100 %)" in done.stdout  # status read the records
    assert "torch.OutOfMemoryError: CUDA out of memory" in done.stdout  # logs printed the job's log
    assert "the GPU ran out of memory (tried to allocate 2.00 GiB)" in done.stdout  # the doctor read it
    assert lines[-1] == "loaded: []", (lines[-1], done.stderr[-2000:])
