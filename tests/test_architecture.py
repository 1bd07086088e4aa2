"""The structure docs/architecture.md describes, held against the code: imports point down
the layers only, and files and functions stay short enough to read at once."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trainwise"
# Bottom to top, as docs/architecture.md lists them. A module may import its own layer and
# the layers below it; `trainwise/__init__.py` and `__main__.py` sit above every layer.
LAYERS = ("common", "plan", "hardware", "models", "techniques", "trace", "estimator", "engine", "bench", "calibration",
          "search", "emit", "api", "cli")
MOST_LINES_PER_FILE = 350
MOST_LINES_PER_FUNCTION = 60


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def _layer(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def _trainwise_imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainwise."):
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trainwise."):
                    yield node.lineno, alias.name


def test_every_folder_of_the_package_is_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS)


def test_imports_point_down_the_layers_only():
    upward = []
    for path in _modules():
        own = LAYERS.index(_layer(path))
        for line, module in _trainwise_imports(ast.parse(path.read_text())):
            target = module.split(".")[1]
            if target in LAYERS and LAYERS.index(target) > own:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert not upward, "\n".join(upward)


def test_no_file_is_longer_than_a_read():
    long = [f"{p.relative_to(PACKAGE)}: {n} lines" for p in _modules()
            if (n := len(p.read_text().splitlines())) > MOST_LINES_PER_FILE]
    assert not long, "\n".join(long)


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MOST_LINES_PER_FUNCTION:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)


# cli/ parses flags and renders; what is decided lives in api/. So cli/ may import api/ and
# what a flag or a table is made of: the Plan and its files (plan), errors, units and atomic
# writes (common), the device a flag names (hardware) and the model a flag names (models).
CLI_MAY_IMPORT = ("cli", "api", "plan", "common", "hardware", "models")


def test_cli_imports_only_api_and_what_flags_and_tables_are_made_of():
    found = set()
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for _, module in _trainwise_imports(ast.parse(path.read_text())):
            if module.split(".")[1] not in CLI_MAY_IMPORT:
                found.add((path.name, module))
    assert not found, "cli/ reaching past api/: " + ", ".join(sorted(f"{f} imports {m}" for f, m in found))
