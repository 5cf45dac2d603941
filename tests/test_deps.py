"""Every DVC stage depends on exactly the repository files it executes or reads.

A stage's code is listed in stages/code.yaml (the ``code`` stage fingerprints each list into ``data/code/<stage>.md5``,
the one code dependency the stage has in dvc.yaml); its data, upstream outputs and the key fingerprint are its
``deps`` in dvc.yaml. Two derivations of what a stage runs, checked against those lists:

* static (fast): the import closure of ``stages/<cmd>.py`` over the AST of every module it reaches, imports inside
  functions included (they run when the function does), ``if TYPE_CHECKING:`` blocks excluded (they never run),
  and string constants naming a repository module counted as imports (registries such as
  ``mmw.attacks.ATTACK_MODULES`` import by name). The CLI dispatches each command to its stage module, so only
  ``mmw/cli.py``'s module-level imports count;
* runtime (heavy): the tiny pipeline of test_dvc.py runs every stage for real with a tracer
  (tests/deptrace/sitecustomize.py: an audit hook plus inotify, for native readers such as polars) that records
  the repository files each stage imported or opened for reading and the params sections it loaded; data read
  through ``__file__`` (``data/attacks``) shows up there.

A dep is needed when it is in the static closure (a code directory only when every file in it is), is an upstream
output the stage reads, is ``data/key.fingerprint`` of a stage that loads the key, or is committed data (which a
stage may read only for some params: it must exist, and what is read must be a dep). Run this file as a script
to print each stage's static closure (what its list should hold); ``--write`` rewrites stages/code.yaml, ``--relock``
refreshes dvc.lock's code entries for the current code (the fingerprints and the code stage).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import tomllib
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
#: Executed by every stage before any module: the launcher of dvc.yaml's commands.
LAUNCHER = "scripts/mmw"
#: The stage command's module per dvc.yaml stage (``mmw generate baseline`` -> stages/generate.py).
KEY_FINGERPRINT = "data/key.fingerprint"
IGNORED_PARTS = {"__pycache__"}
#: The stage that fingerprints every other stage's code (stages/code.py), and where its lists live.
CODE_STAGE = "code"
CODE_MAP = REPO / "stages/code.yaml"


def code_map() -> dict[str, list[str]]:
    return yaml.safe_load(CODE_MAP.read_text())


def fingerprint_dep(name: str) -> str:
    return f"data/code/{name}.md5"


def stage_code(name: str) -> list[str]:
    """The code a stage depends on: its list in stages/code.yaml (the code stage: the folders it fingerprints)."""
    return pipeline_stages()[name]["deps"] if name == CODE_STAGE else code_map()[name]


def _package_dirs() -> dict[str, Path]:
    """Import package -> folder, from pyproject's setuptools mapping (``mmw.stages`` lives in ``stages/``)."""
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {package: REPO / folder for package, folder in mapping.items()}


