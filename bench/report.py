"""How long `mmw report` takes and how big reports/index.html gets, on synthetic sweeps of growing size, and how long
headless Chromium takes to load and draw the page (the browser test's cost).

The sweeps follow the results contract (tests/test_html_report.py's generator, repeated ``--copies`` times with
distinct config ids to reach the paper's ~1,200 configurations). Prints one JSON line per size.

    python bench/report.py --copies 1 5 12
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_html_report import make_sweep  # the tests' contract generator

from mmw.reporting.page import build_report


def grown(directory: Path, copies: int) -> int:
    """Write a sweep of ``copies`` x the fixture's 96 configurations (and their attack rows) to ``directory``."""
    make_sweep(directory)
    results, attacks = pl.read_parquet(directory / "results.parquet"), pl.read_parquet(directory / "attacks.parquet")
    suffix = pl.col("config_id") + pl.lit("-c")
    results = pl.concat([results] + [results.with_columns(suffix + str(c)) for c in range(1, copies)])
    attacks = pl.concat([attacks] + [attacks.with_columns(suffix + str(c)) for c in range(1, copies)])
    results.write_parquet(directory / "results.parquet")
    attacks.write_parquet(directory / "attacks.parquet")
    return results.height


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 12])
    args = parser.parse_args()
    browser = shutil.which("chromium")
    for copies in args.copies:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            configs = grown(root / "reports/sweeps/bench", copies)
            info = build_report(root)
            row = {"configs": configs, "render_s": round(info.seconds, 2), "bytes": info.bytes}
            if browser:
                start = time.perf_counter()
                subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,7000",
                                f"--screenshot={root / 'shot.png'}", info.path.as_uri()], capture_output=True,
                               check=True, timeout=300)
                row["chromium_screenshot_s"] = round(time.perf_counter() - start, 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
