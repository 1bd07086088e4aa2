"""Every name a benchmarks/ script takes from trainwise (or from a sibling script) exists.

The scripts import trainwise inside their functions, after their flags are read, so
importing a script or running its --help does not reach those imports: a rename in
trainwise/ left benchmarks/offload_reconcile.py importing `block_count` from a module that
no longer had it, and reading `_trace` off a module that no longer defined it, and nothing
failed until the script was run on its page. This test reads each script's source and
resolves, without running the script:

- `from M import a, b` and `import M` / `import M as m` for M in trainwise or benchmarks/;
- `m.attr` where `m` is bound in the same function (or at the top level) to a module by
  such an import or by `importlib.import_module("M")`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
SIBLINGS = {path.stem for path in SCRIPTS}


def _top_level_names(path: Path) -> set[str]:
    """Names a sibling script defines or imports at its top level (read, not run: some
    scripts change sys.path or read files when imported)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _missing(module: str, name: str | None = None) -> str | None:
    """Why `module` (and `name` in it: an attribute or a submodule) does not resolve, or None."""
    top = module.split(".")[0]
    if top in SIBLINGS and "." not in module:
        if name is None or name in _top_level_names(BENCHMARKS / f"{top}.py"):
            return None
        return f"benchmarks/{top}.py has no {name}"
    if top != "trainwise":
        return None
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError:
        return f"no module {module}"
    if name is None or hasattr(imported, name) or _is_module(f"{module}.{name}"):
        return None
    return f"{module} has no {name}"


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False


def _checked(module: str) -> bool:
    top = module.split(".")[0]
    return top == "trainwise" or (top in SIBLINGS and "." not in module)


class _Scope(ast.NodeVisitor):
    """One function's (or the top level's) imports and the attributes read off the modules
    they bind; nested functions are scopes of their own."""

    def __init__(self, outer: dict[str, str] | None = None, arguments: set[str] = frozenset()):
        self.problems: list[str] = []
        self.modules: dict[str, str] = dict(outer or {})  # local name -> module it is bound to
        self.rebound: set[str] = set(arguments)  # names also bound otherwise: not resolved
        self.reads: list[tuple[str, str, int]] = []  # (local name, attribute, line)
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def run(self, body) -> list[str]:
        for node in body:
            self.visit(node)
        for local, attr, line in self.reads:
            if local in self.modules and local not in self.rebound:
                why = _missing(self.modules[local], attr)
                if why:
                    self.problems.append(f"line {line}: {local}.{attr}: {why}")
        # Inner functions see this scope's modules as bound once all of it is read.
        outer = {name: module for name, module in self.modules.items() if name not in self.rebound}
        for function in self.functions:
            arguments = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
            self.problems += _Scope(outer, arguments).run(function.body)
        return self.problems

    def visit_FunctionDef(self, node):
        self.functions.append(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        for alias in node.names:
            if _checked(alias.name):
                why = _missing(alias.name)
                if why:
                    self.problems.append(f"line {node.lineno}: import {alias.name}: {why}")
                if alias.asname:
                    self.modules[alias.asname] = alias.name
                else:
                    self.modules[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node):
        if node.level or not node.module or not _checked(node.module):
            return
        for alias in node.names:
            why = _missing(node.module, alias.name)
            if why:
                self.problems.append(f"line {node.lineno}: from {node.module} import {alias.name}: {why}")
            elif node.module.startswith("trainwise") and _is_module(f"{node.module}.{alias.name}"):
                self.modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def visit_Assign(self, node):
        names = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        call = node.value
        if (len(names) == 1 and isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "import_module" and call.args
                and isinstance(call.args[0], ast.Constant) and _checked(str(call.args[0].value))):
            module = str(call.args[0].value)
            why = _missing(module)
            if why:
                self.problems.append(f"line {node.lineno}: import_module({module!r}): {why}")
            self.modules[names[0]] = module
        else:
            self.rebound.update(names)
        self.generic_visit(node)

    def visit_arg(self, node):
        self.rebound.add(node.arg)

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name):
            self.reads.append((node.value.id, node.attr, node.lineno))
        self.generic_visit(node)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_name_a_benchmark_script_imports_exists(script):
    problems = _Scope().run(ast.parse(script.read_text()).body)
    assert not problems, f"benchmarks/{script.name}:\n" + "\n".join(problems)
