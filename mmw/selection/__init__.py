"""The paper's parameter selection over DVC experiments: which watermark, with which parameters, to deploy.

Paper, "Aggregate metric": among the evaluated settings keep those whose quality loss is at most a target and
whose tamper resistance reaches a target, pick the one with the smallest watermark size — per temperature and
scheme family — then re-evaluate each pick with fresh seeds and keys (median and MAD of the re-runs).

Kept apart:

* :mod:`~mmw.selection.reading` — experiments through ``dvc.api`` (``exp_show``, ``params_show``,
  ``metrics_show``) into one typed table, the key dropped on reading;
* :mod:`~mmw.selection.grouping` — which rows are comparable (same model, token budget, prompts, seed,
  attacks, alpha, judge, detector); mixed tables are refused or split;
* :mod:`~mmw.selection.selecting` — the feasibility rule and the pick (overall and per cell);
* :mod:`~mmw.selection.reeval` — re-evaluation runs (marked ``reeval-``, never in a pool) and median (MAD);
* :mod:`~mmw.selection.rerun` — the re-run command of a pick (its report and figure:
  :mod:`mmw.reporting.selection`).

Typical use (what ``mmw select`` does)::

    experiments = read_experiments(Path("."), pool_filter=lambda name: not is_reevaluation(name))
    pool = single_group(with_group(experiments.table))
    selection = select(pool, Constraints(max_quality_loss=0.01, min_tamper_resistance=0.2))
"""

from mmw.selection.grouping import comparable_groups, single_group, with_group
from mmw.selection.reading import Experiments, read_experiments
from mmw.selection.reeval import REEVAL_PREFIX, is_reevaluation, median_mad
from mmw.selection.rerun import RerunCommand, fresh_seed, override_value, rerun_command
from mmw.selection.selecting import PAPER_CONSTRAINTS, Constraints, Selection, cell_picks, select

__all__ = ["PAPER_CONSTRAINTS", "REEVAL_PREFIX", "Constraints", "Experiments", "RerunCommand", "Selection",
           "cell_picks", "comparable_groups", "fresh_seed", "is_reevaluation", "median_mad", "override_value",
           "read_experiments", "rerun_command", "select", "single_group", "with_group"]
