"""The wall-time record of a stage: ``reports/timings/<stage>.json``.

Timings are a log, not a result: they are no DVC output and no stage reads them (a cached output computed from
wall times would never reproduce). ``mmw timings`` and the sweep read them; docs/DVC.md says where they live.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mmw.io import TIMINGS_DIR, read_json, write_json

#: Pipeline order of the stages in ``mmw timings`` (others follow, by name).
STAGE_ORDER = ("key", "low_entropy_inputs", "prompts", "generate_baseline", "generate_watermarked", "perturb",
               "detect_baseline", "detect_watermarked", "rate_baseline", "rate_watermarked", "quality", "aggregate")


@contextmanager
def timed(stage: str) -> Iterator[dict[str, Any]]:
    """Time the body; on success write ``reports/timings/<stage>.json`` with ``wall_s`` and the yielded details.

    Nothing is written when the body raises, so a failed stage leaves no record that looks complete.
    """
    started = time.perf_counter()
    details: dict[str, Any] = {}
    yield details
    write_json({"stage": stage, "wall_s": round(time.perf_counter() - started, 3), **details},
               TIMINGS_DIR / f"{stage}.json")


def timings_markdown() -> str:
    """A Markdown table of the last wall time of each stage that ran here (``mmw timings``)."""
    records = [read_json(path) for path in TIMINGS_DIR.glob("*.json")]
    order = {stage: index for index, stage in enumerate(STAGE_ORDER)}
    records.sort(key=lambda r: (order.get(r["stage"], len(order)), r["stage"]))
    total = sum(r["wall_s"] for r in records) or 1.0
    lines = ["| stage | seconds | share |", "|---|---|---|"]
    lines += [f"| {r['stage']} | {r['wall_s']:.1f} | {100 * r['wall_s'] / total:.0f}% |" for r in records]
    lines.append(f"| total | {sum(r['wall_s'] for r in records):.1f} | 100% |")
    return "\n".join(lines)
