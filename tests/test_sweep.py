"""Sweeps: definitions expand to the intended grid and bad entries are refused before anything runs (fast);
a real smoke sweep through DVC is interrupted, resumed and collected (heavy).

Expected counts are derived by hand from the grids in the definition files (products of list lengths), not
from the expansion code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from pipeline_repo import BIN, REPO, TWO_CONFIG_GRIDS, make_pipeline_repo, plain_shell_env, run, tiny_board
from typer.testing import CliRunner

from mmw.cli import app
from mmw.errors import SpecError
from mmw.sweep.confirm import Confirmation
from mmw.sweep.definition import SCHEME_KEYS, config_id, expand
from mmw.sweep.pipeline import set_args
from mmw.sweep.tables import split_record

BOARD = yaml.safe_load((REPO / "params.yaml").read_text())
SWEEPS = REPO / "sweeps"


# ------------------------------------------------------------------------------------------ fast: expansion


def test_the_paper_grid_has_the_hand_counted_size() -> None:
    """Per temperature: DS sum window 6 windows x 7 deltas = 42, DS min-hash 4 x 7 = 28, distortion-free sum
    window 3 samplers x 5 windows x 4 skips = 60, min-hash 3 x 4 x 4 = 48, DS align 10 key lengths x 4 deltas
    = 40, distortion-free align 3 x 10 x 2 = 60, DS edit 10: 288; x 4 temperatures = 1,152."""
    sweep = expand("paper", BOARD, SWEEPS)
    assert len(sweep.configs) == 1152
    per_grid: dict[str, int] = {}
    for config in sweep.configs:
        per_grid[config.grid] = per_grid.get(config.grid, 0) + 1
    assert per_grid == {"ds-sum-window": 168, "ds-sum-minhash": 112, "df-sum-window": 240, "df-sum-minhash": 192,
                        "ds-align-fixed": 160, "df-align-fixed": 240, "ds-edit-fixed": 40}
    temperatures = {c.overrides["model.temperature"] for c in sweep.configs}
    assert temperatures == {0.0, 0.3, 0.7, 1.0}
    # The paper's table of tested combinations: sum with window/min-hash and align with fixed randomness for all
    # four samplers, edit with fixed randomness for distribution shift only.
    combos = {(c.overrides["scheme.sampler"], c.overrides["scheme.score"], c.overrides["scheme.randomness"])
              for c in sweep.configs}
    samplers = {"distribution_shift", "exponential", "inverse_transform", "binary"}
    assert combos == ({(s, "sum", r) for s in samplers for r in ("window", "minhash")}
                      | {(s, "align", "fixed") for s in samplers} | {("distribution_shift", "edit", "fixed")})
    assert max(c.overrides["scheme.key_length"] or 0 for c in sweep.configs) == 1024


def test_every_config_sets_the_whole_scheme_but_never_the_key() -> None:
    for config in expand("smoke", BOARD, SWEEPS).configs:
        assert set(SCHEME_KEYS) <= set(config.overrides)
        assert "scheme.key" not in config.overrides and "key" not in config.overrides


def test_small_and_smoke_grids_cover_what_they_promise() -> None:
    small = expand("small", BOARD, SWEEPS)
    cells = {(c.overrides["model.temperature"], c.overrides["scheme.sampler"]) for c in small.configs}
    assert cells == {(t, s) for t in (0.0, 0.3, 0.7, 1.0)
                     for s in ("distribution_shift", "exponential", "inverse_transform", "binary")}
    assert small.reevaluate.k >= 5
    assert len(expand("smoke", BOARD, SWEEPS).configs) == 3
    # The confirmed part of small: its configs at T = 1 and 0.7 (9 x 2), tuned on the same prompt, confirmed on 16
    # held-out prompts per task, 10 % cells only.
    confirmed = expand("small-confirmed", BOARD, SWEEPS)
    assert {c.config_id for c in confirmed.configs} == {c.config_id for c in small.configs
                                                        if c.overrides["model.temperature"] in (0.7, 1.0)}
    assert len(confirmed.configs) == 18 and confirmed.reevaluate.k == 5
    confirmation = confirmed.confirmation
    assert (confirmed.tuning_offset, confirmed.tuning, confirmation.offset, confirmation.prompts) == (0, 1, 1, 16)
    assert confirmation.constraints == ((0.1, 0.2), (0.1, 0.0))


def test_config_ids_are_stable_and_distinct(tmp_path: Path) -> None:
    a = {"scheme.delta": 2.5, "model.temperature": 0.7}
    assert config_id(a) == config_id(dict(reversed(list(a.items()))))
    assert config_id(a) != config_id({**a, "scheme.delta": 5.0})
    # Reordering a definition's keys and grids keeps every id.
    raw = yaml.safe_load((SWEEPS / "smoke.yaml").read_text())
    raw["grids"] = [dict(reversed(list(g.items()))) for g in reversed(raw["grids"])]
    (tmp_path / "smoke.yaml").write_text(yaml.safe_dump(raw))
    ids = {c.config_id for c in expand("smoke", BOARD, SWEEPS).configs}
    assert {c.config_id for c in expand("smoke", BOARD, tmp_path).configs} == ids and len(ids) == 3


def _definition(tmp_path: Path, grid: dict[str, Any], **top: Any) -> Path:
    (tmp_path / "sweeps").mkdir(exist_ok=True)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(BOARD))
    (tmp_path / "sweeps" / "bad.yaml").write_text(yaml.safe_dump({"temperatures": [0.7], **top,
                                                                   "grids": [{"name": "g0", **grid}]}))
    return tmp_path


DS = {"scheme.sampler": "distribution_shift", "scheme.score": "sum", "scheme.randomness": "window",
      "scheme.window": 1, "scheme.delta": 2.5}


@pytest.mark.parametrize(("grid", "top", "names"), [
    ({**DS, "scheme.windoww": [1, 2]}, {}, ["grids[0] (g0)", "scheme.windoww", "not a param"]),
    ({**DS, "scheme.skip_prob": 0.05}, {}, ["grids[0] (g0)", "scheme.skip_prob", "distribution-shift"]),
    ({**DS, "scheme.score": "align"}, {}, ["grids[0] (g0)", "scheme.score"]),
    ({**DS, "scheme.delta": [2.5, -1.0]}, {}, ["scheme.delta=-1.0", "scheme.delta", "out of range"]),
    ({**DS, "scheme.key": "k"}, {}, ["scheme.key", "MMW_KEY"]),
    (DS, {"base": {"model.max_new_tokenz": 16}}, ["base", "model.max_new_tokenz", "not a param"]),
    (DS, {"temperatures": [0.7, -1.0]}, ["model.temperature=-1.0", "model.temperature"]),
    (DS, {"reevaluate": {"k": 0}}, ["reevaluate.k"]),
    # Confirmation: K < 2, too few prompts for an interval (quality, then R's attacked prompts), overlap with the
    # tuning prompts, no prompt left, mixed models / engines / judges.
    (DS, {"base": {"prompts.per_task": 2}, "reevaluate": {"k": 1}, "confirm": {"prompts": 6}},
     ["reevaluate.k", "at least 2"]),
    (DS, {"base": {"prompts.per_task": 2}, "confirm": {"prompts": 1}}, ["confirm.prompts", "too small"]),
    (DS, {"base": {"prompts.per_task": 2}, "confirm": {"prompts": 3}},
     ["confirm.prompts", "interval of R", "at least 4 per task"]),
    (DS, {"base": {"prompts.per_task": 4}, "confirm": {"prompts": 6, "offset": 2}},
     ["confirm.offset", "overlap", ">= 4"]),
    (DS, {"base": {"prompts.per_task": None}, "confirm": {"prompts": 6}}, ["confirm", "no prompt is left"]),
    (DS, {"base": {"prompts.per_task": 2}, "confirm": {"prompts": 6, "level": 0.9}}, ["confirm.level"]),
    (DS, {"base": {"prompts.per_task": 2}, "confirm": {"prompts": 6, "quality_losses": [0.05]}},
     ["confirm.quality_losses", "[0.01, 0.1]"]),
    (DS, {"base": {"prompts.per_task": 2}, "confirm": {"prompts": 6, "quality_losses": []}},
     ["confirm.quality_losses", "non-empty"]),
    ({**DS, "model.engine": ["transformers", "vllm"]}, {}, ["model.engine", "would mix 2 values"]),
    ({**DS, "rate.backend": ["transformers", "openai"]}, {}, ["rate.backend", "would mix"]),
])
def test_bad_entries_are_refused_naming_the_entry(tmp_path: Path, grid: dict[str, Any], top: dict[str, Any],
                                                  names: list[str]) -> None:
    repo = _definition(tmp_path, grid, **top)
    with pytest.raises(SpecError) as caught:
        expand("bad", BOARD, repo / "sweeps")
    for name in names:
        assert name in str(caught.value)
    # The command: exit 2, one line on stderr, nothing run (no experiment log written).
    result = CliRunner().invoke(app, ["sweep", "run", "bad", "--repo", str(repo)])
    assert result.exit_code == 2 and names[-1] in result.output
    assert not (repo / ".dvc").exists()


def test_a_committed_params_file_missing_from_the_workspace_is_named_with_its_remedy(tmp_path: Path) -> None:
    """What a kill while DVC stashes a run's overrides can leave: the error says how to get the file back."""
    from mmw.sweep import load_sweep

    with pytest.raises(SpecError, match="no params.yaml"):
        load_sweep(tmp_path, "t")  # not a repository: nothing to restore
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    subprocess.run(["git", "add", "params.yaml"], cwd=tmp_path, check=True)
    (tmp_path / "params.yaml").unlink()
    with pytest.raises(SpecError, match="missing from the workspace") as refused:
        load_sweep(tmp_path, "t")
    assert "git checkout -- params.yaml" in str(refused.value)