def module_file(name: str) -> Path | None:
    """The repository file of module ``name`` (``mmw.stages.detect`` -> stages/detect.py), or None."""
    dirs = _package_dirs()
    for package in sorted(dirs, key=len, reverse=True):  # the longest mapped package wins
        if name == package or name.startswith(package + "."):
            base = dirs[package].joinpath(*name[len(package) + 1:].split(".")) if name != package else dirs[package]
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str, top_level_only: bool) -> set[str]:
    """Modules imported by ``path`` (any depth unless ``top_level_only``), and repo module names in strings."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST, depth: int) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, depth)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # submodules; others resolve to nothing
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("mmw."):
            found.add(node.value)
        nested = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda)
        if top_level_only and nested:
            return
        for child in ast.iter_child_nodes(node):
            visit(child, depth + nested)

    visit(tree, 0)
    return found


@cache
def static_closure(stage_module: str) -> frozenset[str]:
    """Repository files (relative paths) that running ``mmw.stages.<stage_module>`` through the CLI can execute."""
    files: set[str] = set()
    todo = [("mmw.cli", True), ("mmw.stages", False), (f"mmw.stages.{stage_module}", False)]
    seen: set[str] = set()
    while todo:
        name, top_only = todo.pop()
        for parent in _parents(name):
            if parent in seen:
                continue
            path = module_file(parent)
            if path is None:
                continue
            seen.add(parent)
            files.add(path.relative_to(REPO).as_posix())
            only_top = top_only and parent == name
            todo.extend((imported, False) for imported in _imports(path, parent, only_top))
    return frozenset(files)


def pipeline_stages() -> dict[str, dict]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


@cache
def cli_stage_modules() -> dict[str, str]:
    """CLI command -> the stage module it runs, read from mmw/cli.py (``@app.command()`` + ``_stage("<module>")``)."""
    commands: dict[str, str] = {}
    for node in ast.parse((REPO / "mmw/cli.py").read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "command":
                name = decorator.args[0].value if decorator.args else node.name.replace("_", "-")
                calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "_stage"]
                if calls:
                    commands[name] = calls[0].args[0].value
    return commands


def stage_module(stage: dict) -> str:
    """``scripts/mmw detect baseline`` -> ``detect`` (the module under stages/)."""
    words = stage["cmd"].split()
    assert words[0] == LAUNCHER, f"stage command {stage['cmd']!r} does not go through {LAUNCHER}"
    return cli_stage_modules()[words[1]]


def stage_outputs(stage: dict) -> set[str]:
    outs = [*stage.get("outs", []), *stage.get("metrics", []), *stage.get("plots", [])]
    return {next(iter(o)) if isinstance(o, dict) else o for o in outs}


def all_outputs() -> set[str]:
    return set().union(*(stage_outputs(stage) for stage in pipeline_stages().values()))


def repo_files(path: str) -> set[str]:
    """The files DVC hashes for the dep ``path`` (a file, or a folder without its ignored parts)."""
    full = REPO / path
    if full.is_file():
        return {path}
    return {p.relative_to(REPO).as_posix() for p in full.rglob("*")
            if p.is_file() and not IGNORED_PARTS & set(p.relative_to(REPO).parts)}


def covered(path: str, deps: list[str]) -> bool:
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)


def is_output(path: str) -> bool:
    """Whether ``path`` is a stage's output or inside one (``data/code/key.md5`` in ``data/code``)."""
    return covered(path, list(all_outputs()))


STAGES = sorted(pipeline_stages())


@pytest.mark.parametrize("name", STAGES)
def test_deps_list_every_file_of_the_static_closure(name: str) -> None:
    stage = pipeline_stages()[name]
    missing = sorted(f for f in static_closure(stage_module(stage)) | {LAUNCHER} if not covered(f, stage_code(name)))
    assert not missing, f"stage {name} runs these files but does not depend on them: {missing}"


@pytest.mark.parametrize("name", sorted(set(STAGES) - {CODE_STAGE}))
def test_code_deps_are_all_run(name: str) -> None:
    """The code stage is the exception: it depends on whole code folders (any edit reruns it, in well under a
    second; a stage after it reruns only when its own fingerprint changes)."""
    stage = pipeline_stages()[name]
    closure = static_closure(stage_module(stage)) | {LAUNCHER}
    for dep in stage_code(name):
        unused = sorted(repo_files(dep) - closure)
        assert repo_files(dep), f"stage {name}: dep {dep} does not exist"
        assert not unused, f"stage {name}: dep {dep} holds files the stage never runs: {unused}"


@pytest.mark.parametrize("name", STAGES)
def test_data_deps_exist_and_are_produced_or_committed(name: str) -> None:
    stage = pipeline_stages()[name]
    for dep in stage.get("deps", []):
        if is_output(dep):
            assert not covered(dep, list(stage_outputs(stage))), f"stage {name} depends on its own output {dep}"
        elif dep.startswith("data/"):
            assert repo_files(dep), f"stage {name}: data dep {dep} is neither committed nor a stage output"


def test_each_stage_depends_on_its_code_through_its_fingerprint_only() -> None:
    """Every stage but the code stage has a list in stages/code.yaml and depends on its fingerprint file, on no code
    file directly (dvc.lock stays one code entry a stage), and the code stage watches every listed file: an edit of
    any of them reruns it, and so the stages whose fingerprint it changes."""
    stages = pipeline_stages()
    assert set(code_map()) == set(stages) - {CODE_STAGE}
    watched = stages[CODE_STAGE]["deps"]
    for name, stage in stages.items():
        if name == CODE_STAGE:
            continue
        deps = stage.get("deps", [])
        assert fingerprint_dep(name) in deps, f"stage {name} does not depend on {fingerprint_dep(name)}"
        code = [d for d in deps if not (d.startswith(("data/", "reports/")) or is_output(d))]
        assert not code, f"stage {name} lists code in dvc.yaml (it belongs in stages/code.yaml): {code}"
        unwatched = [f for entry in code_map()[name] for f in repo_files(entry) if not covered(f, watched)]
        assert not unwatched, f"the code stage does not watch {unwatched} ({name} runs them)"


