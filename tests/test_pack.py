"""Packed sweep units (mmw.sweep.pack): which stages a pack shares, how jobs are packed, the ``pack`` setting and
its pricing (fast); and, on the embedded tiny models, a pack of two configurations writes the same evidence as
their one-configuration DVC experiments, and a killed pack resumes without running a finished configuration again
(heavy)."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pipeline_repo import BIN, REPO, TWO_CONFIG_GRIDS, make_pipeline_repo, plain_shell_env, run, tiny_board
from typer.testing import CliRunner

from mmw.cli import app
from mmw.errors import SpecError
from mmw.sweep.runner import Job, Outcome

BOARD = yaml.safe_load((REPO / "params.yaml").read_text())


# ------------------------------------------------------------------------------------------------ fast


def test_a_pack_shares_only_stages_that_read_neither_the_scheme_nor_the_key() -> None:
    from mmw.sweep.pipeline import stage_plan

    plan, sources = stage_plan(REPO)
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    # every stage, in dvc.yaml's order, but the code fingerprints (DVC's alone: a pack runs its own code)
    assert [s.name for s in plan] == [name for name in stages if name != "code"]
    per_config_outs: set[str] = set()
    for stage in plan:
        raw = stages[stage.name]
        params = [p if isinstance(p, str) else next(iter(p)) for p in raw.get("params", [])]
        reads_scheme = any(p == "scheme" or p.startswith("scheme.") for p in params)
        reads_config_output = any(d in per_config_outs for d in raw.get("deps", []))
        assert stage.shared == (not (reads_scheme or raw.get("always_changed") or reads_config_output)), stage
        if not stage.shared:
            per_config_outs.update(stage.outs)
        assert callable(importlib.import_module(f"mmw.stages.{stage.module}").run)
        assert raw["cmd"].split()[-len(stage.args):] == list(stage.args) if stage.args else True
    shared = {s.name for s in plan if s.shared}
    assert "generate_baseline" in shared and "rate_baseline" in shared  # the baseline is made once per pack
    assert "detect_baseline" not in shared  # its detection depends on the scheme and key (the empirical FPR)
    assert {"generate_watermarked", "key", "aggregate"}.isdisjoint(shared)
    assert "data/tasks" in sources and not any(s.startswith(("data/generations", "data/code")) for s in sources)


def _job(name: str, **overrides: Any) -> Job:
    return Job(name=name, config_id=name, overrides={"scheme.delta": 2.5, "model.temperature": 0.7, **overrides})


def test_jobs_are_packed_by_baseline_in_order_and_at_most_pack_to_a_unit() -> None:
    from mmw.sweep.pack import packs

    jobs = [_job("a"), _job("b", **{"model.temperature": 1.0}), _job("c", **{"scheme.delta": 5.0}),
            _job("d", **{"scheme.gamma": 0.25}), _job("e", **{"model.temperature": 1.0, "scheme.delta": 1.0}),
            _job("f", **{"seed": 7}), _job("g", **{"prompts.offset": 4})]
    names = lambda found: [[j.name for j in p] for p in found]  # noqa: E731
    assert names(packs(BOARD, jobs, 0)) == [["a", "c", "d"], ["b", "e"], ["f"], ["g"]]
    assert names(packs(BOARD, jobs, 2)) == [["a", "c"], ["d"], ["b", "e"], ["f"], ["g"]]
    assert names(packs(BOARD, jobs, 1)) == [[j.name] for j in [jobs[0], jobs[2], jobs[3], jobs[1], jobs[4],
                                                               jobs[5], jobs[6]]]
    # The key is no param: jobs that differ only in their key (confirmation runs) share a pack.
    keyed = [Job("k1", "k1", {"seed": 1}, env={"MMW_KEY": "x" * 32}), Job("k2", "k2", {"seed": 1},
                                                                         env={"MMW_KEY": "y" * 32})]
    assert names(packs(BOARD, keyed, 0)) == [["k1", "k2"]]


@pytest.mark.parametrize("value", [-1, 1.5, "2", True])
def test_a_bad_pack_setting_is_refused_naming_it(tmp_path: Path, value: Any) -> None:
    from mmw.sweep.definition import expand

    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"grids": TWO_CONFIG_GRIDS, "pack": value}))
    with pytest.raises(SpecError) as err:
        expand("t", BOARD, tmp_path)
    assert "pack" in str(err.value) and "integer >= 0" in str(err.value)
    with pytest.raises(SpecError, match="--pack"):
        from mmw.sweep.pack import check_pack

        check_pack(value, "--pack")


def test_the_cli_refuses_a_bad_pack_in_one_line_and_the_dry_run_counts_packed_units(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    (repo / "sweeps").mkdir(parents=True)
    shutil.copy(REPO / "params.yaml", repo / "params.yaml")
    (repo / "sweeps/t.yaml").write_text(yaml.safe_dump({"grids": TWO_CONFIG_GRIDS, "temperatures": [0.7, 1.0]}))
    bad = CliRunner().invoke(app, ["sweep", "run", "t", "--repo", str(repo), "--pack", "-2", "--dry-run"])
    assert bad.exit_code == 2
    error = [line for line in bad.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "--pack" in error[0] and "integer >= 1, or 0" in error[0], bad.output
    plain = CliRunner().invoke(app, ["sweep", "run", "t", "--repo", str(repo), "--dry-run"])
    assert plain.exit_code == 0 and "packed" not in plain.output
    packed = CliRunner().invoke(app, ["sweep", "run", "t", "--repo", str(repo), "--pack", "0", "--dry-run"])
    assert packed.exit_code == 0, packed.output
    assert "4 configurations in 2 units" in packed.output  # two temperatures: two baselines


def test_the_budget_check_and_the_dry_run_price_units_with_the_pack_size() -> None:
    from mmw.sweep.cost import CostModel, packed_units
    from mmw.sweep.schedule import Schedule, dry_run_lines

    cost = CostModel(unit_s=100.0, prompt_s=1.0)
    schedule = Schedule(shards=[4, 8], budget_s=500.0, rule="union")
    # 8 configurations (two baselines of 4) on 4 prompts x 3 tasks: 8 fixed costs, or 2 packed, + 96 prompts
    assert schedule.round_cost(0, [4, 4], 3, cost) == 8 * 100 + 8 * 12
    assert schedule.round_cost(0, 8, 3, cost) == schedule.round_cost(0, [4, 4], 3, cost)  # one unit a config
    packed = cost.with_fixed(100.0, 0)
    assert schedule.round_cost(0, [4, 4], 3, packed) == 2 * 100 + 8 * 12
    assert schedule.round_cost(0, [4, 4], 3, cost.with_fixed(100.0, 3)) == 4 * 100 + 8 * 12
    with pytest.raises(SpecError, match="adaptive.budget_s"):
        schedule.check(8, [4, 4], 3, cost)
    schedule.check(8, [4, 4], 3, packed)  # the same budget pays for round 1 once the units are packed
    assert packed_units([4, 4], 0) == 2 and packed_units([4, 4], 3) == 4 and packed_units([4, 0], 0) == 1
    lines = dry_run_lines(schedule, [4, 4], 8, 3, packed)
    assert "every configuration of a baseline to a unit" in lines[0]
    assert "<= 2 units" in lines[1] and "(4 units at most)" in lines[-1]
    assert f"uniform grid {(2 * 100 + 8 * 24) / 3600:,.2f} h" in lines[-1]


def test_each_configurations_stages_see_its_key_and_workspace_and_failures_are_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from mmw.sweep import pack as pack_module

    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    monkeypatch.delenv("MMW_KEY", raising=False)
    seen: list[tuple[str, str | None, str]] = []
    fail: dict[str, str] = {}

    def fake_stage(stage: Any) -> None:  # the stages' side of the contract: cwd, params.yaml, the key's variable
        assert Path("params.yaml").is_file()
        seen.append((stage.name, os.environ.get("MMW_KEY"), Path.cwd().name))
        if stage.name in fail and fail[stage.name] == os.environ.get("MMW_KEY"):
            raise SpecError("scheme.delta", "bad", "good")

    monkeypatch.setattr(pack_module, "run_stage", fake_stage)
    jobs = [Job("a", "a", {"scheme.delta": 2.5}, env={"MMW_KEY": KEYS["ds"]}),
            Job("b", "b", {"scheme.delta": 5.0}, env={"MMW_KEY": KEYS["exp"]})]
    cwd, outcomes = Path.cwd(), []
    fail["perturb"] = KEYS["exp"]
    pack_module.PackedExecutor(tmp_path, pack=0, echo=lambda _: None).run(jobs, outcomes.append)
    assert Path.cwd() == cwd and "MMW_KEY" not in os.environ
    shared = {s.name for s in pack_module.stage_plan(tmp_path)[0] if s.shared}
    assert all(key is None and where == "shared" for name, key, where in seen if name in shared)
    for job, workspace in zip(jobs, ("unit-0", "unit-1"), strict=True):
        mine = [(name, where) for name, key, where in seen if key == job.env["MMW_KEY"]]
        assert mine and {where for _, where in mine} == {workspace} and not {n for n, _ in mine} & shared
    # b failed at perturb (nothing after it ran); a's fake stages left no tables to read: both one line
    assert [o.status for o in outcomes] == ["failed", "failed"]
    assert outcomes[1].error == "exit 2: perturb: error: scheme.delta: bad; allowed: good", outcomes[1].error
    assert outcomes[0].error.startswith("reading its tables: ") and "\n" not in outcomes[0].error
    assert "perturb" not in outcomes[1].ran and "aggregate" not in [n for n, k, _ in seen if k == KEYS["exp"]]
    assert outcomes[0].packed["size"] == 2 and outcomes[1].packed["index"] == 1
    assert not (tmp_path / pack_module.PACKS_DIR).exists()
    # A shared stage that fails fails every job of the pack with its line, and the lock is free again.
    fail.clear()
    fail["prompts"] = None
    again: list[Outcome] = []
    pack_module.PackedExecutor(tmp_path, pack=0, echo=lambda _: None).run(jobs, again.append)
    assert [o.error for o in again] == ["exit 2: prompts: error: scheme.delta: bad; allowed: good"] * 2


def test_a_local_run_packs_only_when_the_sweep_says_so(tmp_path: Path) -> None:
    import dataclasses

    from mmw.sweep import local_executor
    from mmw.sweep.definition import expand
    from mmw.sweep.pack import PackedExecutor
    from mmw.sweep.runner import LocalDvcExecutor

    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"grids": TWO_CONFIG_GRIDS, "pack": 3}))
    sweep = expand("t", BOARD, tmp_path)
    assert sweep.pack == 3 and sweep.baselines() == [2]
    packed = local_executor(REPO, sweep)
    assert isinstance(packed, PackedExecutor) and packed.pack == 3
    assert isinstance(local_executor(REPO, dataclasses.replace(sweep, pack=1)), LocalDvcExecutor)
    (tmp_path / "d.yaml").write_text(yaml.safe_dump({"grids": TWO_CONFIG_GRIDS}))
    assert expand("d", BOARD, tmp_path).pack == 1  # the default: one DVC experiment a configuration


def test_an_outcomes_evidence_is_never_logged(tmp_path: Path) -> None:
    from mmw.sweep.runner import append_log, read_log

    outcome = Outcome("n", "c", "done", None, 1.0, "now", packed={"pack": "p", "size": 2}, evidence=object())
    append_log(tmp_path, "t", outcome)
    again = read_log(tmp_path, "t")["n"]
    assert again.packed == {"pack": "p", "size": 2} and again.evidence is None
    assert "evidence" not in (tmp_path / ".dvc/tmp/sweeps/t/runs.jsonl").read_text()


# ------------------------------------------------------------------------------------------------ heavy

KEYS = {"ds": "pack-test-key-one-0123456789abcdef", "exp": "pack-test-key-two-0123456789abcdef"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Interrupting:
    """An executor that stops (as Ctrl-C does) right after ``after`` jobs have been recorded."""

    def __init__(self, inner: Any, after: int) -> None:
        self.inner, self.after, self.seen = inner, after, []

    def run(self, jobs: Any, record: Any) -> None:
        def recording(outcome: Outcome) -> None:
            record(outcome)
            self.seen.append(outcome)
            if len(self.seen) == self.after:
                raise KeyboardInterrupt

        self.inner.run(jobs, recording)


@dataclass
class Reference:
    """The heavy tests' repository (a two-configuration sweep ``t`` on the tiny board), its jobs (each under a key
    of its own, in its environment only) and the evidence of their one-configuration DVC experiments."""

    repo: Path
    sweep: Any
    jobs: list[Job]
    units: dict[str, Any]
    threads: int  # torch's threads in the reference's stage processes


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    from mmw.sweep import load_sweep, pool_jobs, run_units
    from mmw.sweep.runner import LocalDvcExecutor
    from mmw.sweep.units import read_unit, runs_dir

    base = tmp_path_factory.mktemp("pack")
    repo = make_pipeline_repo(base / "repo", tiny_board())
    (repo / "sweeps").mkdir(exist_ok=True)
    (repo / "sweeps/t.yaml").write_text(yaml.safe_dump({"grids": TWO_CONFIG_GRIDS}, sort_keys=False))
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "pipeline")
    sweep = load_sweep(repo, "t")
    grid_of = {c.config_id: c.grid for c in sweep.configs}
    jobs = [Job(j.name, j.config_id, j.overrides, env={"MMW_KEY": KEYS[grid_of[j.config_id]]})
            for j in pool_jobs(sweep)]
    assert len(jobs) == 2
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MMW_JUDGE_CACHE", str(base / "judgements-dvc"))  # every test's judgements are its own
        done = run_units(repo, sweep, "dvc", jobs, LocalDvcExecutor(repo), lines.append)
    assert done.done == 2, lines
    units = {p.stem: read_unit(p) for p in runs_dir(repo, "t").glob("*.parquet")}
    threads = int(run(repo, str(BIN / "python"), "-c", "import torch; print(torch.get_num_threads())").stdout)
    yield Reference(repo, sweep, jobs, units, threads)


@pytest.fixture
def stage_threads(reference: Reference) -> Iterator[int]:
    """This process computes with as many threads as the reference's stage processes did: a pack runs its stages
    here, and a float reduction split over another number of threads sums in another order (last bits differ)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(reference.threads)
    yield reference.threads
    torch.set_num_threads(before)


