"""Parameter selection (the paper's aggregate metric) over DVC experiments: mmw.selection and `mmw select`.

Fast tests check the selection rule on random tables against an independent re-statement of the paper's rule
(relative quality >= 1 - loss, R >= target, optional FPR bound, finite size; smallest size wins). Heavy tests run
real DVC: a tiny stand-in stage (failed and undetected experiments, the key in params.yaml); `mmw select` on the
real pipeline runs in tests/test_dvc.py, on the experiments that file makes anyway.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml
from _t2_selection_rule import is_feasible as _feasible
from pipeline_repo import BIN, run

from mmw.errors import SpecError
from mmw.reporting.selection import selection_markdown
from mmw.selection import (
    Constraints,
    Experiments,
    cell_picks,
    fresh_seed,
    is_reevaluation,
    median_mad,
    read_experiments,
    rerun_command,
    select,
    single_group,
    with_group,
)

SIZE, QUALITY, RESISTANCE, FPR_HIGH = "all.size", "all.relative_quality", "all.tamper_resistance", "all.fpr_ci_high"


# ------------------------------------------------------------------------------------------ independent rule


def _random_table(rng: np.random.Generator, n: int) -> pl.DataFrame:
    """``n`` settings with plausible metrics: some undetected (inf size), some without metrics (null)."""
    size = rng.choice([16.0, 24.0, 33.5, 48.0, 64.0, 100.0, math.inf], size=n)
    quality = np.round(rng.uniform(0.9, 1.03, size=n), 3)
    resistance = np.round(rng.uniform(0.0, 0.6, size=n), 3)
    fpr_high = np.round(rng.uniform(0.0, 0.3, size=n), 3)
    missing = rng.random(size=(n, 4)) < 0.1
    columns = {}
    for j, (name, values) in enumerate([(SIZE, size), (QUALITY, quality), (RESISTANCE, resistance),
                                        (FPR_HIGH, fpr_high)]):
        columns[name] = [None if missing[i, j] else float(v) for i, v in enumerate(values)]
    return pl.DataFrame({"name": [f"exp-{i}" for i in range(n)], "rev": [f"{i:040x}" for i in range(n)],
                         "kind": ["experiment"] * n,
                         "error": [None if s is not None else "no reports/metrics.json" for s in columns[SIZE]],
                         **columns}, schema_overrides={c: pl.Float64 for c in columns})


def _random_constraints(rng: np.random.Generator) -> Constraints:
    return Constraints(max_quality_loss=float(rng.choice([0.0, 0.01, 0.05, 0.1])),
                       min_tamper_resistance=float(rng.choice([0.0, 0.1, 0.2, 0.4])),
                       max_fpr=None if rng.random() < 0.5 else float(rng.choice([0.05, 0.1, 0.2])))


# ------------------------------------------------------------------------------------------ fast: the rule


@pytest.mark.parametrize("seed", range(40))
def test_pick_is_feasible_and_smallest_among_the_feasible(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = _random_table(rng, int(rng.integers(1, 25)))
    c = _random_constraints(rng)
    selection = select(table, c)

    expected = {r["name"] for r in table.iter_rows(named=True)
                if _feasible(r, c.max_quality_loss, c.min_tamper_resistance, c.max_fpr)}
    assert set(selection.feasible["name"]) == expected
    assert selection.table.height == table.height
    assert set(selection.table["name"]) == set(table["name"])
    for row in selection.table.iter_rows(named=True):
        assert row["feasible"] == (row["name"] in expected)
        assert (row["reason"] is None) == row["feasible"], "an infeasible row must say why (and only then)"
    if not expected:
        assert selection.pick is None
        return
    pick = selection.pick
    assert pick is not None
    assert _feasible(pick, c.max_quality_loss, c.min_tamper_resistance, c.max_fpr)
    assert pick[SIZE] == min(r[SIZE] for r in table.iter_rows(named=True) if r["name"] in expected)
    assert selection.feasible[SIZE].is_sorted()


@pytest.mark.parametrize("seed", range(20))
def test_tightening_a_constraint_never_shrinks_the_picked_size(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    table = _random_table(rng, 20)
    loose = Constraints(max_quality_loss=0.1, min_tamper_resistance=0.0, max_fpr=None)
    tighter = [Constraints(0.01, 0.0, None), Constraints(0.1, 0.3, None), Constraints(0.1, 0.0, 0.1),
               Constraints(0.0, 0.5, 0.05)]
    base = select(table, loose)
    for c in tighter:
        tight = select(table, c)
        assert set(tight.feasible["name"]) <= set(base.feasible["name"])
        if tight.pick is not None:
            assert base.pick is not None and tight.pick[SIZE] >= base.pick[SIZE]


def test_an_undetected_watermark_is_never_picked() -> None:
    # The undetected setting is better on every other axis; it must still lose to any detected one.
    table = pl.DataFrame({"name": ["undetected", "detected"], "rev": ["a" * 40, "b" * 40],
                          "kind": ["experiment", "experiment"], SIZE: [math.inf, 500.0],
                          QUALITY: [1.0, 0.995], RESISTANCE: [0.9, 0.25], FPR_HIGH: [0.01, 0.01]})
    selection = select(table, Constraints(0.01, 0.2))
    assert selection.pick is not None and selection.pick["name"] == "detected"
    alone = select(table.filter(pl.col("name") == "undetected"), Constraints(0.01, 0.2))
    assert alone.pick is None
    assert "size" in alone.table["reason"][0]


def test_the_paper_thresholds_are_inclusive_and_each_failure_is_named() -> None:
    c = Constraints(max_quality_loss=0.01, min_tamper_resistance=0.2, max_fpr=0.1)
    rows = [("at-the-limits", 30.0, 0.99, 0.2, 0.1, ""),
            ("low-quality", 20.0, 0.98, 0.5, 0.0, "relative quality"),
            ("tamperable", 20.0, 1.0, 0.19, 0.0, "R "),
            ("false-positives", 20.0, 1.0, 0.5, 0.2, "FPR"),
            ("unrated", 20.0, None, 0.5, 0.0, "relative quality unknown")]
    table = pl.DataFrame([dict(zip(["name", SIZE, QUALITY, RESISTANCE, FPR_HIGH], r[:5], strict=True))
                          | {"rev": r[0], "kind": "experiment"} for r in rows])
    selection = select(table, c)
    assert selection.pick is not None and selection.pick["name"] == "at-the-limits"
    reasons = dict(zip(selection.table["name"], selection.table["reason"], strict=True))
    for name, *_, failure in rows[1:]:
        assert failure in reasons[name], (name, reasons[name])


def test_equal_sizes_prefer_the_better_quality() -> None:
    table = pl.DataFrame({"name": ["worse", "better"], "rev": ["a", "b"], "kind": ["experiment"] * 2,
                          SIZE: [40.0, 40.0], QUALITY: [0.995, 1.0], RESISTANCE: [0.3, 0.3], FPR_HIGH: [0.1, 0.1]})
    assert select(table, Constraints(0.01, 0.2)).pick["name"] == "better"


@pytest.mark.parametrize(("field", "value", "option"), [
    ("max_quality_loss", -0.01, "--max-quality-loss"), ("max_quality_loss", 1.0, "--max-quality-loss"),
    ("max_quality_loss", float("nan"), "--max-quality-loss"),
    ("min_tamper_resistance", -0.1, "--min-tamper-resistance"),
    ("min_tamper_resistance", 1.5, "--min-tamper-resistance"),
    ("max_fpr", -0.5, "--max-fpr"), ("max_fpr", 1.01, "--max-fpr"),
])
def test_bad_constraints_name_the_option_and_the_allowed_range(field: str, value: float, option: str) -> None:
    with pytest.raises(SpecError) as raised:
        Constraints(**{field: value})
    assert raised.value.key == option
    assert str(raised.value).startswith(option) and "allowed:" in str(raised.value)


def test_empty_table_is_a_clear_error() -> None:
    empty = pl.DataFrame(schema={"name": pl.String, "rev": pl.String, "kind": pl.String, SIZE: pl.Float64,
                                 QUALITY: pl.Float64, RESISTANCE: pl.Float64, FPR_HIGH: pl.Float64})
    with pytest.raises(SpecError, match="experiments"):
        select(empty, Constraints())


# ------------------------------------------------------------------------------------------ fast: comparability


def _pool(n: int, **columns: list[Any]) -> pl.DataFrame:
    base = {"name": [f"exp-{i}" for i in range(n)], "rev": [f"{i:040x}" for i in range(n)], "kind": ["experiment"] * n,
            "seed": [0] * n, "model.name": ["m"] * n, "model.max_new_tokens": [200] * n, "model.temperature": [0.7] * n,
            "scheme.sampler": ["distribution_shift"] * n, "scheme.alpha": [0.02] * n,
            "attacks.specs": ["[{name: swap, p: 0.1}]"] * n, "rate.judge": ["j"] * n,
            SIZE: [float(10 + i) for i in range(n)], QUALITY: [1.0] * n, RESISTANCE: [0.5] * n, FPR_HIGH: [0.0] * n}
    base.update(columns)
    return pl.DataFrame(base)


@pytest.mark.parametrize(("param", "other"), [("scheme.alpha", 0.2), ("seed", 1), ("model.max_new_tokens", 50),
                                              ("attacks.specs", "[{name: lowercase}]"), ("rate.judge", "k"),
                                              ("model.name", "n")])
def test_incomparable_experiments_are_refused_naming_the_param(param: str, other: Any) -> None:
    """A run with a looser alpha, fewer attacks, another seed, model, budget or judge must not compete: the
    pool is refused with the differing param named, and each group can be selected on its own."""
    table = _pool(4)
    table = table.with_columns(pl.when(pl.col("name") == "exp-3").then(pl.lit(other)).otherwise(pl.col(param))
                               .alias(param))
    grouped = with_group(table)
    with pytest.raises(SpecError) as caught:
        single_group(grouped)
    assert param in str(caught.value) and "--group" in str(caught.value)
    odd = grouped.filter(pl.col("name") == "exp-3")["group"][0]
    assert single_group(grouped, odd)["name"].to_list() == ["exp-3"]
    assert sorted(single_group(grouped, grouped.filter(pl.col("name") == "exp-0")["group"][0])["name"]) == [
        "exp-0", "exp-1", "exp-2"]
    with pytest.raises(SpecError, match="--group"):
        single_group(grouped, "nope")


@pytest.mark.parametrize(("param", "default", "other"), [("scheme.alpha", 0.02, 0.2),
                                                         ("prompts.pool", "paper", "extended")])
def test_a_null_param_is_its_default(param: str, default: Any, other: Any) -> None:
    """A run that leaves a param unset (or predates it) pools with runs that name its default, not with others."""
    table = _pool(3).with_columns(pl.Series(param, [None, default, other]))
    grouped = with_group(table)
    assert grouped["group"][0] == grouped["group"][1] != grouped["group"][2]
    with pytest.raises(SpecError, match=param.replace(".", "[.]")):
        single_group(grouped)


@pytest.mark.parametrize("seed", range(10))
def test_cell_picks_are_the_smallest_feasible_of_each_temperature_and_family(seed: int) -> None:
    """Restated rule per cell: among the rows of that temperature and sampler, the feasible one of least size;
    none when the cell has no feasible row. Temperatures and families never compete with each other."""
    rng = np.random.default_rng(seed)
    n = 30
    table = _random_table(rng, n).with_columns(
        pl.Series("model.temperature", rng.choice([0.0, 0.7, 1.0], size=n)),
        pl.Series("family", rng.choice(["distribution_shift", "exponential"], size=n)))
    c = _random_constraints(rng)
    picks = cell_picks(table, [c])
    for row in picks.iter_rows(named=True):
        cell = [r for r in table.iter_rows(named=True)
                if r["model.temperature"] == row["model.temperature"] and r["family"] == row["family"]]
        feasible = [r for r in cell if _feasible(r, c.max_quality_loss, c.min_tamper_resistance, c.max_fpr)]
        assert row["n_settings"] == len(cell) and row["n_feasible"] == len(feasible)
        if feasible:
            assert row[f"pick.{SIZE}"] == min(r[SIZE] for r in feasible)
        else:
            assert row.get(f"pick.{SIZE}") is None
    assert picks.height == table.select("model.temperature", "family").unique().height


def test_median_and_mad_of_reevaluations_by_hand() -> None:
    # median of (10, 12, 14, 100, inf) is 14; |x - 14| = (4, 2, 0, 86, inf), whose median is 4.
    assert median_mad([10, 12, 14, 100, None]) == (14.0, 4.0)
    # (20, 22, 23, 26, 30): median 23, deviations (3, 1, 0, 3, 7): MAD 3.
    assert median_mad([30, 20, 26, 22, 23]) == (23.0, 3.0)
    # Most re-runs undetected: the size is infinite and its spread undefined.
    assert median_mad([1.0, None, None]) == (math.inf, None)
    assert median_mad([]) == (None, None)
    assert is_reevaluation("reeval-small-abc-s1000") and not is_reevaluation("small-abc")


# ------------------------------------------------------------------------------------------ fast: re-evaluation


def test_rerun_command_sets_the_pick_params_and_a_new_seed(tmp_path: Path) -> None:
    """Applying the printed overrides with DVC's own `-S` machinery to the workspace params gives the pick's
    params with only the seed changed; the key is never part of the command, even when handed in."""
    from dvc.utils.hydra import apply_overrides

    workspace = {"seed": 3, "model": {"name": "embedded:smollm2-135m", "temperature": 0.7},
                 "scheme": {"sampler": "distribution_shift", "delta": 5.0, "gamma": 0.5, "window": 1,
                            "key_length": None, "score": "sum", "key": "secret-key-never-shown"},
                 "attacks": {"specs": [{"name": "swap", "p": 0.1}, {"name": "lowercase"}]}}
    pick = yaml.safe_load(yaml.safe_dump(workspace))
    pick["seed"] = 0
    pick["scheme"].update(sampler="exponential", delta=None, gamma=None, window=3)
    pick["model"].update(name="some model:with spaces", temperature=1.0)
    pick["attacks"]["specs"][0]["p"] = 0.3
    flat = {rev: _flat(params) for rev, params in (("workspace", workspace), ("p" * 40, pick))}
    table = pl.DataFrame({"name": ["workspace", "pick"], "rev": ["workspace", "p" * 40], "seed": [3, 0]})
    experiments = Experiments(table=table, params=flat)

    seed = fresh_seed(table)
    assert seed not in (0, 3)
    rerun = rerun_command(experiments, "p" * 40, seed)
    assert rerun.exact
    assert "secret-key-never-shown" not in rerun.command and "scheme.key=" not in rerun.command
    args = shlex.split(rerun.command)
    assert args[:3] == ["dvc", "exp", "run"] and args[3::2] == ["-S"] * ((len(args) - 3) // 2)
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(workspace))
    apply_overrides(params_file, args[4::2])
    assert yaml.safe_load(params_file.read_text()) == pick | {"seed": seed}


def test_rerun_command_falls_back_when_the_structure_differs() -> None:
    workspace = {"seed": 0, "attacks.specs.0.name": "swap", "attacks.specs.1.name": "lowercase"}
    pick = {"seed": 0, "attacks.specs.0.name": "swap"}
    rerun = rerun_command(Experiments(table=pl.DataFrame(), params={"workspace": workspace, "r" * 40: pick}),
                          "r" * 40, 1)
    assert not rerun.exact
    assert rerun.fallback == f"git checkout {'r' * 40} -- params.yaml && dvc exp run -S seed=1"


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{prefix}{i}.").items()}
    return {prefix[:-1]: value}


# ------------------------------------------------------------------------------------------ heavy: real DVC

STAND_IN_STAGE = '''\
"""A stand-in for the pipeline: metrics that depend on scheme.delta, written with mmw's own JSON writer."""
import sys
import yaml
from mmw.io import write_json

