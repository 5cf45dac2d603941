"""Sweeps: the paper's design space as data (``sweeps/<name>.yaml``), run as DVC experiments, collected into
tables that live in git. See docs/SWEEP.md.

* :mod:`~mmw.sweep.definition` — load, expand and validate a definition into configs (stable ``config_id``);
* :mod:`~mmw.sweep.runner` — jobs, the pluggable executor (local ``dvc exp run --temp``), the run log,
  progress and ETA;
* :mod:`~mmw.sweep.pack` — packed units: the configurations of one baseline in one process (``pack``);
* :mod:`~mmw.sweep.units` — one committed evidence file per finished unit (``reports/sweeps/<name>/runs/``): what
  resuming and collecting read, on this machine or another one;
* :mod:`~mmw.sweep.collect` — the results / attacks / paper tables under ``reports/sweeps/<name>/``;
* :mod:`~mmw.sweep.confirm`, :mod:`~mmw.sweep.cells`, :mod:`~mmw.sweep.evidence` — picks confirmed on held-out
  prompts (one-sided bounds, fallbacks, statuses) from the runs' per-prompt rows;
* :mod:`~mmw.sweep.plan` — prompts and time needed to resolve the unresolved cells;
* :mod:`~mmw.sweep.schedule`, :mod:`~mmw.sweep.cost`, :mod:`~mmw.sweep.race_bounds`, :mod:`~mmw.sweep.race`,
  :mod:`~mmw.sweep.adaptive` — the racing sweep: its settings, its cost model, its bounds, the race, and the race
  on DVC (units, round log, resume);
* :mod:`~mmw.sweep.cli` — ``mmw sweep run|collect|export|plan``.

``run_sweep`` is what ``mmw sweep run NAME`` does: run the configs that are not done (neither an evidence file nor
an experiment ref: failed and missing ones) — all of them on the tuning prompts, or, for a definition with an
``adaptive`` section, as a race (:mod:`mmw.sweep.adaptive`: rounds of prompt shards, survivors only) — writing
each finished unit's evidence file as it lands, then pick per
temperature x family x constraint among the finished ones and re-evaluate each pick with the definition's K seeds,
each run under a fresh key that only its environment holds (``MMW_KEY``).
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path

import yaml

from mmw.errors import SpecError
from mmw.sweep.collect import picked_config_ids
from mmw.sweep.definition import Sweep, expand
from mmw.sweep.adaptive import DvcUnitRunner, run_adaptive
from mmw.sweep.cells import pending_config_ids
from mmw.sweep.collect import confirmed_tables
from mmw.sweep.pack import PackedExecutor
from mmw.sweep.runner import Executor, Job, LocalDvcExecutor, Progress, head_commit
from mmw.selection import Constraints
from mmw.sweep.units import (
    experiment_name,
    export,
    load_units,
    read_runs,
    reevaluation_name,
    reevaluation_overrides,
    rounds_paths,
    run_units,
)


def load_sweep(repo: Path, name: str, validate: bool = True) -> Sweep:
    """Expand ``repo/sweeps/<name>.yaml`` against ``repo/params.yaml`` (SpecError naming the bad entry)."""
    params = repo / "params.yaml"
    if not params.is_file():
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "params.yaml"], cwd=repo,
                                 capture_output=True).returncode == 0
        if tracked:  # DVC writes a run's -S overrides into params.yaml and stashes them: a kill there can drop it
            raise SpecError("sweep", f"params.yaml is committed in {repo} but missing from the workspace (a killed "
                                     "`dvc exp run` can leave it so)", "restore it: git checkout -- params.yaml")
        raise SpecError("sweep", f"no params.yaml in {repo}", "run in the repository root or pass --repo")
    return expand(name, yaml.safe_load(params.read_text()), repo / "sweeps", validate=validate)


def pool_jobs(sweep: Sweep) -> list[Job]:
    """One job per config, interleaved over the cells of the paper's table (temperature x sampler): the first
    value of every cell, then the second, ...; within a round, temperature by temperature in the definition's
    order (one baseline at a time). A sweep cut short thus still covers whole rows of the table."""
    temperatures = list(dict.fromkeys(c.overrides.get("model.temperature") for c in sweep.configs))
    rank: dict[tuple[object, object], int] = {}
    ordered = []
    for index, config in enumerate(sweep.configs):
        temperature = config.overrides.get("model.temperature")
        cell = (temperature, config.overrides.get("scheme.sampler"))
        rank[cell] = rank.get(cell, -1) + 1
        ordered.append(((rank[cell], temperatures.index(temperature), index), config))
    return [Job(name=experiment_name(sweep.name, c.config_id), config_id=c.config_id, overrides=c.overrides)
            for _, c in sorted(ordered, key=lambda item: item[0])]


def reevaluation_jobs(sweep: Sweep, config_ids: list[str]) -> list[Job]:
    """K runs per picked config: its overrides with each re-evaluation seed, a fresh key in the environment.

    Re-evaluations (no ``confirm``) run seed-major (every pick's first seed, then every pick's second, ...): a
    cut-short run leaves every pick with about the same number of runs, each of which the table already uses.
    Confirmation runs go candidate-major (all K runs of the first candidate, then the next's): a cell is judged only
    once all K of its runs have finished, so a sweep cut short (hours, resumed across machines) leaves whole cells
    judged rather than every cell K - 1 runs short. The total is the same either way: each seed's baseline is made
    once and shared through DVC's run-cache."""
    overrides = {c.config_id: c.overrides for c in sweep.configs}
    seeds = sweep.reevaluate.seeds
    pairs = [(cid, seed) for cid in config_ids for seed in seeds] if sweep.confirmation is not None \
        else [(cid, seed) for seed in seeds for cid in config_ids]
    return [Job(name=reevaluation_name(sweep.name, cid, seed), config_id=cid,
                overrides=reevaluation_overrides(sweep, overrides[cid], seed), env={"MMW_KEY": secrets.token_hex(16)})
            for cid, seed in pairs]


def confirmation_rounds(repo: Path, sweep: Sweep, executor: Executor, echo: Callable[[str], None]
                        ) -> Progress | None:
    """Confirm the picks on the held-out prompts: each round runs the K confirmation runs of every cell's
    pending candidate (its pick first, then a fallback where the pick was not confirmed), at most
    ``confirmation.max_tries`` rounds. Finished runs are never repeated (a rerun resumes)."""
    confirmation = sweep.confirmation
    assert confirmation is not None
    progress = None
    for number in range(1, confirmation.max_tries + 1):
        table, _, randomness = confirmed_tables(repo, read_runs(repo, sweep, echo), sweep)
        pending = list(dict.fromkeys(pending_config_ids(table) + pending_config_ids(randomness)))
        if not pending:
            break
        echo(f"[{sweep.name}] confirmation round {number}: {len(pending)} candidate(s), {sweep.reevaluate.k} "
             f"runs each on prompts [{confirmation.offset}, {confirmation.offset + confirmation.prompts}) per task")
        progress = run_units(repo, sweep, f"{sweep.name}: confirmation {number}", reevaluation_jobs(sweep, pending),
                         executor, echo)
    return progress


def extension_rounds(repo: Path, sweep: Sweep, executor: Executor, echo: Callable[[str], None]) -> Progress | None:
    """The later confirmation rounds of ``confirm.extend``, in order: each runs, for every cell it declares that
    the rounds before left unresolved, its candidate's K runs on the round's prompts (cells in the declared
    order, all K runs of one candidate before the next: a round cut short leaves whole cells judged; cells of one
    temperature share each seed's baseline). Finished runs are never repeated (a rerun resumes)."""
    from mmw.sweep.cells import extension_candidates
    from mmw.sweep.collect import judged_tables
    from mmw.sweep.units import extension_runs

    confirmation = sweep.confirmation
    assert confirmation is not None
    progress = None
    planned = {(c.config_id, seed): overrides for c, seed, overrides in extension_runs(sweep)}
    for extension in confirmation.extend:
        table, _, _ = judged_tables(repo, read_runs(repo, sweep, echo), sweep)
        pairs: dict[tuple[str, int], None] = {}
        for row, entry in extension_candidates(table, extension):
            pairs.update({(row["config_id"], seed): None for seed in extension.seeds(entry.k)})
        if not pairs:
            continue
        echo(f"[{sweep.name}] {extension.name}: {len({c for c, _ in pairs})} candidate(s), "
             f"{len(pairs)} runs on fresh prompts from {extension.offset} per task, level {extension.level:g}")
        jobs = [Job(name=reevaluation_name(sweep.name, cid, seed), config_id=cid, overrides=planned[(cid, seed)],
                    env={"MMW_KEY": secrets.token_hex(16)}) for cid, seed in pairs]
        progress = run_units(repo, sweep, f"{sweep.name}: {extension.name}", jobs, executor, echo)
    return progress


def race_groups(sweep: Sweep) -> dict[str, list[str]]:
    """The race's groups: ``"T=<temperature> <family>"`` -> config ids, in definition order (one group answers
    the cells of one temperature x family)."""
    groups: dict[str, list[str]] = {}
    for config in sweep.configs:
        label = f"T={config.overrides.get('model.temperature'):g} {config.overrides.get('scheme.sampler')}"
        groups.setdefault(label, []).append(config.config_id)
    return groups


def run_race(repo: Path, sweep: Sweep, executor: Executor, echo: Callable[[str], None]) -> Progress:
    """The tuning runs of an ``adaptive`` definition: the race (:func:`mmw.sweep.adaptive.run_adaptive`) over
    :func:`race_groups`, its units through :func:`run_units` (evidence written as each lands), the round log
    written to both :func:`rounds_paths`, ranked by the anytime size where every config of a group has a sum score
    (the size the confirmed table ranks by), else the valid size. Returns the summed progress of its rounds."""
    assert sweep.confirmation is not None and sweep.schedule is not None
    groups = race_groups(sweep)
    scores = {c.config_id: c.overrides.get("scheme.score") for c in sweep.configs}
    columns = {label: "size_anytime" if all(scores[c] == "sum" for c in ids) else "size_valid"
               for label, ids in groups.items()}
    runner = DvcUnitRunner(repo, sweep, executor, echo)
    lasting, working = rounds_paths(repo, sweep.name)
    echo(f"[{sweep.name}] race over {len(groups)} group(s) x {len(sweep.confirmation.constraints)} cell(s): "
         f"{sweep.schedule.rounds} rounds, level {sweep.schedule.level:g}")
    run_adaptive(groups, sweep.schedule, runner, lasting, sweep.tasks, None,
                 constraints=[Constraints(loss, r) for loss, r in sweep.confirmation.constraints], size_column=columns,
                 copies=(working,), echo=echo)
    parts = runner.progress
    return Progress(total=sum(p.total for p in parts), done=sum(p.done for p in parts),
                    failed=sum(p.failed for p in parts), queued=sum(p.queued for p in parts),
                    walls=[w for p in parts for w in p.walls])


def local_executor(repo: Path, sweep: Sweep, echo: Callable[[str], None] = print) -> Executor:
    """The executor of a local run: one ``dvc exp run --temp`` per configuration (``pack`` 1), else packs of the
    configurations that share a baseline (:class:`mmw.sweep.pack.PackedExecutor`)."""
    if sweep.pack == 1:
        return LocalDvcExecutor(repo)
    return PackedExecutor(repo, sweep.pack, echo)


def run_sweep(repo: Path, sweep: Sweep, executor: Executor | None = None, configs: bool = True,
              reevaluate: bool = True, echo: Callable[[str], None] = print) -> tuple[Progress | None, Progress | None]:
    """Run ``sweep`` in ``repo``: its configs (``configs``), then (``reevaluate``) the re-evaluations of the picks
    made among the finished configs.

    Returns the progress counts of both phases (None for a phase not run); failures are logged and do not stop
    the sweep.
    """
    head_commit(repo)  # fails early outside a committed repository
    export(repo, sweep, echo)  # experiments finished without their evidence file (older runs, a kill)
    load_units(repo, sweep)  # evidence of another definition, generator or judge: refused before anything runs
    executor = executor or local_executor(repo, sweep, echo)
    if not configs:
        pool = None
    elif sweep.racing:
        pool = run_race(repo, sweep, executor, echo)
    else:
        pool = run_units(repo, sweep, f"{sweep.name}: configs", pool_jobs(sweep), executor, echo)
    if not reevaluate:
        return pool, None
    if sweep.confirmation is not None:
        progress = confirmation_rounds(repo, sweep, executor, echo)
        if sweep.confirmation.extend:
            progress = extension_rounds(repo, sweep, executor, echo) or progress
        return pool, progress
    picked = picked_config_ids(read_runs(repo, sweep, echo).results)
    echo(f"[{sweep.name}] {len(picked)} distinct picks over temperature x family x 4 constraints; "
         f"re-evaluating each with {sweep.reevaluate.k} fresh seeds and keys")
    rerun = run_units(repo, sweep, f"{sweep.name}: re-evaluations", reevaluation_jobs(sweep, picked), executor, echo)
    return pool, rerun
