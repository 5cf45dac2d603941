"""Repetition in the oracle pairs' generations: per side, the share of each text's 4-token contexts that already
occurred earlier in the text (a Gumbel-max sampler that watermarks a repeated context again picks the same token
again, and can loop). Reads the generations bench/oracles.py stored under ``--parts``.

    python bench/oracle_repetition.py --parts .oracle-parts
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import typer


def repeated_share(tokens: list[int], width: int) -> float:
    """Share of the text's ``width``-token contexts (each token's preceding ``width``) seen before in the text."""
    contexts = [tuple(tokens[i - width:i]) for i in range(width, len(tokens))]
    return 1 - len(set(contexts)) / len(contexts) if contexts else float("nan")


def main(parts: Path = Path(".oracle-parts"), width: int = 4) -> None:
    print(f"| side (generations under {parts}) | texts | repeated {width}-token contexts: mean | median | max | "
          "texts with > 20 % |")
    print("|---|---|---|---|---|---|")
    for folder in sorted(p for p in parts.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.parquet"))
        if not files:
            continue
        shares = np.array([repeated_share(t, width) for t in pl.concat([pl.read_parquet(f) for f in files])
                           ["tokens"].to_list()])
        print(f"| {folder.name} | {len(shares)} | {shares.mean():.3f} | {np.median(shares):.3f} | {shares.max():.3f} | "
              f"{int((shares > 0.2).sum())} |")


if __name__ == "__main__":
    typer.run(main)