def test_static_closure_follows_imports_inside_functions_and_registries() -> None:
    """The derivation itself: lazy imports, name registries and TYPE_CHECKING blocks (hand-checked facts)."""
    detect = static_closure("detect")
    assert "kernels/backend.py" in detect  # imported inside Detector.__init__ only
    assert "mmw/watermark/samplers/exponential.py" in detect  # through mmw/watermark/samplers/__init__.py
    perturb = static_closure("perturb")
    assert "mmw/attacks/synonym.py" in perturb  # named only as a string in ATTACK_MODULES
    assert "mmw/selection/__init__.py" not in perturb  # imported inside another CLI command
    prompts = static_closure("prompts")
    assert "mmw/watermark/processor.py" not in prompts and "mmw/watermark/detector.py" not in prompts


DETECTION_STAGES = ("detect_baseline", "detect_watermarked")


@pytest.mark.parametrize("name", DETECTION_STAGES)
def test_detection_stages_depend_on_the_detection_keys_only(name: str) -> None:
    """``-S scheme.delta=2.5`` must not rerun the baseline's detection: its stage lists the detection keys, not the
    whole scheme section."""
    from mmw.watermark.scheme import DETECTION_KEYS

    params = [p for p in pipeline_stages()[name].get("params", []) if isinstance(p, str)]
    assert "scheme" not in params
    assert sorted(p.removeprefix("scheme.") for p in params if p.startswith("scheme.")) == sorted(DETECTION_KEYS)


@pytest.mark.parametrize("board", ["params.yaml", "params-full.yaml"])
def test_boards_hold_every_scheme_key(board: str) -> None:
    """DVC refuses to run a stage whose listed param is absent from params.yaml (null is fine): every scheme key is
    written out, null where unset."""
    from mmw.watermark.scheme import KNOWN_KEYS

    scheme = yaml.safe_load((REPO / board).read_text())["scheme"]
    assert not set(KNOWN_KEYS) - set(scheme), f"{board} lacks scheme keys {sorted(set(KNOWN_KEYS) - set(scheme))}"


def test_a_generation_only_key_changes_no_detection() -> None:
    """What lets the detection stages leave GENERATION_ONLY out of their params: the same texts, detected under
    specs that differ only there, get the same verdicts, p-values and sizes (watermarked texts, so the verdicts are
    not trivially null)."""
    import dataclasses

    import numpy as np
    import torch

    from mmw.calibration import generate_synthetic
    from mmw.watermark.detector import Detector
    from mmw.watermark.prf import key_from_string
    from mmw.watermark.scheme import GENERATION_ONLY, SchemeSpec

    key, vocab = key_from_string("deps-test-key"), 500
    window = {"randomness": "window", "window": 1, "score": "sum"}
    #: per generation-only key: a scheme that uses it, and another value for it
    uses = {"delta": ({"sampler": "distribution_shift", "delta": 4.0, "gamma": 0.5, **window}, 1.0),
            "reweight_alpha": ({"sampler": "reweight", "reweight_alpha": 0.5, **window}, 0.25),
            "leaves": ({"sampler": "tournament", "layers": 30, "leaves": 2, **window}, 4),
            "mask_repeated": ({"sampler": "exponential", **window}, True)}
    assert sorted(uses) == sorted(GENERATION_ONLY)
    for name, (base, value) in uses.items():
        texts = generate_synthetic(SchemeSpec.from_params(base), key, lambda step: torch.zeros(4, vocab), rows=4,
                                   length=48, vocab_size=vocab)
        reference = Detector(SchemeSpec.from_params(base), key, vocab, device="reference").detect(list(texts))
        assert all(r.detected for r in reference), name
        other = SchemeSpec.from_params({**base, name: value})
        results = Detector(other, key, vocab, device="reference").detect(list(texts))
        for result, expected in zip(results, reference, strict=True):
            for field, got in dataclasses.asdict(expected).items():
                np.testing.assert_array_equal(getattr(result, field), got, err_msg=f"scheme.{name} changes the "
                                              f"detection's {field}: list it in the detection stages' params")


# --- runtime: what each stage of a real (tiny) dvc repro imported, read and loaded -------------------------------

#: Upstream outputs a stage reads only for some params, so the tiny board's run may not read them.
READ_FOR_SOME_PARAMS = {
    ("prompts", "data/low_entropy"): "the low-entropy tasks' inputs, read only when such a task is selected",
}