delta = yaml.safe_load(open("params.yaml"))["scheme"]["delta"]
if delta > 50:
    sys.exit("delta too large")
write_json({"all": {"relative_quality": 1 - delta / 100, "size": float("inf") if delta < 2 else 100 / delta,
                    "tamper_resistance": delta / 10, "fpr": 0.0, "fpr_ci_high": 0.5}, "judge": {"mode": "x"}},
           "reports/metrics.json")
'''


@pytest.mark.heavy
def test_experiments_are_read_from_a_real_dvc_repo_without_the_key(tmp_path: Path) -> None:
    key = "stand-in-key-4be1d0"
    repo = tmp_path / "repo"
    repo.mkdir()
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    (repo / "stage.py").write_text(STAND_IN_STAGE)
    (repo / "params.yaml").write_text(yaml.safe_dump(
        {"seed": 0, "model": {"temperature": 0.7}, "scheme": {"delta": 5.0, "gamma": 0.5, "key": key}}))
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"score": {
        "cmd": f"{sys.executable} stage.py", "deps": ["stage.py"], "params": ["scheme.delta"],
        "metrics": [{"reports/metrics.json": {"cache": False}}]}}}))

    nothing = run(repo, str(BIN / "mmw"), "select", check=False)
    assert nothing.returncode == 2 and "experiments" in nothing.stderr, nothing.stderr

    run(repo, "dvc", "repro", "-q")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "baseline")
    run(repo, "dvc", "exp", "run", "-q", "-n", "undetected", "-S", "scheme.delta=1.0")
    run(repo, "dvc", "exp", "run", "-q", "-n", "broken", "-S", "scheme.delta=99", check=False)
    run(repo, "dvc", "exp", "run", "-q", "-n", "strong", "-S", "scheme.delta=4")

    experiments = read_experiments(repo)
    table = experiments.table
    rows = {r["name"]: r for r in table.iter_rows(named=True)}
    assert {"workspace", "undetected", "strong"} <= set(rows)
    assert "scheme.key" not in table.columns
    assert key not in json.dumps(table.to_dicts(), default=str) + json.dumps(experiments.params)
    assert rows["undetected"][SIZE] == math.inf and rows["undetected"]["scheme.delta"] == 1.0
    assert rows["strong"][SIZE] == pytest.approx(25.0) and rows["strong"]["status"] == "done"
    assert rows["workspace"]["kind"] == "workspace"
    assert sum(r["kind"] == "baseline" for r in rows.values()) == 1
    if "broken" in rows:  # DVC keeps a failed workspace run only when it got as far as a commit
        assert rows["broken"][SIZE] is None and rows["broken"]["error"]

    selection = select(table, Constraints(max_quality_loss=0.05, min_tamper_resistance=0.2))
    # delta=5 (size 20, quality 0.95) is feasible; delta=4 (size 25, quality 0.96) too; delta=1 is undetected.
    assert selection.pick is not None and selection.pick[SIZE] == pytest.approx(20.0)
    markdown = selection_markdown(selection, rerun_command(experiments, selection.pick["rev"], fresh_seed(table)))
    assert key not in markdown and "size inf" in markdown

    # A re-evaluation run (reeval- name) never competes, however small its size: delta=10 would be the pick.
    run(repo, "dvc", "exp", "run", "-q", "-n", "reeval-strong-s7", "-S", "scheme.delta=10", "-S", "seed=7")
    loose = ["--max-quality-loss", "0.5", "--min-tamper-resistance", "0"]
    picked = run(repo, str(BIN / "mmw"), "select", *loose)
    assert "reeval-strong-s7" not in (repo / "reports/selection.md").read_text()
    # Pooled, it would win with size 100 / 10 = 10; the pick is the baseline commit's delta=5: size 100 / 5 = 20.
    assert "size 20 tokens" in picked.stdout and "reeval" not in picked.stdout.split("re-evaluate")[0], picked.stdout
    # A run with another seed is not comparable: refused, naming the param; --group selects within one group.
    run(repo, "dvc", "exp", "run", "-q", "-n", "other-seed", "-S", "seed=3", "-S", "scheme.delta=9")
    refused = run(repo, str(BIN / "mmw"), "select", *loose, check=False)
    assert refused.returncode == 2 and "seed" in refused.stderr and "--group" in refused.stderr, refused.stderr
    group = refused.stderr.split("--group ")[-1].split()[0].strip(";|")
    chosen = run(repo, str(BIN / "mmw"), "select", *loose, "--group", group, check=False)
    assert chosen.returncode in (0, 1), chosen.stderr