def test_an_unknown_sweep_lists_the_available_ones() -> None:
    result = CliRunner().invoke(app, ["sweep", "run", "nonesuch", "--repo", str(REPO)])
    assert result.exit_code == 2
    assert "nonesuch" in result.output and "smoke" in result.output and "paper" in result.output


def test_sweep_is_a_command_group_and_a_sweep_named_like_a_verb_is_just_a_sweep(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["sweep", "--help"])
    assert listed.exit_code == 0
    assert all(f"│ {verb}" in listed.output for verb in ("run", "collect", "plan")), listed.output
    # A definition called `plan`: `mmw sweep run plan` expands it; `mmw sweep plan plan` plans it.
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(BOARD))
    shutil.copy(SWEEPS / "smoke.yaml", tmp_path / "sweeps" / "plan.yaml")
    ran = runner.invoke(app, ["sweep", "run", "plan", "--dry-run", "--repo", str(tmp_path)])
    assert ran.exit_code == 0 and ran.output.startswith("sweep plan: 3 configs"), ran.output
    planned = runner.invoke(app, ["sweep", "plan", "plan", "--repo", str(tmp_path), "--out", str(tmp_path / "r")])
    assert planned.exit_code == 2 and "mmw sweep collect plan first" in planned.output, planned.output
    # A sweep's name where the verb belongs: one line saying what to type instead, exit 2, nothing run.
    wrong = runner.invoke(app, ["sweep", "smoke", "--repo", str(tmp_path)])
    assert wrong.exit_code == 2 and wrong.output.strip().splitlines() == [
        "error: sweep: 'smoke' is not a verb of `mmw sweep` (allowed: run, collect, export, plan); to run that sweep: "
        "mmw sweep run smoke"]
    assert not (tmp_path / ".dvc").exists()


def test_set_args_round_trip_through_dvcs_override_parser(tmp_path: Path) -> None:
    """What the runner passes to `dvc exp run -S` is what DVC writes into params.yaml (lists of mappings,
    nulls, strings with a colon, floats)."""
    from dvc.utils.hydra import apply_overrides

    overrides = {"attacks.specs": [{"name": "swap", "p": 0.1}, {"name": "lowercase"}], "scheme.delta": None,
                 "rate.judge": "embedded:smollm2-135m", "model.temperature": 0.0, "scheme.window": 3}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(BOARD))
    args = set_args(overrides)
    assert args[0::2] == ["-S"] * len(overrides)
    apply_overrides(path, args[1::2])
    written = yaml.safe_load(path.read_text())
    assert written["attacks"]["specs"] == overrides["attacks.specs"]
    assert written["scheme"]["delta"] is None and written["scheme"]["window"] == 3
    assert written["rate"]["judge"] == "embedded:smollm2-135m" and written["model"]["temperature"] == 0.0


# ------------------------------------------------------------------------------------------ heavy: real DVC

#: The base of both real sweeps below: two of the tiny board's four cheap attacks, on every prompt (confirmation
#: needs attacked held-out prompts for its interval of R). One base for both, so the confirmed sweep's one config is
#: the killed sweep's first one, params for params: in the module's one repository its tuning run is restored from
#: DVC's run-cache instead of computed a second time.
REAL_BASE = {"attacks.fraction": 1.0, "attacks.specs": [{"name": "swap", "p": 0.1}, {"name": "lowercase"}]}

#: A two-config sweep at the tiny board's scale plus one config that passes validation but fails at run time
#: (a CUDA generator on a machine without one; it fails at its first generation): 1 prompt per task, 16 tokens,
#: the small judge, 2 cheap attacks.
TEST_SWEEP = {
    "description": "test", "temperatures": [0.7], "reevaluate": {"k": 1, "first_seed": 1000}, "base": REAL_BASE,
    "grids": [
        *TWO_CONFIG_GRIDS,
        {"name": "broken", "scheme.sampler": "distribution_shift", "scheme.score": "sum",
         "scheme.randomness": "window", "scheme.window": 1, "scheme.delta": 2.5, "model.device": "cuda"},
    ]}

#: One config with held-out confirmation (the smallest end-to-end case: one tuning run, K = 2 confirmation runs
#: of the one pick): tuning on prompt 0 of each task, confirmation on prompts 1-2 of each task (6 prompts, all
#: attacked, by two of the tiny board's four cheap attacks), one try per cell.
CONFIRM_SWEEP = {
    "description": "confirmed", "temperatures": [0.7], "reevaluate": {"k": 2, "first_seed": 1000},
    "base": REAL_BASE, "confirm": {"prompts": 2, "level": 0.05, "max_tries": 1},
    "grids": TWO_CONFIG_GRIDS[:1]}


@dataclass
class RealRepo:
    """The heavy sweep tests' one pipeline repository (the tiny board; sweeps ``t`` and ``c`` committed) and the
    sweeps run in it so far, in order."""

    repo: Path
    swept: list[str]
    #: False once a sweep in it failed (its processes may outlive the test): a later test then builds its own.
    sound: bool = True


def _real_sweeps_repo(path: Path) -> Path:
    """A copy of the checkout with its own venv, the tiny board and sweeps ``t`` and ``c``, committed."""
    repo = make_pipeline_repo(path, tiny_board())
    (repo / "sweeps").mkdir(exist_ok=True)
    (repo / "sweeps/t.yaml").write_text(yaml.safe_dump(TEST_SWEEP, sort_keys=False))
    (repo / "sweeps/c.yaml").write_text(yaml.safe_dump(CONFIRM_SWEEP, sort_keys=False))
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "pipeline")
    return repo


@pytest.fixture(scope="module")
def real_repo(tmp_path_factory: pytest.TempPathFactory) -> RealRepo:
    """Built once for the module's real sweeps (the suite runs a file in one worker: --dist loadfile)."""
    return RealRepo(_real_sweeps_repo(tmp_path_factory.mktemp("sweeps") / "repo"), [])