def _fresh(ref: Reference, monkeypatch: pytest.MonkeyPatch, label: str) -> None:
    """No evidence, no experiment ref (either would count as done), a judgement cache of its own."""
    from mmw.sweep.units import runs_dir

    shutil.rmtree(runs_dir(ref.repo, "t"), ignore_errors=True)
    for name in run(ref.repo, "git", "for-each-ref", "--format=%(refname)", "refs/exps/").stdout.split():
        run(ref.repo, "git", "update-ref", "-d", name)
    (ref.repo / ".dvc/tmp/sweeps/t/runs.jsonl").unlink(missing_ok=True)
    monkeypatch.setenv("MMW_JUDGE_CACHE", str(ref.repo.parent / f"judgements-{label}"))


def _same_as_reference(ref: Reference) -> dict[str, Any]:
    """The packed evidence: the reference's rows, params and metrics, ``packed`` added, no experiment commit."""
    from mmw.sweep.units import read_unit, runs_dir

    packed = {p.stem: read_unit(p) for p in runs_dir(ref.repo, "t").glob("*.parquet")}
    assert set(packed) == set(ref.units) == {j.config_id for j in ref.jobs}
    for unit_id, unit in packed.items():
        expected = ref.units[unit_id]
        differs = [c for c in expected.rows.columns if c not in unit.rows.columns
                   or not unit.rows[c].equals(expected.rows[c], check_names=True)]
        assert unit.rows.height > 0 and unit.rows.equals(expected.rows), (
            unit_id, differs, unit.rows.select(differs).to_dicts(), expected.rows.select(differs).to_dicts())
        assert unit.rows.schema == expected.rows.schema
        for field in ("params", "metrics", "attacks", "unit_id", "experiment", "config_id", "role", "overrides"):
            assert unit.meta[field] == expected.meta[field], field
        assert set(expected.meta) | {"packed"} == set(unit.meta)
        assert unit.meta["packed"]["shared_s"] > 0 and unit.meta["rev"] is None
    return packed


