"""The research benchmarks keep the package's size rules, and every ``python -m`` module the
docs and GPU scripts name exists (after a module moves, a stale command fails here, not on a GPU)."""

import ast
import re

from benchmarks import ROOT


def test_benchmark_files_stay_short_and_their_functions_under_60_lines():
    too_long = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 400:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long


def test_every_module_the_docs_and_scripts_run_exists():
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "scripts").rglob("*.sh"),
             *(ROOT / "scripts").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "src/diffscale/bench").glob("*.py")]
    named = {(path.relative_to(ROOT), module) for path in texts
             for module in re.findall(r"\b((?:benchmarks|diffscale\.bench)(?:\.[a-z_]+)+)\b", path.read_text())
             if module != "benchmarks.md"}

    def exists(module: str) -> bool:  # a module's file, or a package's folder
        where = module.replace(".", "/")
        return any((base / f"{where}.py").is_file() or (base / where / "__init__.py").is_file()
                   for base in (ROOT, ROOT / "src"))

    missing = sorted(f"{path}: {module}" for path, module in named if not exists(module))
    assert named and not missing