def _kill_group(leader: subprocess.Popen) -> None:
    """SIGKILL a runner's whole process group, and return once every process of it has ended: its children (a
    `dvc exp run`, a stage's process) hold the sweep's run lock until then, and on a loaded machine a killed
    process with a model in memory takes a moment to go. A user resumes after that."""
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()
    gone_by = time.monotonic() + 120
    while time.monotonic() < gone_by:
        try:
            os.killpg(leader.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)


def _stage_running(leader: subprocess.Popen) -> bool:
    """Whether a stage process (``mmw <stage>``, not the ``mmw sweep`` runner) runs under ``leader``."""
    import psutil

    try:
        children = psutil.Process(leader.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return False
    for child in children:
        try:
            args = child.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(Path(arg).name == "mmw" and i + 1 < len(args) and args[i + 1] != "sweep" for i, arg in enumerate(args)):
            return True
    return False


def _outcomes(repo: Path) -> list[dict[str, Any]]:
    path = repo / ".dvc/tmp/sweeps/t/runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.heavy
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="the failing config needs a machine without CUDA")
def test_a_real_sweep_survives_a_kill_resumes_and_is_collected(real_repo: RealRepo, tmp_path: Path) -> None:
    # First in the module's repository: its first config generates the baseline (nothing in the run-cache yet).
    assert real_repo.swept == [], f"runs before {real_repo.swept} in the module's repository"
    real_repo.swept.append("t")
    real_repo.sound = False  # until every step below has passed
    repo = real_repo.repo
    # From a plain shell (no venv on PATH), the environment's `mmw` by path, as a user runs it.
    mmw = [str(BIN / "mmw"), "sweep"]
    env = plain_shell_env()

    # 1. Start, and kill the whole process group while the second config runs.
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen([*mmw, "run", "t", "--no-reevaluate"], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.monotonic() + 3000  # a loaded 2-core machine took 990 s for a first config
    while not _outcomes(repo) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(2)
    assert first.poll() is None, (tmp_path / "first.log").read_text()
    # Well into the second config: one of its stage processes runs (polled, not a fixed wait).
    while not _stage_running(first) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert first.poll() is None, (tmp_path / "first.log").read_text()
    _kill_group(first)
    done_before = [o for o in _outcomes(repo) if o["status"] == "done"]
    assert len(done_before) == 1, _outcomes(repo)
    assert "generate_baseline" in done_before[0]["ran"]

    # 2. Resume: only what is not done runs; the failing config is recorded, does not stop the sweep, and the
    # exit code says something failed. The baseline is never regenerated for the second config.
    if not (repo / "params.yaml").is_file():  # killed while DVC stashed the -S overrides (mmw.sweep.runner)
        refused = subprocess.run([*mmw, "run", "t"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert refused.returncode == 2 and "git checkout -- params.yaml" in refused.stderr, refused.stderr
        run(repo, "git", "checkout", "--", "params.yaml")  # what the message tells the user
    resumed = subprocess.run([*mmw, "run", "t"], cwd=repo, env=env, capture_output=True, text=True, timeout=2400)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 1, output
    assert "done 1/3" in output and "queued 2" in output, output
    outcomes = _outcomes(repo)
    by_name: dict[str, dict[str, Any]] = {}
    for outcome in outcomes:
        by_name[outcome["name"]] = outcome
    assert sum(o["name"] == done_before[0]["name"] for o in outcomes) == 1  # the finished one was not rerun
    pool = {n: o for n, o in by_name.items() if not n.startswith("reeval-")}
    failed = [o for o in pool.values() if o["status"] == "failed"]
    assert len(pool) == 3 and len(failed) == 1 and "generate_baseline" in failed[0]["error"], pool
    second = next(o for o in pool.values() if o["status"] == "done" and o["name"] != done_before[0]["name"])
    for stage in ("generate_baseline", "rate_baseline", "prompts"):
        assert stage not in second["ran"] and stage in second["restored"], second
    # Re-evaluations: one per pick (k=1), under a reeval- name, with a new seed: a new baseline for that seed,
    # generated once and shared by the second pick.
    reevals = [o for n, o in by_name.items() if n.startswith("reeval-t-")]
    assert 1 <= len(reevals) <= 2 and all(o["status"] == "done" for o in reevals), reevals
    assert "generate_baseline" in reevals[0]["ran"]
    if len(reevals) == 2:
        assert "generate_baseline" in reevals[1]["restored"]
    # ... and the sweep ends with its answer written: its tables and the report page.
    assert (repo / "reports/sweeps/t/table.md").is_file() and (repo / "reports/index.html").is_file(), output
    assert "| constraint | T |" in (repo / "reports/sweeps/t/table.md").read_text()
    assert f"collected reports/sweeps/t: done 2, failed 1; {len(reevals)} re-evaluation runs" in output, output

    # 3. A rerun retries only the failed config.
    again = subprocess.run([*mmw, "run", "t", "--no-reevaluate"], cwd=repo, env=env, capture_output=True, text=True,
                           timeout=1200)
    assert "done 2/3, failed 1, queued 1" in again.stdout, again.stdout
    assert len(_outcomes(repo)) == len(outcomes) + 1

    # 4. Collect: tables that need no DVC cache.
    collected = subprocess.run([*mmw, "collect", "t", "--out", str(tmp_path / "out")], cwd=repo, env=env,
                               capture_output=True, text=True, timeout=600)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    out = tmp_path / "out" / "t"
    results = pl.read_parquet(out / "results.parquet")
    assert sorted(results["status"].to_list()) == ["done", "done", "failed"]
    assert set(results.columns) >= {"config_id", "status", "error", "model.temperature", "scheme.sampler",
                                    "scheme.delta", "family", "randomness_kind", "all.size", "wall_s"}
    assert results.filter(pl.col("status") == "failed")["error"][0]
    done = results.filter(pl.col("status") == "done")
    assert set(done["family"]) == {"distribution_shift", "exponential"}
    assert (done["randomness_kind"] == "text-dependent").all()
    assert pl.read_csv(out / "results.csv").height == 3
    attacks = pl.read_parquet(out / "attacks.parquet")
    assert set(attacks["config_id"]) <= set(done["config_id"]) and attacks.height >= 2
    table = pl.read_parquet(out / "table.parquet")
    assert table.height == 2 * 4  # two families at one temperature x the paper's four constraints
    picked = table.filter(pl.col("config_id").is_not_null())
    assert (picked["k"] <= 1).all() and set(picked["config_id"]) <= set(done["config_id"])
    assert "| constraint | T |" in (out / "table.md").read_text()
    reevaluations = pl.read_parquet(out / "reevaluations.parquet")
    assert set(reevaluations["config_id"]) <= set(done["config_id"]) and (reevaluations["seed"] == 1000).all()
    # The re-evaluation runs never enter the pool: the results hold the three configs only.
    assert not any(str(n).startswith("reeval-") for n in results["experiment"])
    real_repo.sound = True


# ------------------------------------------------------------------------------------------ fast: the tables


def _results(rows: list[dict[str, Any]]) -> pl.DataFrame:
    defaults = {"status": "done", "seed": 0, "model.name": "m", "scheme.alpha": 0.02, "all.fpr_ci_high": 0.1,
                "scheme.randomness": "window", "scheme.window": 1, "scheme.delta": None}
    frame = pl.DataFrame([{**defaults, **row} for row in rows], infer_schema_length=None)
    return frame.with_columns(pl.col("scheme.sampler").alias("family"),
                              pl.col("experiment").alias("experiment"))


def test_the_paper_table_picks_per_cell_and_summarises_the_reevaluations() -> None:
    """Hand-built pool at T = 0.7: distribution shift a (size 10, quality 0.95, R 0.5) and b (size 20, quality
    0.995, R 0.1); exponential c (size 30, quality 1.0, R 0.3). Picks by hand: 1 % + R 0.2 -> DS none (a fails
    quality, b fails R), exp c; 1 % no R -> DS b, exp c; 10 % + R 0.2 -> DS a, exp c; 10 % no R -> DS a, exp c.
    Re-evaluations of a: 12, 14, 11, 30, undetected -> median 14, |x - 14| = 2, 0, 3, 16, inf -> MAD 3."""
    results = _results([
        {"config_id": "a", "experiment": "s-a", "model.temperature": 0.7, "scheme.sampler": "distribution_shift",
         "all.size": 10.0, "all.relative_quality": 0.95, "all.tamper_resistance": 0.5},
        {"config_id": "b", "experiment": "s-b", "model.temperature": 0.7, "scheme.sampler": "distribution_shift",
         "all.size": 20.0, "all.relative_quality": 0.995, "all.tamper_resistance": 0.1},
        {"config_id": "c", "experiment": "s-c", "model.temperature": 0.7, "scheme.sampler": "exponential",
         "all.size": 30.0, "all.relative_quality": 1.0, "all.tamper_resistance": 0.3},
        {"config_id": "d", "experiment": "s-d", "model.temperature": 0.7, "scheme.sampler": "exponential",
         "status": "failed", "all.size": None, "all.relative_quality": None, "all.tamper_resistance": None},
    ])
    reevaluations = pl.DataFrame({"config_id": ["a"] * 5, "seed": [1000, 1001, 1002, 1003, 1004],
                                  "status": ["done"] * 5, "all.size": [12.0, 14.0, 11.0, 30.0, None]})
    from mmw.sweep.tables import table_markdown
    from mmw.sweep.collect import paper_table, picked_config_ids

    table = paper_table(results, reevaluations, k=5)
    got = {(r["family"], r["max_quality_loss"], r["min_tamper_resistance"]): r for r in table.iter_rows(named=True)}
    expected = {("distribution_shift", 0.01, 0.2): None, ("distribution_shift", 0.01, 0.0): "b",
                ("distribution_shift", 0.1, 0.2): "a", ("distribution_shift", 0.1, 0.0): "a",
                ("exponential", 0.01, 0.2): "c", ("exponential", 0.01, 0.0): "c", ("exponential", 0.1, 0.2): "c",
                ("exponential", 0.1, 0.0): "c"}
    assert {k: v["config_id"] for k, v in got.items()} == expected
    a = got[("distribution_shift", 0.1, 0.2)]
    assert (a["size_median"], a["size_mad"], a["k"], a["pick_size"]) == (14.0, 3.0, 5, 10.0)
    assert got[("exponential", 0.1, 0.0)]["k"] == 0  # picked, not re-evaluated yet
    assert sorted(picked_config_ids(results)) == ["a", "b", "c"]
    markdown = table_markdown(table, "test scale")
    assert "14 (3) k=5" in markdown and "no re-eval" in markdown
    # DS at 1% quality, R >= 0.2: nothing feasible -> "none" (as reports/index.html prints it), not "∞" (undetected)
    ds_row = next(line for line in markdown.splitlines() if line.startswith("| 1% quality, R ≥ 0.2 | 0.7 |"))
    assert ds_row.split(" | ")[2] == "none"


def test_the_confirmation_split_is_recorded_and_disjoint(tmp_path: Path) -> None:
    repo = _definition(tmp_path, DS, base={"prompts.per_task": 2, "prompts.offset": 1},
                       confirm={"prompts": 6, "level": 0.1, "max_tries": 3})
    sweep = expand("bad", BOARD, repo / "sweeps")
    confirmation = sweep.confirmation
    assert (sweep.tuning_offset, sweep.tuning, confirmation.offset, confirmation.prompts) == (1, 2, 3, 6)
    assert confirmation.overrides == {"prompts.offset": 3, "prompts.per_task": 6}
    assert (confirmation.level, confirmation.max_tries) == (0.1, 3)
    assert expand("smoke", BOARD, SWEEPS).confirmation.overrides == {"prompts.offset": 1, "prompts.per_task": 4}
    assert confirmation.constraints == ((0.01, 0.2), (0.01, 0.0), (0.1, 0.2), (0.1, 0.0))
    repo = _definition(tmp_path, DS, base={"prompts.per_task": 2}, confirm={"prompts": 6, "quality_losses": [0.1]})
    ten = expand("bad", BOARD, repo / "sweeps")
    assert ten.confirmation.constraints == ((0.1, 0.2), (0.1, 0.0))
    assert split_record(ten)["quality_losses"] == [0.1]


def test_only_the_configured_constraints_are_confirmed() -> None:
    """`confirm.quality_losses: [0.1]`: the confirmed table has the 10 % cells (with and without R) only."""
    from test_confirm import _sweep_tables

    from mmw.sweep.cells import confirmed_table

    results, reevaluations, prompts = _sweep_tables({"a": 1.0, "b": 1.0, "c": 1.0}, {"c": 0.8, "b": 0.99})
    for losses in ((0.01, 0.1), (0.1,)):
        confirmation = Confirmation(prompts=30, offset=2, quality_losses=list(losses))
        table, _ = confirmed_table(results, reevaluations, prompts, confirmation, k=2)
        assert sorted(set(table["max_quality_loss"])) == list(losses) and table.height == 2 * len(losses)
        ten = table.filter((pl.col("max_quality_loss") == 0.1) & (pl.col("min_tamper_resistance") == 0.0))
        assert ten.select("status", "config_id").row(0) == ("confirmed", "b")


@pytest.mark.heavy
def test_a_real_sweep_is_tuned_confirmed_on_held_out_prompts_and_tabled(real_repo: RealRepo,
                                                                       tmp_path: Path) -> None:
    """In the module's repository, after the killed sweep where that ran (its tuning run then comes from DVC's
    run-cache; nothing below depends on it)."""
    real_repo.swept.append("c")
    # A failed sweep before it may have left processes that hold the repository's run lock: then a repository of
    # its own.
    repo = real_repo.repo if real_repo.sound else _real_sweeps_repo(tmp_path / "repo")
    done = subprocess.run([str(BIN / "mmw"), "sweep", "run", "c"], cwd=repo, env=plain_shell_env(),
                          capture_output=True, text=True, timeout=5400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "confirmation round 1" in done.stdout
    out = repo / "reports/sweeps/c"
    prompts = pl.read_parquet(out / "prompts.parquet")
    tuning = set(prompts.filter(pl.col("role") == "tuning")["prompt_id"])
    confirmation = set(prompts.filter(pl.col("role") == "confirmation")["prompt_id"])
    assert len(tuning) == 3 and len(confirmation) == 6 and tuning.isdisjoint(confirmation)
    split = json.loads((out / "split.json").read_text())
    assert (split["tuning_prompts_per_task"], split["confirm_offset"], split["confirm_prompts_per_task"]) == (1, 1, 2)
    table = pl.read_parquet(out / "table.parquet")
    print(done.stdout[-2500:], (out / "table.md").read_text(), sep="\n")
    assert table.height == 4 and "pending" not in table["status"].to_list()
    assert set(table["status"]) <= {"confirmed", "not confirmed", "unresolved", "no feasible setting"}
    tried = table.filter(pl.col("tries") > 0)
    assert (tried["k"] == 2).all() and (tried["n_prompts"] == 6).all()
    reevaluations = pl.read_parquet(out / "reevaluations.parquet")
    # Every confirmation run used a fresh seed and its own key: no run repeated, each seed's baseline made once.
    assert reevaluations["experiment"].n_unique() == reevaluations.height
    assert "Cells:" in (out / "table.md").read_text() and (out / "plan.parquet").is_file()
    again = subprocess.run([str(BIN / "mmw"), "sweep", "plan", "c"], cwd=repo, env=plain_shell_env(),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Prompts needed" in again.stdout

    # Another machine: a fresh clone with the committed evidence only (no experiment refs, no DVC cache). The
    # sweep runs nothing there, and its tables are those of the machine that ran it.
    runs = sorted((out / "runs").glob("*.parquet"))
    configs = pl.read_parquet(out / "results.parquet").height
    assert len(runs) == configs + reevaluations.height, runs  # every tuning and confirmation run has its file
    print("evidence files:", len(runs), "bytes:", [p.stat().st_size for p in runs])
    run(repo, "git", "add", "reports/sweeps/c/runs")
    run(repo, "git", "commit", "-qm", "evidence")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    assert not list(clone.glob(".dvc/cache")) and "refs/exps" not in run(clone, "git", "for-each-ref").stdout
    there = subprocess.run([str(BIN / "mmw"), "sweep", "run", "c"], cwd=clone, env=plain_shell_env(),
                           capture_output=True, text=True, timeout=600)
    assert there.returncode == 0, there.stdout[-3000:] + there.stderr[-3000:]
    assert f"done {configs}/{configs}, failed 0, queued 0" in there.stdout, there.stdout
    assert "Running stage" not in there.stdout and "confirmation round" not in there.stdout, there.stdout
    for name in ("results", "table", "tries", "prompts", "reevaluations", "randomness", "plan", "timings"):
        assert pl.read_parquet(clone / f"reports/sweeps/c/{name}.parquet").equals(
            pl.read_parquet(out / f"{name}.parquet")), name
    assert (clone / "reports/sweeps/c/table.md").read_text() == (out / "table.md").read_text()


# ------------------------------------------------------------------------------------------ fast: resuming


class _FakeSweepWorld:
    """One machine's DVC experiments, faked: one cell of three configs (the tuning rows of test_confirm's
    ``_sweep_tables``: c ranks first, then b, then a) whose true relative quality is a 1.0, b 0.99, c 0.8. The
    executor 'runs' a job by creating its experiment ref (``finished``); reading an experiment gives its params,
    metrics and per-prompt rows, which depend only on its name (deterministic). Everything else — evidence files,
    resuming, collection, confirmation — is the real code. ``stop_after``: the executor is killed
    (KeyboardInterrupt) before its n-th job overall. ``model``: the generator the runs report."""

    RHO = {"a": 1.0, "b": 0.99, "c": 0.8}

    def __init__(self, stop_after: int | None = None, model: str = "m") -> None:
        from test_confirm import _sweep_tables

        tuning, _, _ = _sweep_tables(dict.fromkeys(self.RHO, 1.0), {})
        self.tuning = {r["config_id"]: r for r in tuning.iter_rows(named=True)}
        self.finished: dict[str, str] = {}
        self.ran: list[str] = []
        self.stop_after = stop_after
        self.model = model

    def run(self, jobs: Any, record: Any) -> None:
        from mmw.sweep.runner import Outcome

        for job in jobs:
            if self.stop_after is not None and len(self.ran) >= self.stop_after:
                raise KeyboardInterrupt
            assert job.name not in self.finished, f"{job.name} ran twice"
            assert (job.env.get("MMW_KEY") is not None) == job.name.startswith("reeval-")
            self.ran.append(job.name)
            self.finished[job.name] = f"sha-{job.name}"
            self.overrides[job.name] = job.overrides
            record(Outcome(name=job.name, config_id=job.config_id, status="done", error=None, wall_s=1.0,
                           finished="2026-01-01T00:00:00+00:00"))

    overrides: dict[str, dict[str, Any]] = {}

    def read_experiment(self, _repo: Path, sha: str) -> tuple[dict, dict, dict, pl.DataFrame]:
        import numpy as np
        from test_confirm import _run_rows

        name = sha.removeprefix("sha-")
        params = {**self.overrides[name], "model.name": self.model, "rate.judge": "j", "key": "never-stored"}
        if name.startswith("reeval-"):
            cid, _, seed = name.removeprefix("reeval-t-").rpartition("-s")
            metrics = {"all.size": 12.0, "all.size_valid": 28.0 + int(seed) % 2}
        else:
            cid = name.removeprefix("t-")
            row = self.tuning[cid]
            params["seed"] = 0
            metrics = {k: row[k] for k in ("all.size", "all.size_valid", "all.relative_quality",
                                          "all.tamper_resistance")}
        rows = _run_rows(name, self.RHO[cid], np.random.default_rng(list(name.encode()))).drop("experiment")
        attacks = {"swap": {"watermarked": 0.9, "quality_retained": 0.95, "size": 20.0}}
        return {k: v for k, v in params.items() if k != "key"}, metrics, attacks, rows


def serve(monkeypatch: pytest.MonkeyPatch, world: Any) -> None:
    """This machine's experiment refs and reads, served by ``world`` (its ``finished`` name -> sha and its
    ``read_experiment``)."""
    import mmw.sweep
    import mmw.sweep.runner
    import mmw.sweep.units

    refs = lambda _repo, _baseline=None: dict(world.finished)  # noqa: E731
    monkeypatch.setattr(mmw.sweep.runner, "finished_experiments", refs)
    monkeypatch.setattr(mmw.sweep.units, "finished_experiments", refs)
    monkeypatch.setattr(mmw.sweep.units, "experiment_refs",
                        lambda _repo: {n: (sha, "0" * 40) for n, sha in world.finished.items()})
    monkeypatch.setattr(mmw.sweep.units, "read_experiment", world.read_experiment)


def _fake_sweep(monkeypatch: pytest.MonkeyPatch, world: _FakeSweepWorld) -> Any:
    """The sweep ``t`` (one cell, K = 2, 30 held-out prompts), its experiment refs and reads served by ``world``."""
    from mmw.sweep.definition import Config, Reevaluation, Sweep

    serve(monkeypatch, world)
    world.overrides = {}
    scheme = {"model.temperature": 0.7, "scheme.sampler": "distribution_shift", "scheme.score": "sum",
              "scheme.randomness": "window", "scheme.window": 1}
    configs = [Config(config_id=c, grid="g", overrides={**scheme, "scheme.delta": float(i)})
               for i, c in enumerate(world.RHO)]
    return Sweep(name="t", description="", configs=configs, reevaluate=Reevaluation(k=2, first_seed=1000),
                 confirmation=Confirmation(prompts=30, offset=2, level=0.05, max_tries=2), tuning=2)


def _git_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    run(path, "git", "init", "-q")
    (path / "README.md").write_text("sweep\n")
    run(path, "git", "add", "-A")
    run(path, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return path


def _clone_with_evidence(source: Path, dest: Path) -> Path:
    """Commit ``source``'s evidence directory and clone it: the other machine has the files, no experiment ref,
    no DVC cache, no run log."""
    run(source, "git", "add", "reports/sweeps/t/runs")
    run(source, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "evidence")
    subprocess.run(["git", "clone", "-q", str(source), str(dest)], check=True)
    assert not (dest / ".dvc").exists() and (dest / "reports/sweeps/t/runs").is_dir()
    return dest


def _collected(repo: Path, sweep: Any) -> dict[str, Any]:
    from mmw.sweep.collect import collect

    out = repo / "reports/sweeps/t"
    collect(repo, sweep, out, "test", echo=lambda _: None)
    tables = {p.name: pl.read_parquet(p) for p in sorted(out.glob("*.parquet"))}
    return {**tables, **{p.name: p.read_text() for p in sorted(out.glob("*.md"))}}


def _assert_same(found: dict[str, Any], expected: dict[str, Any]) -> None:
    assert sorted(found) == sorted(expected)
    for name, value in expected.items():
        same = value.equals(found[name]) if isinstance(value, pl.DataFrame) else value == found[name]
        assert same, f"{name} differs:\n{found[name]}\n{value}"


def _straight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[_FakeSweepWorld, dict[str, Any]]:
    from mmw.sweep import run_sweep

    straight = _FakeSweepWorld()
    sweep = _fake_sweep(monkeypatch, straight)
    repo = _git_repo(tmp_path / "straight")
    run_sweep(repo, sweep, executor=straight, echo=lambda _: None)
    return straight, _collected(repo, sweep)


@pytest.mark.parametrize("stop_after", [0, 2, 4, 6])
@pytest.mark.parametrize("resume_on", ["same machine", "another machine"])
def test_an_interrupted_sweep_resumes_without_repeating_a_run_and_gives_the_same_tables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_after: int, resume_on: str) -> None:
    """Killed before its 1st, 3rd (tuning), 5th (inside confirmation round 1: c's second run) or 7th run (inside
    round 2: the fallback b's second run), then rerun until done — on the same machine, or on a fresh clone that
    holds only the committed evidence files: every run happens exactly once, nothing written before the kill is
    lost, and every table equals that of an uninterrupted sweep (c not confirmed on quality, its fallback b
    confirmed at 10 %)."""
    from mmw.sweep import run_sweep

    straight, expected = _straight(tmp_path, monkeypatch)
    assert straight.ran == ["t-a", "t-b", "t-c", "reeval-t-c-s1000", "reeval-t-c-s1001", "reeval-t-b-s1000",
                            "reeval-t-b-s1001"]
    table = expected["table.parquet"]
    ten = table.filter((pl.col("max_quality_loss") == 0.1) & (pl.col("min_tamper_resistance") == 0.0))
    assert ten.select("status", "config_id", "tries").row(0) == ("confirmed", "b", 2)

    first = _FakeSweepWorld(stop_after=stop_after)
    sweep = _fake_sweep(monkeypatch, first)
    repo = _git_repo(tmp_path / "first")
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_sweep(repo, sweep, executor=first, echo=lines.append)
    assert len(first.ran) == stop_after
    assert len(list((repo / "reports/sweeps/t/runs").glob("*.parquet"))) == stop_after  # each landed unit kept
    if resume_on == "same machine":
        first.stop_after = None
        second = first
    else:
        repo = _clone_with_evidence(repo, tmp_path / "second") if stop_after else _git_repo(tmp_path / "second")
        second = _FakeSweepWorld()
        sweep = _fake_sweep(monkeypatch, second)
    run_sweep(repo, sweep, executor=second, echo=lines.append)
    ran = first.ran + (second.ran if second is not first else [])
    assert sorted(ran) == sorted(straight.ran)  # each exactly once (the executor asserts no repeat)
    _assert_same(_collected(repo, sweep), expected)


def test_a_clone_with_the_committed_evidence_runs_nothing_and_collects_the_same_tables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other machine: a fresh clone carrying only the committed evidence (no experiment refs, no DVC cache).
    `run` treats every unit as finished; `collect` writes tables identical to the original machine's, the
    decisions (picks, fallbacks, statuses) included. The evidence never holds the key; a unit's file name is a
    hash of the overrides it ran with."""
    from mmw.sweep import run_sweep
    from mmw.sweep.definition import config_id
    from mmw.sweep.units import META, sweep_units

    straight, expected = _straight(tmp_path, monkeypatch)
    runs = tmp_path / "straight/reports/sweeps/t/runs"
    files = sorted(runs.glob("*.parquet"))
    assert len(files) == len(straight.ran) == 7
    sweep = _fake_sweep(monkeypatch, straight)
    units = sweep_units(sweep)
    assert {p.stem for p in files} == {config_id(units[n].overrides) for n in straight.ran}
    for path in files:
        meta = json.loads(pl.read_parquet_metadata(path)[META])
        assert "key" not in meta["params"] and "never-stored" not in path.read_bytes().decode("latin-1")
        assert meta["params"]["model.name"] == "m" and meta["experiment"] in straight.ran
    assert sum(p.stat().st_size for p in files) < 7 * 20_000

    clone = _clone_with_evidence(tmp_path / "straight", tmp_path / "clone")
    other = _FakeSweepWorld()
    sweep = _fake_sweep(monkeypatch, other)
    lines: list[str] = []
    run_sweep(clone, sweep, executor=other, echo=lines.append)
    assert other.ran == [] and any("done 3/3" in line for line in lines), lines
    _assert_same(_collected(clone, sweep), expected)
    assert expected["tries.parquet"].height >= 2 and "Prompts needed" in expected["table.md"]

    # The report built there shows the planner's row for every unresolved cell (here the 1 % cells).
    from mmw.reporting.page import build_report

    unresolved = sum(expected[f"{t}.parquet"].filter(pl.col("status") == "unresolved").height
                     for t in ("table", "randomness"))
    assert unresolved >= 1 and expected["plan.parquet"].height == unresolved
    build_report(clone, "t", clone / "reports/index.html")
    html = (clone / "reports/index.html").read_text()
    assert html.split('id="plan-table"')[1].split("</table>")[0].count("<tr>") == 1 + unresolved


def test_a_sweep_run_before_evidence_files_existed_is_exported_even_under_changed_config_ids(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep whose experiments finished without evidence files (run by an older version): `export` writes the
    file of every finished experiment from its ref, and the tables equal those of a run that wrote them as it
    went. When the definition's config ids have changed since (a param added to every config), each experiment
    is matched to its unit by the params it ran with, and nothing runs again."""
    import mmw.sweep.units as units_module
    from mmw.sweep import run_sweep
    from mmw.sweep.definition import Config, config_id
    from mmw.sweep.units import export, load_units

    straight, expected = _straight(tmp_path, monkeypatch)
    repo = tmp_path / "straight"
    runs = repo / "reports/sweeps/t/runs"
    before = {p.name: p.read_bytes() for p in runs.glob("*.parquet")}
    shutil.rmtree(runs)
    sweep = _fake_sweep(monkeypatch, straight)
    straight.overrides = {j: o for j, o in _ran_overrides(sweep).items()}
    assert len(export(repo, sweep, echo=lambda _: None)) == 7
    assert sorted(p.name for p in runs.glob("*.parquet")) == sorted(before)
    _assert_same(_collected(repo, sweep), expected)

    shutil.rmtree(runs)
    configs = [Config(config_id(o), c.grid, o) for c in sweep.configs
               for o in [dict(sorted({**c.overrides, "scheme.added": None}.items()))]]
    changed = type(sweep)(name="t", description="", configs=configs, reevaluate=sweep.reevaluate,
                          confirmation=sweep.confirmation, tuning=sweep.tuning)
    monkeypatch.setattr(units_module, "experiment_params",
                        lambda _repo, sha: straight.read_experiment(_repo, sha)[0])
    lines: list[str] = []
    assert len(export(repo, changed, echo=lines.append)) == 7 and not any("match no unit" in x for x in lines)
    stored = load_units(repo, changed)
    assert sorted(u.meta["ran_as"] for u in stored) == sorted(straight.ran)
    ran = list(straight.ran)
    run_sweep(repo, changed, executor=straight, echo=lines.append)
    assert straight.ran == ran  # nothing ran again
    table = _collected(repo, changed)["table.parquet"]
    renamed = {c.config_id: n for c, n in zip(changed.configs, "abc", strict=True)}
    assert table.with_columns(pl.col("config_id").replace(renamed)).drop("pending").equals(
        expected["table.parquet"].drop("pending"))


def _ran_overrides(sweep: Any) -> dict[str, dict[str, Any]]:
    from mmw.sweep.units import sweep_units

    return {name: unit.overrides for name, unit in sweep_units(sweep).items()}


def _write_foreign(repo: Path, monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """Into ``repo``'s evidence of sweep ``t``, a file that does not belong: a run of a unit the definition does
    not have (another delta), or a run of another sweep."""
    from mmw.sweep.units import Unit, write_unit

    world = _FakeSweepWorld()
    sweep = _fake_sweep(monkeypatch, world)
    config = sweep.configs[0]
    overrides = {**config.overrides, "scheme.delta": 9.0} if what == "definition" else config.overrides
    world.overrides["t-a"] = overrides
    path = write_unit(repo, sweep, Unit("t-a", config.config_id, "tuning", None, overrides), "sha-t-a", "0" * 40,
                      1.0, None, [], [])
    if what == "sweep":
        meta = json.loads(pl.read_parquet_metadata(path)[META_KEY])
        pl.read_parquet(path).write_parquet(path, metadata={META_KEY: json.dumps({**meta, "sweep": "u"})})


META_KEY = "mmw.unit"


@pytest.mark.parametrize(("what", "named"), [("model", "model.name"), ("definition", "sweeps/t.yaml"),
                                             ("sweep", "sweep")])
def test_evidence_of_another_generator_definition_or_sweep_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, named: str) -> None:
    """Bad input: a file that does not belong among a sweep's evidence stops `run` before anything runs and
    `collect` / `export` with one line naming the setting (exit 2)."""
    from mmw.sweep import run_sweep
    from mmw.sweep.units import load_units

    _, _ = _straight(tmp_path, monkeypatch)
    repo = tmp_path / "straight"
    if what == "model":  # a second unit's file written by a run of another generator
        for path in (repo / "reports/sweeps/t/runs").glob("*.parquet"):
            meta = json.loads(pl.read_parquet_metadata(path)[META_KEY])
            if meta["experiment"] == "t-b":
                meta["params"]["model.name"] = "other-model"
                pl.read_parquet(path).write_parquet(path, metadata={META_KEY: json.dumps(meta)})
    else:
        _write_foreign(repo, monkeypatch, what)
    world = _FakeSweepWorld()
    sweep = _fake_sweep(monkeypatch, world)
    with pytest.raises(SpecError) as refused:
        load_units(repo, sweep)
    assert str(refused.value).startswith(named) and "\n" not in str(refused.value), refused.value
    with pytest.raises(SpecError):
        run_sweep(repo, sweep, executor=world, echo=lambda _: None)
    assert world.ran == []


def test_collect_and_export_exit_2_on_foreign_evidence(tmp_path: Path) -> None:
    """Through the CLI, on a sweep definition in a repository without DVC: one line naming the setting, exit 2,
    nothing collected."""
    from mmw.sweep import load_sweep
    from mmw.sweep.units import Unit, write_unit

    import mmw.sweep.units as units_module

    repo = _git_repo(tmp_path / "r")
    shutil.copy(REPO / "params.yaml", repo / "params.yaml")
    (repo / "sweeps").mkdir()
    (repo / "sweeps/t.yaml").write_text(yaml.safe_dump(
        {"description": "t", "temperatures": [0.7], "reevaluate": {"k": 2, "first_seed": 1000},
         "grids": TWO_CONFIG_GRIDS}, sort_keys=False))
    sweep = load_sweep(repo, "t")
    original = units_module.read_experiment
    try:
        for config, model in zip(sweep.configs, ("m1", "m2"), strict=True):
            units_module.read_experiment = lambda _r, _s, model=model: ({"model.name": model}, {}, {}, None)
            write_unit(repo, sweep, Unit(f"t-{config.config_id}", config.config_id, "tuning", None,
                                         config.overrides), "0" * 40, "0" * 40, 1.0, None, [], [])
    finally:
        units_module.read_experiment = original
    for verb in ("collect", "export"):
        result = CliRunner().invoke(app, ["sweep", verb, "t", "--repo", str(repo)])
        assert result.exit_code == 2, result.output
        error = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and error[0].startswith("error: model.name") and "m1" in error[0], result.output
    assert not (repo / "reports/sweeps/t/table.md").exists()


def test_one_local_run_per_repository_and_a_left_over_dvc_run_keeps_the_lock(tmp_path: Path) -> None:
    """The lock is held by the runner and inherited by the `dvc exp run` it starts: while such a child outlives
    its runner (a SIGKILL of the runner alone), a second runner refuses to start instead of running its job
    again beside it."""
    from mmw.sweep.runner import hold_run_lock

    fd = hold_run_lock(tmp_path)
    with pytest.raises(SpecError) as held:
        hold_run_lock(tmp_path)
    assert "another local sweep run" in str(held.value) and f"pid {os.getpid()}" in str(held.value)
    child = subprocess.Popen(["sleep", "30"], pass_fds=(fd,))
    try:
        os.close(fd)  # the runner is gone; its child is not
        with pytest.raises(SpecError):
            hold_run_lock(tmp_path)
    finally:
        child.kill()
        child.wait()
    os.close(hold_run_lock(tmp_path))  # free again once the child has ended


def test_clear_interrupted_removes_only_killed_temp_runs(tmp_path: Path) -> None:
    """DVC's records of `dvc exp run --temp` runs: a killed one (status running, its scratch copy still there)
    is removed with its copy; a finished one, a queued workspace run and a copy outside DVC's scratch
    folder are left alone."""
    from mmw.sweep.runner import DVC_RUNS, DVC_SCRATCH, clear_interrupted

    def record(rev: str, status: int, root: Path, location: str = "tempdir") -> Path:
        root.mkdir(parents=True, exist_ok=True)
        path = tmp_path / DVC_RUNS / rev / f"{rev}.run"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"location": location, "root_dir": str(root), "name": f"t-{rev}",
                                    "status": status}))
        return path

    killed = record("a1", 2, tmp_path / DVC_SCRATCH / "tmpa")
    finished = record("b2", 3, tmp_path / DVC_SCRATCH / "tmpb")
    workspace = record("c3", 1, tmp_path / DVC_SCRATCH / "tmpc", location="workspace")
    outside = record("d4", 1, tmp_path / "elsewhere")
    assert clear_interrupted(tmp_path) == ["t-a1"]
    assert not killed.exists() and not (tmp_path / DVC_SCRATCH / "tmpa").exists()
    assert finished.exists() and workspace.exists() and outside.exists() and (tmp_path / "elsewhere").is_dir()
    assert clear_interrupted(tmp_path) == []


_TRIVIAL_STAGE = """import json, os, time, yaml
params = yaml.safe_load(open("params.yaml"))
hold = os.environ.get("HOLD")  # the killed run's second job: say so, then wait (up to 10 min) to be killed
if hold and params["x"] == 1:
    open(hold + ".started", "w").close()
    for _ in range(6000):
        if not os.path.exists(hold):
            break
        time.sleep(0.1)
os.makedirs("reports", exist_ok=True)
json.dump({"all": {"size": float(params["x"])}}, open("reports/metrics.json", "w"))
"""

_DRIVER = """import sys
from pathlib import Path
from mmw.sweep.runner import Job, LocalDvcExecutor, run_jobs
repo = Path(sys.argv[1])
jobs = [Job(name=f"t-{i}", config_id=str(i), overrides={"x": i}) for i in range(2)]
run_jobs(repo, "t", "t: configs", jobs, LocalDvcExecutor(repo))
"""


@pytest.mark.heavy
def test_a_killed_local_run_leaves_nothing_that_a_rerun_repeats_or_lists_twice(tmp_path: Path) -> None:
    """Real `dvc exp run --temp` on a one-stage pipeline that only writes its metric (no models): the runner's
    process group is killed (SIGKILL) inside the second job, once its stage has started (in the killed run that
    stage waits to be killed, polled, not a fixed sleep). DVC then lists that job as running, from the scratch copy
    it left; the rerun clears it, runs only the second job, and afterwards every experiment is listed once."""
    import dvc.api

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "params.yaml").write_text("x: 0\n")
    (repo / "stage.py").write_text(_TRIVIAL_STAGE)
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"work": {
        "cmd": "python stage.py", "deps": ["stage.py"], "params": ["x"],
        "metrics": [{"reports/metrics.json": {"cache": False}}]}}}))
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    for setting in ("core.analytics", "core.check_update"):
        run(repo, "dvc", "config", setting, "false")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "pipeline")
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    env = plain_shell_env()
    log = repo / ".dvc/tmp/sweeps/t/runs.jsonl"

    hold = tmp_path / "hold"
    hold.touch()
    first = subprocess.Popen([sys.executable, str(driver), str(repo)], env={**env, "HOLD": str(hold)},
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = tmp_path / "hold.started"
    deadline = time.monotonic() + 600
    while not started.is_file() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None and log.is_file() and started.is_file()  # the first job done, inside the second
    _kill_group(first)
    hold.unlink()
    listed = [(r.get("Experiment"), r.get("State")) for r in dvc.api.exp_show(repo=str(repo))]
    assert ("t-1", "Running") in listed, listed  # the left-over DVC reports

    again = subprocess.run([sys.executable, str(driver), str(repo)], env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "done 1/2, failed 0, queued 1" in again.stdout and "done 2/2" in again.stdout, again.stdout
    assert [json.loads(line)["name"] for line in log.read_text().splitlines()] == ["t-0", "t-1"]
    names = [r.get("Experiment") for r in dvc.api.exp_show(repo=str(repo)) if r.get("Experiment")]
    assert sorted(names) == ["t-0", "t-1"], names
    assert not list((repo / ".dvc/tmp/exps/standalone").glob("tmp*"))


# ------------------------------------------------------------------------------------------ fast: the pilot plan


def _pilot_frames() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """``(table, results, reevaluations)`` of an exploratory collection: two picks re-run 5 times each."""
    table = pl.DataFrame({"temperature": [1.0, 1.0], "family": ["binary", "binary"], "max_quality_loss": [0.1, 0.01],
                          "min_tamper_resistance": [0.0, 0.0], "config_id": ["p", "q"]})
    quality = {"p": [0.90, 0.92, 0.94, 0.96, 0.98], "q": [1.00, 1.01, 1.02, 1.03, 1.04]}
    reevaluations = pl.DataFrame([{"config_id": c, "seed": 1000 + i, "status": "done", "all.relative_quality": v,
                                   "all.tamper_resistance": 0.5} for c, vs in quality.items() for i, v in enumerate(vs)])
    results = pl.DataFrame({"attacks.fraction": [1 / 3], "prompts.per_task": [1], "all.relative_quality_n": [3],
                            "wall_s": [60.0]})
    return table, results, reevaluations


def test_a_sweep_without_confirmation_is_planned_as_a_pilot_from_its_re_runs() -> None:
    """Two picks re-run 5 times each on 3 prompts: quality runs 0.90..0.98 (mean 0.94) and 0.99..1.03 (mean 1.02)
    in steps of 0.02 and 0.01: SDs sqrt(0.001) and sqrt(0.00025), pooled sqrt(0.000625) = 0.025. Level 0.05 over
    2 tries: z = 1.95996. For the 10 % cell of the first pick, h = z * 0.025 / sqrt(5) = 0.0219, gap 0.94 - 0.9 =
    0.04: n' = 3 * (h / gap)^2 = 0.9 -> the 3 prompts it has, at K = 5; the cheapest plan runs K = 2, whose
    variance is (0.02 + 0.98 * 5 / 2) times K = 5's: 7.41 prompts; the distribution-free floor at that margin
    (4 points over 90) is ceil(log 40 / log(1 + 4 / 90)) = 85 prompts, 29 per task."""
    from scipy.stats import norm

    from mmw.sweep.plan import pilot_plan, pilot_table

    table, results, reevaluations = _pilot_frames()
    pilot = pilot_table(table, results, reevaluations, level=0.05, max_tries=2)
    half = norm.ppf(1 - 0.025) * 0.000625 ** 0.5 / 5 ** 0.5
    p = pilot.row(0, named=True)
    assert (p["quality"], p["n_prompts"], p["n_attacked"], p["k"]) == (pytest.approx(0.94), 3, 3, 5)
    assert p["quality_low"] == pytest.approx(0.94 - half)
    plan = pilot_plan(table, results, reevaluations, 0.05, 2, 5).sort("max_quality_loss")
    rows = plan.to_dicts()
    assert (rows[1]["quality_prompts"], rows[1]["floor_prompts"], rows[1]["k"]) == (pytest.approx(7.41), 85, 2)
    assert (rows[1]["prompts_per_task"], rows[1]["quality_toward"]) == (29, "pass")
    # 1 %: estimate 1.02 vs 0.99 -> gap 0.03, n' = 3 (h / 0.03)^2 = 1.6 -> the 3 it has; the floor (3 points over
    # 99) is 124 prompts, 42 per task; 2 runs of 126 prompts at 20 s a prompt (60 s over 3 prompts, all charged
    # per prompt).
    assert rows[0]["floor_prompts"] == 124 and rows[0]["prompts_per_task"] == 42
    assert rows[0]["quality"] == pytest.approx(1.02)
    assert rows[0]["cpu_s"] == pytest.approx(2 * 126 * 20.0)


def test_plan_refuses_tables_collected_without_confirmation_and_plans_a_pilot(tmp_path: Path) -> None:
    """A sweep with ``confirm`` is planned only from a confirmed collection; the same exploratory tables under a
    definition without ``confirm`` are planned as a pilot, every picked cell."""
    runner = CliRunner()
    definition = yaml.safe_load((REPO / "sweeps/small.yaml").read_text())
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps/confirming.yaml").write_text(yaml.safe_dump(definition))
    del definition["confirm"]
    (tmp_path / "sweeps/pilot.yaml").write_text(yaml.safe_dump(definition))
    for name in ("params.yaml", "dvc.yaml"):
        (tmp_path / name).write_text((REPO / name).read_text())
    table, results, reevaluations = _pilot_frames()
    out = tmp_path / "reports/sweeps"
    for name in ("confirming", "pilot"):
        (out / name).mkdir(parents=True)
        for stem, frame in (("table", table), ("results", results), ("reevaluations", reevaluations)):
            frame.write_parquet(out / name / f"{stem}.parquet")
    result = runner.invoke(app, ["sweep", "plan", "confirming", "--repo", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2 and "collected without confirmation" in result.output
    result = runner.invoke(app, ["sweep", "plan", "pilot", "--repo", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "pilot: sweep pilot has no confirm section" in result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| ") and "% q" in line]
    assert len(rows) == table.filter(pl.col("config_id").is_not_null()).height > 0
    # A sweep with confirm takes its level from its definition.
    refused = runner.invoke(app, ["sweep", "plan", "smoke", "--repo", str(REPO), "--level", "0.1"])
    assert refused.exit_code == 2 and "--level: sweep smoke sets it in its confirm section" in refused.output


def test_confirmation_runs_go_candidate_major_and_reevaluations_seed_major() -> None:
    """A cell is judged once all K runs of its candidate exist, so confirmation finishes one candidate before the
    next; plain re-evaluations interleave the picks seed by seed."""
    from dataclasses import replace

    from mmw.sweep import reevaluation_jobs
    from mmw.sweep.definition import Config, Reevaluation, Sweep

    configs = [Config(config_id=c, grid="g", overrides={"scheme.delta": d}) for c, d in (("a", 1.0), ("b", 2.0))]
    sweep = Sweep(name="t", description="", configs=configs, reevaluate=Reevaluation(k=2, first_seed=1000),
                  confirmation=Confirmation(prompts=30, offset=2, level=0.05, max_tries=2), tuning=2)
    confirming = [j.name for j in reevaluation_jobs(sweep, ["b", "a"])]
    assert confirming == ["reeval-t-b-s1000", "reeval-t-b-s1001", "reeval-t-a-s1000", "reeval-t-a-s1001"]
    plain = [j.name for j in reevaluation_jobs(replace(sweep, confirmation=None), ["b", "a"])]
    assert plain == ["reeval-t-b-s1000", "reeval-t-a-s1000", "reeval-t-b-s1001", "reeval-t-a-s1001"]