def _no_key_in(repo: Path, lines: list[str]) -> None:
    """The keys are in no file the runs left (evidence, logs, reports, DVC's records) and no output line."""
    tracked = set(run(repo, "git", "ls-files").stdout.splitlines())  # the committed checkout (this file included)
    for path in repo.rglob("*"):
        relative = path.relative_to(repo)
        if path.is_file() and str(relative) not in tracked and not {".git", ".venv"} & set(relative.parts):
            data = path.read_bytes()
            assert not any(k.encode() in data for k in KEYS.values()), path
    assert not any(k in line for k in KEYS.values() for line in lines)


@pytest.mark.heavy
def test_a_pack_writes_the_evidence_of_its_dvc_experiments_and_resumes_after_a_kill(
        reference: Reference, monkeypatch: pytest.MonkeyPatch, stage_threads: int) -> None:
    from mmw.sweep import run_units
    from mmw.sweep.pack import PACKS_DIR, PackedExecutor
    from mmw.sweep.runner import read_log
    from mmw.sweep.units import runs_dir

    repo, jobs, lines = reference.repo, reference.jobs, []
    _fresh(reference, monkeypatch, "pack")
    # Both in one pack, stopped (as by Ctrl-C) right after the first configuration's evidence is written.
    stopper = _Interrupting(PackedExecutor(repo, pack=0, echo=lines.append), after=1)
    with pytest.raises(KeyboardInterrupt):
        run_units(repo, reference.sweep, "pack", jobs, stopper, lines.append)
    first = list(runs_dir(repo, "t").glob("*.parquet"))
    assert len(first) == 1 and not (repo / PACKS_DIR).exists()  # its workspaces are gone with it
    first_bytes = first[0].read_bytes()
    assert stopper.seen[0].packed["size"] == 2 and "generate_baseline" in stopper.seen[0].ran

    # The rerun runs only the configuration without a file.
    resumed = _Interrupting(PackedExecutor(repo, pack=0, echo=lines.append), after=99)
    progress = run_units(repo, reference.sweep, "pack", jobs, resumed, lines.append)
    assert progress.done == 2 and progress.failed == 0, lines
    assert [o.name for o in resumed.seen] == [j.name for j in jobs if j.config_id != first[0].stem]
    assert first[0].read_bytes() == first_bytes
    assert all(o.status == "done" for o in read_log(repo, "t").values())

    # Same rows, params, metrics and per-attack metrics as each configuration's DVC experiment.
    packed = _same_as_reference(reference)
    for unit in packed.values():  # the wall time of every stage it ran, the baseline's in the first one's
        assert unit.meta["timings"] and set(unit.meta["timings"]) <= set(unit.meta["stages_ran"])
    _no_key_in(repo, lines)


