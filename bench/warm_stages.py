"""Run the pipeline's stages one after another in this process, each model loaded once: the path a packed sweep
unit takes (mmw.sweep.pack: ``mmw.sweep.pipeline.run_stage`` under ``mmw.engines.models.shared_loads``), for one
configuration. Used by ``bench/gpu_fullscale.py --in-process``; run in the stages' workspace:

    python bench/warm_stages.py REPO STAGE[,STAGE...]

Prints one JSON line per stage: ``{"stage", "wall_s", "rc"}`` (a failing stage is recorded with its error and
the run goes on, as the subprocess harness does); the first stage's time includes the imports it needs and the
loads of the models it uses.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path


def main(repo: str, stages: str) -> int:
    from mmw.engines.models import shared_loads
    from mmw.sweep.pipeline import run_stage, stage_plan

    wanted = stages.split(",")
    plan = [stage for stage in stage_plan(Path(repo))[0] if stage.name in wanted]
    failed = 0
    with shared_loads():
        for stage in plan:
            t0 = time.perf_counter()
            error = None
            try:
                run_stage(stage)
            except Exception as err:  # noqa: BLE001 - a stage's failure is recorded, as a subprocess's would be
                traceback.print_exc()
                error = f"{type(err).__name__}: {err}"
                failed += 1
            print(json.dumps({"stage": stage.name, "wall_s": round(time.perf_counter() - t0, 1),
                              "rc": 0 if error is None else 1, **({"error": error[:400]} if error else {})}),
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
