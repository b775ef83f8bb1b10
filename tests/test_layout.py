"""The structure keeps its shape: imports point down the declared layers, modules stay small.

Every import in critic_pretrain/ and rollouts/ (module level or inside a function: both are
arrows) must go to a module of a lower or equal layer below. The only exception is the
``__main__`` trampoline of a module that ``python -m`` or ``accelerate launch`` runs, which
hands over to the one command router (``critic_pretrain.cli``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

LAYERS: list[tuple[str, ...]] = [
    # the data layer: torch-free
    ("rollouts.errors",),
    ("rollouts.fileio", "rollouts.schema", "rollouts.safe_pickle"),
    ("rollouts.paths", "rollouts.provenance", "rollouts.ppo_config"),
    ("rollouts.tokenizer", "rollouts.writer", "rollouts.validate"),
    ("rollouts.reader", "rollouts.sources"),
    ("rollouts.convert", "rollouts.synth", "rollouts"),
    ("rollouts.cli",),
    # the trainer
    ("critic_pretrain", "critic_pretrain.errors", "critic_pretrain.faults", "critic_pretrain.configs"),
    ("critic_pretrain.config",),
    ("critic_pretrain.config_io",),
    ("critic_pretrain.targets", "critic_pretrain.packed", "critic_pretrain.selection"),
    ("critic_pretrain.metrics",),
    ("critic_pretrain.data",),
    ("critic_pretrain.attention",),
    ("critic_pretrain.model", "critic_pretrain.optim", "critic_pretrain.parallel"),
    ("critic_pretrain.checkpoint", "critic_pretrain.preflight", "critic_pretrain.tracking"),
    ("critic_pretrain.eval", "critic_pretrain.target_network", "critic_pretrain.preemption"),
    ("critic_pretrain.train", "critic_pretrain.plan"),
    ("critic_pretrain.interop", "critic_pretrain.report", "critic_pretrain.bench"),
    ("critic_pretrain.jobs",),
    ("critic_pretrain.commands",),
    ("critic_pretrain.cli",),
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> tuple[str, int] | None:
    """The declared unit a module belongs to (itself or its closest listed parent package)."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in RANK:
            return name, RANK[name]
    return None


def imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, inside the __main__ trampoline) of every import in ``path``."""
    tree = ast.parse(path.read_text())
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    trampolines = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    in_main = {id(x) for n in (tree.body if path.name == "__main__.py" else trampolines) for x in ast.walk(n)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, id(node) in in_main) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            out += [(node.lineno, t, id(node) in in_main) for t in names]
    return out


def sources() -> list[Path]:
    return sorted(p for top in ("critic_pretrain", "rollouts") for p in (ROOT / top).rglob("*.py"))


def test_every_module_has_a_layer():
    missing = sorted({module_name(p) for p in sources() if layer_of(module_name(p)) is None})
    assert not missing, f"declare these modules in tests/test_layout.py LAYERS: {missing}"


def _module_exists(name: str) -> bool:
    parts = name.split(".")
    if parts[:2] == ["critic_pretrain", "configs"]:  # package-dir: configs/ ships as critic_pretrain.configs
        parts = ["configs", *parts[2:]]
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or (base.is_dir() and len(parts) == 1)


def test_own_imports_resolve():
    """A relative import that climbs one level too few (``from .eval`` in a subpackage) names a
    module that does not exist; ruff does not see it, and a lazy import fails only when it runs."""
    broken = []
    for path in sources():
        tree = ast.parse(path.read_text())
        module = module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                targets = [".".join(base + [node.module])]
            else:
                continue
            broken += [f"{path.relative_to(ROOT)}:{node.lineno} imports {t}" for t in targets
                       if t.split(".")[0] in ("critic_pretrain", "rollouts") and not _module_exists(t)]
    assert not broken, "imports of modules that do not exist:\n" + "\n".join(broken)


def test_imports_point_down():
    upward = []
    for path in sources():
        mine = layer_of(module_name(path))
        for line, target, trampoline in imports(path):
            theirs = layer_of(target)
            if theirs is None or trampoline or theirs[0] == mine[0]:
                continue
            if theirs[1] > mine[1]:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({theirs[0]} is above {mine[0]})")
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


@pytest.mark.parametrize("top", ["critic_pretrain", "rollouts"])
def test_no_module_over_600_lines(top):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules along their seams (over {MAX_LINES} lines): {long}"


MAX_FUNCTION_LINES = 60
REASON = "# long: "
"""A function may be longer when its ``def`` line (or the line above it) gives a one-line reason."""


def test_no_function_over_60_lines_without_a_reason():
    long = []
    for path in sources():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            n = node.end_lineno - start + 1
            marked = any(REASON in lines[i - 1] for i in (start - 1, node.lineno) if i >= 1)
            if n > MAX_FUNCTION_LINES and not marked:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, (f"split these functions, or give a one-line reason ({REASON!r} on the def line or above it):\n"
                      + "\n".join(long))