@pytest.mark.heavy
def test_a_ray_pack_is_one_task_with_the_same_evidence(reference: Reference, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    from mmw.sweep import run_units
    from mmw.sweep.ray_executor import RayExecutor

    repo, lines = reference.repo, []
    _fresh(reference, monkeypatch, "ray")
    monkeypatch.delenv("MMW_KEY", raising=False)
    # The workers use as many threads as the reference's stages did (Ray would set 1): the same float reductions.
    threads = str(reference.threads)
    env = plain_shell_env({"RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                           "MMW_JUDGE_CACHE": os.environ["MMW_JUDGE_CACHE"]})  # the workers' judgements: fresh
    port = _free_port()
    ray_bin = str(BIN / "ray")
    started = subprocess.run([ray_bin, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                              "--num-cpus", "1", "--num-gpus", "0", "--object-store-memory", "100000000",
                              "--include-dashboard", "false", "--disable-usage-stats"], env=env,
                             capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        executor = RayExecutor(repo, address=f"127.0.0.1:{port}", echo=lines.append, pack=0)
        progress = run_units(repo, reference.sweep, "ray", reference.jobs, executor, lines.append)
        assert progress.done == 2, lines
        assert len(executor.nodes) == 1 and next(iter(executor.nodes.values())).done == 2
        packed = _same_as_reference(reference)
        assert {u.meta["packed"]["pack"] for u in packed.values()} == {next(iter(packed.values())).meta["packed"][
            "pack"]}  # one task, one pack
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
    _no_key_in(repo, lines)
    with pytest.raises(SpecError, match="--task-timeout"):
        RayExecutor(repo, address="auto", task_timeout_s=10, pack=0)
