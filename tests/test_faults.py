"""Kill and resume (heavy): one seeded SIGKILL inside each stage of a real tiny `dvc repro`, then reruns until it
finishes; the outputs equal an uninterrupted run's byte for byte, and a rerun never redoes a unit the killed run
had finished.

The kill comes from outside the product code (tests/faultinject/sitecustomize.py wraps ``os.replace`` in the
stage processes): a clean run counts each stage's atomic moves (parts, tables, JSON, judgements), then each stage
dies once at a seeded one of them, just before that file moves into place, leaving its temporary file behind.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pipeline_repo import make_pipeline_repo, run, tiny_board

pytestmark = pytest.mark.heavy

FAULTINJECT = Path(__file__).resolve().parent / "faultinject"
SEED = 20261127
#: The parts store of each resumable stage (mmw.io.PartsStore); the rate stages resume from the judgement cache.
PARTS = {"generate_baseline": "data/generations/baseline.parquet.parts",
         "generate_watermarked": "data/generations/watermarked.parquet.parts",
         "perturb": "data/perturbed.parquet.parts"}
RESUMED = re.compile(r"resuming from (\S+): (\d+) rows \((\d+) \w+\) stored")


def _board() -> dict[str, Any]:
    board = tiny_board()
    board["model"]["batch_size"] = 1  # one generation batch per prompt: kills land between stored batches
    return board


def _outs(repo: Path) -> dict[str, Any]:
    """Every stage's outputs as dvc.lock records them (path, md5, size): equal records = equal bytes."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return {stage: entry.get("outs", []) for stage, entry in lock["stages"].items()}


def _timing(repo: Path, stage: str) -> dict[str, Any]:
    return json.loads((repo / "reports/timings" / f"{stage}.json").read_text())


@pytest.fixture(scope="module")
def killed_and_clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One uninterrupted run and one run killed once inside each stage (then rerun until it finishes)."""
    tmp_path = tmp_path_factory.mktemp("faults")
    board = _board()
    counts = tmp_path / "counts"
    counts.mkdir()
    clean = make_pipeline_repo(tmp_path / "clean", board)
    run(clean, ".venv/bin/dvc", "repro", env={"PYTHONPATH": str(FAULTINJECT), "MMW_FAULT_COUNT": str(counts),
                                               "MMW_JUDGE_CACHE": str(tmp_path / "clean-judgements")})
    moves = {path.stem: int(path.read_text()) for path in counts.glob("*.count")}
    stages = set(yaml.safe_load((clean / "dvc.yaml").read_text())["stages"])
    assert set(moves) == stages and all(n >= 1 for n in moves.values()), moves
    # Never the last move of a stage that has several (its timing record, after every output is in place).
    plan = {stage: random.Random(f"{SEED}-{stage}").randint(1, max(1, n - 1)) for stage, n in sorted(moves.items())}
    (tmp_path / "plan.json").write_text(json.dumps(plan))

    state = tmp_path / "state"
    state.mkdir()
    faulty = make_pipeline_repo(tmp_path / "faulty", board)
    env = {"PYTHONPATH": str(FAULTINJECT), "MMW_FAULT_PLAN": str(tmp_path / "plan.json"),
           "MMW_FAULT_STATE": str(state), "MMW_JUDGE_CACHE": str(tmp_path / "faulty-judgements")}
    reruns: dict[str, str] = {}  # killed stage -> output of the repro that resumed it
    killed_last: str | None = None
    for _attempt in range(len(plan) + 1):
        done = run(faulty, ".venv/bin/dvc", "repro", env=env, check=False)
        output = done.stdout + done.stderr
        if killed_last is not None:
            reruns[killed_last] = output
        killed = {p.stem for p in state.glob("*.killed")} - set(reruns) - {killed_last}
        if done.returncode == 0:
            assert not killed, (killed, output[-3000:])
            break
        assert len(killed) == 1, (killed, output[-3000:])  # failed only by the one injected kill
        killed_last = killed.pop()
    else:
        pytest.fail("dvc repro still failing after one kill per stage")
    markers = {p.stem: json.loads(p.read_text()) for p in state.glob("*.killed")}
    assert set(markers) == stages, set(stages) - set(markers)
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



@pytest.mark.xfail(strict=True, reason="open defect: the rerun of a killed generate_baseline recomputes the batch "
                                       "its killed attempt had stored (same bytes, work done twice)")
def test_a_rerun_never_redoes_a_unit_its_killed_attempt_finished(killed_and_clean: dict[str, Any]) -> None:
    clean, faulty, markers = killed_and_clean["clean"], killed_and_clean["faulty"], killed_and_clean["markers"]
    reruns = killed_and_clean["reruns"]
    # A rerun resumed exactly what its killed attempt had stored: no finished unit ran twice.
    for stage, directory in PARTS.items():
        stored = markers[stage]["parts"].get(directory, 0)
        resumed = [m for m in RESUMED.finditer(reruns[stage]) if m.group(1) == directory]
        assert sum(int(m.group(3)) for m in resumed) == stored, (stage, stored, resumed)
    for stage in ("rate_baseline", "rate_watermarked"):
        before_kill = markers[stage]["judgements"] - markers[stage]["first_judgements"]
        assert _timing(faulty, stage)["judgements_made"] == _timing(clean, stage)["judgements_made"] - before_kill
