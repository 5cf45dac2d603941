"""Reading one finished experiment's evidence (mmw.sweep.units.read_experiment: params, metrics, per-prompt rows)
with its tables taken from the local DVC cache by the dvc.lock's md5s, against the same tables through
``dvc.api.open`` (a DVC index built at the revision for each table); interleaved rounds, one process.

    .venv/bin/python bench/evidence_read.py REPO [ROUNDS]

REPO: a pipeline repository with finished experiments (e.g. after ``mmw sweep run``); every experiment ref is read.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

from mmw.sweep import evidence
from mmw.sweep.units import read_experiment


def main(repo: Path, rounds: int) -> None:
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/"], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    shas = [line.split()[1] for line in refs if "/exec/" not in line]
    times: dict[str, list[float]] = {"cache": [], "dvc_api": []}
    for index in range(rounds):
        for mode in (("cache", "dvc_api") if index % 2 == 0 else ("dvc_api", "cache")):
            for sha in shas:
                started = time.perf_counter()
                if mode == "cache":
                    _, _, _, rows = read_experiment(repo, sha)
                else:
                    with mock.patch.object(evidence, "cached_file", lambda *_: None):
                        _, _, _, rows = read_experiment(repo, sha)
                times[mode].append(time.perf_counter() - started)
                assert rows is not None and rows.height > 0
    print(json.dumps({"experiments": len(shas), "rounds": rounds,
                      **{mode: {"median_s": round(statistics.median(v), 2), "min_s": round(min(v), 2),
                                "max_s": round(max(v), 2)} for mode, v in times.items()}}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
