"""The wall-time record of a stage: ``reports/timings/<stage>.json``.

Timings are a log, not a result: they are no DVC output and no stage reads them (a cached output computed from
wall times would never reproduce). ``mmw timings`` (:func:`mmw.reporting.run.timings_markdown`) and the sweep
read them; docs/DVC.md says where they live.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mmw import provenance
from mmw.io import TIMINGS_DIR, write_json


@contextmanager
def timed(stage: str) -> Iterator[dict[str, Any]]:
    """Time the body; on success write ``reports/timings/<stage>.json`` with ``wall_s`` and the yielded details,
    and the stage's numeric path (:mod:`mmw.provenance`, a DVC output of the stages it names).

    Nothing is written when the body raises, so a failed stage leaves no record that looks complete.
    """
    started = time.perf_counter()
    details: dict[str, Any] = {}
    provenance.reset_models()
    yield details
    provenance.write(stage)
    write_json({"stage": stage, "wall_s": round(time.perf_counter() - started, 3), **details},
               TIMINGS_DIR / f"{stage}.json")