def _repo_relative(path: str, roots: tuple[Path, ...]) -> str | None:
    for root in roots:
        try:
            return Path(path).relative_to(root).as_posix()
        except ValueError:
            continue
    return None


def stage_traces(traces: Path, copy: Path) -> dict[str, dict[str, set[str]]]:
    """Per stage: repository files imported (``modules``) and opened for reading (``read``), and params sections
    loaded (``sections``), merged over the stage's processes. Paths are relative to the repository (the copy's
    data, or this checkout's code, which the copy's editable install runs)."""
    roots = (copy.resolve(), REPO)
    merged: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for trace in traces.glob("*.json"):
        record = json.loads(trace.read_text())
        stage = merged[record["stage"]]
        for kind, paths in (("modules", record["modules"]), ("read", record["opened"])):
            for path in paths:
                relative = _repo_relative(path, roots)
                if relative is None or IGNORED_PARTS & set(Path(relative).parts) \
                        or relative.startswith((".venv/", ".git/", ".dvc/", "tests/deptrace/", "tests/faultinject/")):
                    continue  # outside the repository, or the environment, git, DVC or the tracer and counter
                # A module's __file__ may be a pseudo-path (torch's "_classes.py"); opened files were checked by the
                # tracer (later stages may since have replaced them).
                if kind == "read" or any((root / relative).exists() for root in roots):
                    stage[kind].add(relative)
        stage["sections"].update(record["sections"])
    return merged


@pytest.mark.heavy
def test_each_stage_run_depends_on_what_it_imported_and_read_and_on_nothing_else(tmp_path_factory) -> None:
    from pipeline_repo import traced_tiny_pipeline

    traced = traced_tiny_pipeline(tmp_path_factory.getbasetemp() / "tiny-pipeline")
    seen = stage_traces(traced.traces, traced.repo)
    outputs = all_outputs()
    for name, stage in pipeline_stages().items():
        assert name in seen, f"stage {name} left no trace: did it run?"
        deps, trace = [*stage.get("deps", []), *stage_code(name)], seen[name]
        # Every module it imported is in the static closure (the static derivation has no hole) and in its deps.
        code = {f for f in trace["modules"] if f.endswith(".py")}
        assert code <= static_closure(stage_module(stage)), sorted(code - static_closure(stage_module(stage)))
        # Its own outputs do not count, nor their scratch (a resumable stage reads ``<out>.parts/``).
        own = stage_outputs(stage)
        read = {f for f in trace["read"] if f != "params.yaml" and not any(f.startswith(o) for o in own)}
        missing = sorted(f for f in code | read if not covered(f, deps))
        assert not missing, f"stage {name} ran or read these files without depending on them: {missing}"
        # Every upstream output it depends on is read (the key fingerprint: by the stages that load the key).
        # Committed data may be read only for some params (data/tasks: only the selected tasks' files).
        for dep in stage.get("deps", []):
            if dep == fingerprint_dep(name):
                continue  # the fingerprint of its code, which the stage itself never reads
            if dep == KEY_FINGERPRINT:
                assert "key" in trace["sections"], f"stage {name} depends on the key but never loads it"
            elif is_output(dep) and (name, dep) not in READ_FOR_SOME_PARAMS:
                assert any(covered(f, [dep]) for f in read), f"stage {name} depends on {dep} but never reads it"
        if "key" in trace["sections"] and name != "key":
            assert KEY_FINGERPRINT in deps, f"stage {name} uses the key but would not notice a new one"
        # Its DVC params are the sections it loaded (the key never: dvc.lock would hold it); the key stage checks
        # the whole board and runs always.
        if name != "key":
            declared = {p.split(".")[0] for p in stage.get("params", []) if isinstance(p, str)}
            assert declared == trace["sections"] - {"key"}, \
                f"stage {name}: params {declared}, loads {trace['sections']}"


# --- the committed baseline run ----------------------------------------------------------------------------------


