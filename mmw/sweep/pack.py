"""Packed sweep units: the configurations that share a baseline run in one process, several to a unit.

A sweep unit run by :class:`mmw.sweep.runner.LocalDvcExecutor` is one ``dvc exp run --temp``: every stage is a
process of its own that imports torch and loads the generator, the judge or the scorer again, a fixed cost paid per
configuration (docs/SWEEP.md, "Cost"). :class:`PackedExecutor` implements the same
:class:`~mmw.sweep.runner.Executor` protocol with *packs*: the jobs whose params differ only in ``scheme`` (and the
key) have the same baseline (model, temperature, seed, prompts or shard, judge, attacks), and up to ``pack`` of them
(0: all) run in one process that

1. runs the baseline's stages once, in a scratch workspace under ``.dvc/tmp/sweeps/packs/`` (the stages of
   ``dvc.yaml`` that depend neither on ``scheme`` nor on the key, nor on such a stage's outputs: low-entropy inputs,
   prompts, the baseline's generation and ratings);
2. then, per configuration, in a workspace of its own that holds a copy of those outputs and its params.yaml (the
   board with the job's overrides, as ``dvc exp run -S`` writes it), runs every other stage of ``dvc.yaml`` in
   order (key, generate_watermarked, perturb, detect, rate_watermarked, quality, aggregate) with that
   configuration's key in the process environment (``MMW_KEY``, set only while its stages run; never in argv,
   files or logs);
3. reads the configuration's per-prompt rows, params and metrics from its workspace, exactly as
   :func:`mmw.sweep.units.write_unit` reads them from a DVC experiment, hands them to ``record`` in memory
   (:attr:`~mmw.sweep.runner.Outcome.evidence`; :func:`mmw.sweep.run_units` writes the unit's evidence file at once,
   atomically) and removes the workspace.

The stages are the pipeline's own (``mmw.stages.<module>.run``, called as ``dvc.yaml``'s commands call them), with
the model loaders shared while the executor runs (:func:`mmw.engines.models.shared_loads`): the generator, judge
and scorer load once for all the packs of one call (a round of the race, the configurations of a grid). A unit's
rows are those of its one-configuration DVC experiment, bit for bit (tests/test_pack.py).

A kill loses only the configuration that was running: every finished one already has its evidence file, and a
rerun runs only the jobs without one (:func:`mmw.sweep.runner.run_jobs`); the scratch workspaces of a killed pack
are removed when the next local run starts. One local run works in a repository at a time (the lock of
:func:`mmw.sweep.runner.hold_run_lock`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from mmw.engines.models import compile_workers_up, load_model, shared_loads
from mmw.errors import SpecError
from mmw.io import PROMPTS, read_table, write_table
from mmw.keys import resolve_key
from mmw.params import load_params
from mmw.watermark.scheme import SchemeSpec
from mmw.selection.reading import METRICS_FILE, run_values
from mmw.stages.common import generator_vocab_size
from mmw.sweep.definition import apply_overrides, pack_key
from mmw.sweep.evidence import run_rows
from mmw.sweep.pipeline import PARAMS, run_stage, schedule_ahead, stage_plan
from mmw.sweep.runner import LOG_DIR, Job, Outcome, hold_run_lock
from mmw.sweep.units import TIMED_STAGES, RunEvidence

#: Scratch workspaces of the packs being run (removed when a pack ends, and at the start of the next run).
PACKS_DIR = LOG_DIR / "packs"
#: The per-configuration stage a pack can run for all its configurations at once (:meth:`PackedExecutor.decode`).
DECODED_STAGE = "generate_watermarked"
#: Its output (``mmw.io.GENERATIONS["watermarked"]``; a constant here so the pack's import stays light).
GENERATIONS_OUT = Path("data/generations/watermarked.parquet")


def check_pack(value: Any, setting: str = "pack") -> int:
    """``value`` as a pack size: an integer >= 0 (0: every job that shares a baseline in one unit; 1: one
    configuration a unit, as ``dvc exp run``). SpecError naming ``setting`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(setting, f"{value!r} is not a number of configurations per unit",
                        "an integer >= 1, or 0 (every configuration that shares a baseline in one unit)")
    return value


# ------------------------------------------------------------------------------------------------ the packs


def packs(board: Mapping[str, Any], jobs: Sequence[Job], size: int) -> list[list[Job]]:
    """``jobs`` cut into packs: jobs of one baseline (:func:`pack_key`) together, at most ``size`` a pack (0: no
    limit), in the order of each baseline's first job and, within a pack, the jobs' order."""
    by_key: dict[str, list[Job]] = {}
    for job in jobs:
        by_key.setdefault(pack_key(board, job.overrides), []).append(job)
    out: list[list[Job]] = []
    for group in by_key.values():
        step = size or len(group)
        out += [group[i:i + step] for i in range(0, len(group), step)]
    return out


@contextmanager
def _inside(workspace: Path, env: Mapping[str, str]) -> Iterator[None]:
    """Run the block in ``workspace`` with ``env`` set in the process environment; both restored after."""
    cwd = Path.cwd()
    saved = {k: os.environ.get(k) for k in env}
    os.chdir(workspace)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.chdir(cwd)


def _error(where: str, err: BaseException) -> str:
    """One line: where it failed and the exception's last line (a bad setting as the stage command prints it)."""
    if isinstance(err, SpecError):
        return f"exit 2: {where}: error: {err}"
    last = traceback.format_exception_only(type(err), err)[-1].strip()
    return f"{where}: {last}"[-600:]


def _timed(workspace: Path, stage: str) -> float | None:
    path = workspace / "reports" / "timings" / f"{stage}.json"
    try:
        return float(json.loads(path.read_text())["wall_s"])
    except (OSError, ValueError, KeyError):
        return None


def _copy(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, dest)
    elif source.is_file():
        shutil.copy2(source, dest)


def read_evidence(workspace: Path, timings: Mapping[str, float]) -> Any:
    """A finished configuration's :class:`mmw.sweep.units.RunEvidence` from its workspace: params and metrics as
    :func:`mmw.selection.reading.read_revision` reads them from an experiment commit (flat, no key), the per-prompt
    rows as :func:`mmw.sweep.evidence.prompt_rows` reads them from the DVC cache."""
    params = yaml.safe_load((workspace / PARAMS).read_text())
    metrics = json.loads((workspace / METRICS_FILE).read_text())
    flat, values, attacks = run_values(params, metrics)
    rows = run_rows(lambda path: pl.read_parquet(workspace / path))
    return RunEvidence(flat, values, attacks, rows, {s: t for s, t in timings.items() if s in TIMED_STAGES})


class PackedExecutor:
    """Runs the jobs of ``repo``'s sweep in packs of up to ``pack`` configurations that share a baseline (0: all
    that share one), each pack in this process (see the module docstring). One :class:`Outcome` per job, with
    ``packed`` (pack id, size, index, the shared stages' wall time) and ``evidence``; ``wall_s`` of a job is the
    pack's wall time from the end of the previous job (the first job of a pack carries the baseline's stages and
    the model loads), so a pack's jobs sum to its wall time. ``board``: the params the overrides apply to (default:
    ``repo/params.yaml``)."""

    def __init__(self, repo: Path, pack: int = 0, echo: Callable[[str], None] = print,
                 board: Mapping[str, Any] | None = None, decode_together: bool = True,
                 decode_rows: int | None = None) -> None:
        self.repo = repo.resolve()
        self.pack = check_pack(pack, "--pack")
        self.echo = echo
        self.decode_together = decode_together
        self.decode_rows = decode_rows
        self.board = dict(board) if board is not None else yaml.safe_load((self.repo / PARAMS).read_text())
        self.plan, self.sources = stage_plan(self.repo)

    def run(self, jobs: Sequence[Job], record: Callable[[Outcome], None]) -> None:
        lock = hold_run_lock(self.repo)
        try:
            shutil.rmtree(self.repo / PACKS_DIR, ignore_errors=True)  # a killed pack's workspaces
            groups = packs(self.board, jobs, self.pack)
            with shared_loads():
                for number, group in enumerate(groups, 1):
                    self.echo(f"  pack {number}/{len(groups)}: {len(group)} configuration(s) on one baseline")
                    self.run_pack(group, record)
        finally:
            shutil.rmtree(self.repo / PACKS_DIR, ignore_errors=True)
            os.close(lock)

    def run_pack(self, jobs: Sequence[Job], record: Callable[[Outcome], None]) -> None:
        """One pack: the shared stages once, then each job's stages; ``record`` after each job."""
        pack_id = hashlib.sha256("\x00".join(j.name for j in jobs).encode()).hexdigest()[:12]
        root = self.repo / PACKS_DIR / pack_id
        shutil.rmtree(root, ignore_errors=True)
        started = mark = time.perf_counter()
        shared_dir = root / "shared"
        shared_error, shared_timings = None, {}
        try:
            self._prepare(shared_dir, apply_overrides(self.board, jobs[0].overrides))
            with _inside(shared_dir, {}):
                schedule_ahead([s for s in self.plan if s.shared])  # the judge, built while the baseline decodes
                for stage in (s for s in self.plan if s.shared):
                    try:
                        run_stage(stage)
                    except Exception as err:  # noqa: BLE001 - a stage's failure fails the pack's jobs, not the run
                        shared_error = _error(stage.name, err)
                        break
                    shared_timings[stage.name] = _timed(shared_dir, stage.name)
            shared_s = round(time.perf_counter() - started, 1)
            shared_names = [s.name for s in self.plan if s.shared]
            decoded: dict[int, Path] = {}
            decode_s = 0.0
            if shared_error is None and self.decode_together and len(jobs) > 1:
                t0 = time.perf_counter()
                try:
                    decoded = self.decode(jobs, root, shared_dir)
                except Exception as err:  # noqa: BLE001 - each job then runs its own generation stage
                    self.echo(f"    the pack's one decode failed ({_error('decode', err)}); each configuration "
                              "generates on its own")
                    decoded = {}
                decode_s = round(time.perf_counter() - t0, 1)
            for index, job in enumerate(jobs):
                info = {"pack": pack_id, "size": len(jobs), "index": index, "shared_s": shared_s,
                        "shared_stages": shared_names, "decoded_together": len(decoded), "decode_s": decode_s}
                if shared_error is not None:
                    outcome = self._outcome(job, "failed", shared_error, 0.0, [], [], info)
                else:
                    outcome = self._run_job(job, root, shared_dir, index == 0, shared_timings, info, mark,
                                            decoded.get(index))
                mark = time.perf_counter()
                record(outcome)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def decode(self, jobs: Sequence[Job], root: Path, shared_dir: Path) -> dict[int, Path]:
        """The watermarked generations of the pack's jobs in one decode (:mod:`mmw.sweep.decode`), read
        from the shared workspace's prompts: ``{job index: its generations table}``, written under ``root``.

        A job whose params or key do not validate, and every job when the generator's engine is not transformers
        (vLLM batches requests itself), is left out: its own stage runs and fails or runs as it would alone. A
        decode holds at most ``decode_rows`` rows (default ``model.batch_size``: the memory of one configuration's
        own generation); when a configuration's batch already fills it, nothing is decoded here."""
        from mmw.watermark.build import build_processor  # imports torch and transformers
        from mmw.sweep.decode import generate_together  # imports torch and transformers
        ready: list[tuple[int, Any, int]] = []
        for index, job in enumerate(jobs):
            path = root / f"decode-{index}.yaml"
            path.write_text(yaml.safe_dump(dict(apply_overrides(self.board, job.overrides)), sort_keys=False))
            try:
                params = load_params(path, ("seed", "model", "scheme", "key", "engine"), models={"scheme": SchemeSpec})
                key = resolve_key(params.key, {**os.environ, **job.env})
            except SpecError:
                continue
            finally:
                path.unlink()
            if params.model.engine == "transformers":
                ready.append((index, params, key))
        if len(ready) < 2:
            return {}
        model_params, seed, settings = ready[0][1].model, ready[0][1].seed, ready[0][1].engine
        prompts = read_table(shared_dir / PROMPTS)
        decode_rows = self.decode_rows or model_params.batch_size
        if decode_rows // max(min(prompts.height, model_params.batch_size), 1) < 2:
            return {}  # a batch already fills a decode: each configuration's own (resumable) stage does the same
        with compile_workers_up(model_params.device, enabled=settings.compiles_generation):
            tokenizer, model = load_model(model_params.name, model_params.device, model_params.dtype)
        vocab_size = generator_vocab_size(tokenizer, model)

        def factory(spec: SchemeSpec, key: int):
            return lambda row_seeds: build_processor(spec, key, vocab_size, row_seeds, model_params.temperature,
                                                     compiled=None if settings.compile_step else False,
                                                     compile_mode=settings.compile_mode)

        self.echo(f"    one decode for {len(ready)} configurations ({prompts.height} prompts each)")
        tables = generate_together(model, tokenizer, prompts["chat"].to_list(),
                                   [factory(params.scheme, key) for _, params, key in ready],
                                   model_params.max_new_tokens, model_params.batch_size,
                                   decode_rows, prompt_ids=prompts["prompt_id"].to_list(), seed=seed,
                                   settings=settings)
        out: dict[int, Path] = {}
        for (index, _, _), table in zip(ready, tables, strict=True):
            out[index] = root / f"decode-{index}.parquet"
            write_table(prompts.select("prompt_id", "task", "prompt").join(
                table, on="prompt_id", how="left", maintain_order="left"), out[index])
        return out

    def _prepare(self, workspace: Path, params: Mapping[str, Any]) -> None:
        """A workspace: its params.yaml and links to the source data the stages read."""
        workspace.mkdir(parents=True)
        (workspace / PARAMS).write_text(yaml.safe_dump(dict(params), sort_keys=False))
        for source in self.sources:
            link = workspace / source
            link.parent.mkdir(parents=True, exist_ok=True)
            if (self.repo / source).exists():
                link.symlink_to(self.repo / source)

    def _run_job(self, job: Job, root: Path, shared_dir: Path, first: bool, shared_timings: Mapping[str, Any],
                 info: dict[str, Any], mark: float, decoded: Path | None = None) -> Outcome:
        workspace = root / f"unit-{info['index']}"
        self._prepare(workspace, apply_overrides(self.board, job.overrides))
        for stage in (s for s in self.plan if s.shared):
            for out in stage.outs:
                _copy(shared_dir / out, workspace / out)
        ran = [s.name for s in self.plan if s.shared] if first else []
        restored = [] if first else [s.name for s in self.plan if s.shared]
        timings = {k: v for k, v in shared_timings.items() if v is not None} if first else {}
        if decoded is not None:  # its generations came from the pack's one decode: the stage is done
            _copy(decoded, workspace / GENERATIONS_OUT)
            ran.append(DECODED_STAGE)
            timings[DECODED_STAGE] = round(info["decode_s"] / max(info["decoded_together"], 1), 3)
        try:
            with _inside(workspace, job.env):
                for stage in (s for s in self.plan if not s.shared and not (decoded is not None
                                                                            and s.name == DECODED_STAGE)):
                    try:
                        run_stage(stage)
                    except Exception as err:  # noqa: BLE001 - recorded as this job's failure
                        return self._outcome(job, "failed", _error(stage.name, err), time.perf_counter() - mark, ran,
                                             restored, info)
                    ran.append(stage.name)
                    wall = _timed(workspace, stage.name)
                    if wall is not None:
                        timings[stage.name] = wall
            try:
                evidence = read_evidence(workspace, timings)
            except Exception as err:  # noqa: BLE001 - a stage left no readable table: this job failed
                return self._outcome(job, "failed", _error("reading its tables", err), time.perf_counter() - mark,
                                     ran, restored, info)
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
        return self._outcome(job, "done", None, time.perf_counter() - mark, ran, restored, info, evidence)

    @staticmethod
    def _outcome(job: Job, status: str, error: str | None, wall: float, ran: list[str], restored: list[str],
                 info: dict[str, Any], evidence: Any = None) -> Outcome:
        return Outcome(name=job.name, config_id=job.config_id, status=status, error=error, wall_s=round(wall, 1),
                       finished=datetime.now(UTC).isoformat(timespec="seconds"), ran=list(ran),
                       restored=list(restored), packed=info, evidence=evidence)
