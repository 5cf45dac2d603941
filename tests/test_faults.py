"""Kill and resume (heavy): one seeded SIGKILL inside each stage of a real tiny `dvc repro`, then reruns until it
finishes; the outputs equal an uninterrupted run's byte for byte, and a rerun never redoes a unit the killed run
had finished. The faulty run's repros keep going past a killed stage (`dvc repro --keep-going`): the stages that do
not depend on it run, and may be killed in the same repro, so the run takes one repro per stage depth, not one
per stage.

The kill comes from outside the product code (tests/faultinject/sitecustomize.py wraps ``os.replace`` in the
stage processes, which run as copies of the warm stage server, as in the suite's other runs): a clean run counts
each stage's atomic moves (parts, tables, JSON, judgements), then each stage dies once at a seeded one of them,
just before that file moves into place, leaving its temporary file behind.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pipeline_repo import FAULTINJECT, make_pipeline_repo, run, traced_board, traced_tiny_pipeline

pytestmark = pytest.mark.heavy

SEED = 20261127
#: The parts store of each resumable stage (mmw.io.PartsStore); the rate stages resume from the judgement cache.
PARTS = {"generate_baseline": "data/generations/baseline.parquet.parts",
         "generate_watermarked": "data/generations/watermarked.parquet.parts",
         "perturb": "data/perturbed.parquet.parts"}
RESUMED = re.compile(r"resuming from (\S+): (\d+) rows \((\d+) \w+\) stored")
#: DVC's closing error line after a repro with failed stages, naming them ('a', 'b' and 'c').
FAILED = re.compile(r"failed to reproduce(?: stages:)? (.+)")

def _outs(repo: Path) -> dict[str, Any]:
    """Every stage's outputs as dvc.lock records them (path, md5, size): equal records = equal bytes."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return {stage: entry.get("outs", []) for stage, entry in lock["stages"].items()}

def _timing(repo: Path, stage: str) -> dict[str, Any]:
    return json.loads((repo / "reports/timings" / f"{stage}.json").read_text())

def _inject_faults(repo: Path) -> None:
    """Load tests/faultinject in every Python process of ``repo``'s own venv, through a ``.pth`` file of it. Unlike
    PYTHONPATH (which keeps a stage out of the warm server), this lets the stages run as copies of the server
    (mmw.prefork), as the suite's other runs do: the server loads the hook once and every copy inherits it."""
    site = next((repo / ".venv/lib").glob("python*/site-packages"))
    hook = FAULTINJECT / "sitecustomize.py"
    (site / "_mmw_faultinject.pth").write_text(f"import runpy; runpy.run_path({str(hook)!r})\n")