def test_committed_lock_is_current_for_the_code_and_params(tmp_path: Path) -> None:
    """dvc.lock (committed with reports/metrics.json) must be the lock of the current code and params.yaml.

    ``dvc status`` in a copy of the checkout (outputs absent: they live in a DVC cache, not in git; the code
    fingerprints written, as the code stage would) must report no changed code, data, params or command; absent
    upstream outputs are expected and ignored.
    """
    if not (REPO / "dvc.lock").is_file():
        pytest.skip("no committed dvc.lock yet: run the default `dvc repro` and commit dvc.lock and "
                    "reports/metrics.json")
    from pipeline_repo import copy_checkout

    stale = stale_lock_entries(copy_checkout(tmp_path / "clone", venv=False))
    assert not stale, "dvc.lock is stale: after a code change `.venv/bin/python tests/test_deps.py --relock`; after " \
                      "a change of what the default run computes, rerun the default `dvc repro` and commit dvc.lock " \
                      "and reports/metrics.json:" + "".join(f"\n  {line}" for line in stale)


def stale_lock_entries(repo: Path) -> list[str]:
    """What ``dvc status`` in ``repo`` reports beyond absent outputs and the always-run key stage, once the code
    stage's fingerprints are written there."""
    from pipeline_repo import run

    from mmw.stages import code

    code.run(repo / "params.yaml")
    status = json.loads(run(repo, "dvc", "status", "--json").stdout.strip().splitlines()[-1] or "{}")
    stale: list[str] = []
    for stage, changes in status.items():
        for change in changes:
            if change == "always changed":
                continue
            if not isinstance(change, dict):
                stale.append(f"{stage}: {change}")
                continue
            for kind, paths in change.items():
                for path, what in (paths.items() if isinstance(paths, dict) else [(str(paths), "")]):
                    # A clone has no outputs and no DVC cache: "deleted" / "not in cache" are expected there.
                    if not (what in ("deleted", "not in cache") and (is_output(path) or kind == "changed outs")):
                        stale.append(f"{stage}: {kind} {path} {what}".strip())
    return stale


def relock() -> None:
    """Refresh dvc.lock's code entries for the current code, touching nothing else: write the fingerprints,
    record the code stage (``dvc commit``), and set each stage's fingerprint dependency to its file's md5 and size.
    The stages' outputs stay those of the committed run (a change of what a stage computes needs a real rerun)."""
    import hashlib
    import subprocess

    from mmw.stages import code

    code.run(REPO / "params.yaml")
    subprocess.run([str(Path(sys.executable).parent / "dvc"), "commit", "-f", "-q", CODE_STAGE], cwd=REPO, check=True)
    text = (REPO / "dvc.lock").read_text()
    for name in code_map():
        data = (REPO / fingerprint_dep(name)).read_bytes()
        entry = rf"\n  {re.escape(name)}:\n(?:    .*\n|\n)*?    - path: {re.escape(fingerprint_dep(name))}\n"
        pattern = re.compile(rf"({entry}      hash: md5\n      md5: )'?\w+'?(\n      size: )\d+")
        text, n = pattern.subn(rf"\g<1>{hashlib.md5(data).hexdigest()}\g<2>{len(data)}", text)
        assert n == 1, f"dvc.lock: no entry of {fingerprint_dep(name)} under stage {name}"
    (REPO / "dvc.lock").write_text(text)


def code_list_for(stage: dict) -> list[str]:
    """The code a stage should list: its static closure and the launcher, a folder where all of it runs."""
    files = set(static_closure(stage_module(stage))) | {LAUNCHER}
    folders: list[str] = []
    for folder in sorted({Path(f).parent.as_posix() for f in files}, key=lambda d: d.count("/")):
        if folder not in ("mmw", "stages", "scripts", ".") and repo_files(folder) <= files \
                and not any(folder.startswith(f + "/") for f in folders):
            folders.append(folder)
    return sorted([f for f in files if not covered(f, folders)] + folders)


def rewrite_code_map(text: str) -> str:
    """stages/code.yaml's text with each stage's list replaced by :func:`code_list_for` (its header kept)."""
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    stages = pipeline_stages()
    return header + "".join(f"{name}:\n" + "".join(f"  - {f}\n" for f in code_list_for(stages[name]))
                            for name in stages if name != CODE_STAGE)


if __name__ == "__main__":  # print each stage's code; --write rewrites stages/code.yaml; --relock refreshes dvc.lock
    if sys.argv[1:] == ["--write"]:
        CODE_MAP.write_text(rewrite_code_map(CODE_MAP.read_text()))
        sys.exit(0)
    if sys.argv[1:] == ["--relock"]:
        relock()
        sys.exit(0)
    for stage_name, definition in pipeline_stages().items():
        if stage_name != CODE_STAGE:
            print(f"{stage_name}:")
            for file in code_list_for(definition):
                print(f"  - {file}")
    sys.exit(0)