@pytest.fixture(scope="module")
def killed_and_clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One uninterrupted run (the session's shared traced run, whose stages' moves are counted: its committed copy
    ``pristine``) and one run killed once inside each stage (then rerun until it finishes)."""
    tmp_path = tmp_path_factory.mktemp("faults")
    board = traced_board()
    traced = traced_tiny_pipeline(tmp_path_factory.getbasetemp() / "tiny-pipeline")
    clean = traced.pristine
    assert yaml.safe_load((clean / "params.yaml").read_text()) == board
    moves = {path.stem: int(path.read_text()) for path in traced.counts.glob("*.count")}
    stages = set(yaml.safe_load((clean / "dvc.yaml").read_text())["stages"])
    assert set(moves) == stages and all(n >= 1 for n in moves.values()), moves
    # Never the last move of a stage that has several (its timing record, after every output is in place).
    plan = {stage: random.Random(f"{SEED}-{stage}").randint(1, max(1, n - 1)) for stage, n in sorted(moves.items())}
    (tmp_path / "plan.json").write_text(json.dumps(plan))

    state = tmp_path / "state"
    state.mkdir()
    faulty = make_pipeline_repo(tmp_path / "faulty", board)
    _inject_faults(faulty)
    env = {"MMW_FAULT_PLAN": str(tmp_path / "plan.json"),
           "MMW_FAULT_STATE": str(state), "MMW_JUDGE_CACHE": str(tmp_path / "faulty-judgements")}
    outputs: list[str] = []  # each repro's output, in order
    killed_in: dict[str, int] = {}  # killed stage -> index of the repro that killed it
    for attempt in range(len(plan) + 1):
        done = run(faulty, ".venv/bin/dvc", "repro", "--keep-going", env=env, check=False)
        outputs.append(done.stdout + done.stderr)
        killed = {p.stem for p in state.glob("*.killed")} - set(killed_in)
        if done.returncode == 0:
            assert not killed, (killed, outputs[-1][-3000:])
            break
        failed = FAILED.search(outputs[-1])
        # Failed only by the kills injected in this repro, each stage's once.
        assert failed and set(re.findall(r"'([^']+)'", failed.group(1))) == killed != set(), \
            (killed, outputs[-1][-3000:])
        killed_in.update(dict.fromkeys(killed, attempt))
    else:
        pytest.fail("dvc repro --keep-going still failing after one kill per stage")
    markers = {p.stem: json.loads(p.read_text()) for p in state.glob("*.killed")}
    assert set(markers) == stages, set(stages) - set(markers)
    # Each kill hit a copy of the warm server (the path of the suite's other runs and of MMW_PREFORK=1 sweeps),
    # whose caller then died of the same signal; a plain stage process dies the same way, with less in between.
    assert all(marker["warm_copy"] for marker in markers.values()), markers
    # What every repro after a stage's kill printed. DVC's order among independent stages is not fixed (it may
    # differ between two invocations), so the killed stage's rerun need not come in the very next repro: another
    # stage may be killed first. Resume lines name their parts store, so they are attributed by that name.
    reruns = {stage: "".join(outputs[index + 1:]) for stage, index in killed_in.items()}
    return {"clean": clean, "faulty": faulty, "markers": markers, "reruns": reruns}

def test_a_kill_inside_each_stage_then_rerun_gives_the_clean_runs_outputs(killed_and_clean: dict[str, Any]) -> None:
    clean, faulty, markers = killed_and_clean["clean"], killed_and_clean["faulty"], killed_and_clean["markers"]
    # Byte for byte: every stage output of the resumed run equals the clean run's.
    clean_outs, faulty_outs = _outs(clean), _outs(faulty)
    differing = [stage for stage in clean_outs if clean_outs[stage] != faulty_outs.get(stage)]
    print(f"\nkills injected: {len(markers)}; stages whose outputs differ from the clean run: {len(differing)} "
          f"{differing}")
    assert differing == []
    for name in ("reports/metrics.json", "reports/quality.json", "reports/summary.md"):
        assert (faulty / name).read_bytes() == (clean / name).read_bytes(), name
    left = [p for root in ("data", "reports") for p in (faulty / root).rglob("*")
            if p.name.endswith(".tmp") or p.name.endswith(".parts")]
    assert left == [], left  # no temporary file of a killed writer, no parts store of a finished stage

def test_a_rerun_never_redoes_a_unit_its_killed_attempt_finished(killed_and_clean: dict[str, Any]) -> None:
    clean, faulty, markers = killed_and_clean["clean"], killed_and_clean["faulty"], killed_and_clean["markers"]
    reruns = killed_and_clean["reruns"]
    # A rerun resumed exactly what its killed attempt had stored: no finished unit ran twice.
    for stage, directory in PARTS.items():
        stored = markers[stage]["parts"].get(directory, 0)
        resumed = [m for m in RESUMED.finditer(reruns[stage]) if m.group(1) == directory]
        print(f"{stage}: killed with {stored} units stored, its rerun resumed "
              f"{sum(int(m.group(3)) for m in resumed)}")
        if sum(int(m.group(3)) for m in resumed) != stored:
            lines = [line for line in reruns[stage].replace("\r", "\n").splitlines()
                     if "Running stage" in line or "resuming" in line or "Stage '" in line]
            pytest.fail(f"{stage}: {stored} units stored when killed ({markers[stage]}), resumed {resumed}; "
                        f"the repros after the kill said:\n" + "\n".join(lines))
    for stage in ("rate_baseline", "rate_watermarked"):
        before_kill = markers[stage]["judgements"] - markers[stage]["first_judgements"]
        made, clean_made = _timing(faulty, stage)["judgements_made"], _timing(clean, stage)["judgements_made"]
        print(f"{stage}: {before_kill} judgements stored before the kill; the rerun made {made} of the clean "
              f"run's {clean_made}")
        assert made == clean_made - before_kill
