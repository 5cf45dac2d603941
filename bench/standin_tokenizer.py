"""A stand-in for Llama-3's tokenizer for the GPU benchmarks: a real byte-level BPE cut to Llama-3's 128,256 ids.

The GPU benchmarks' random-init Llama-3-8B models need a tokenizer with 128,256 ids. Widening SmolLM2's 49,152-id
tokenizer with 79,104 added tokens (``<x0>``, ``<x1>``, ...; bench/gpu_setup_h200.sh's first stand-in) gives the
ids but not the behaviour: transformers handles each added token in Python, so that tokenizer takes ~4-5x as long
to load as a real 128k-152k vocabulary (6.5-7 s against 1.3-1.7 s on a 2-core VM), and every stage that loads it
pays that. This one keeps Qwen2.5's byte-level BPE (151,643 tokens, 151,387 merges, its pre-tokenizer and
decoder) up to 128,234 ids, drops the merges that would make a dropped token, and puts the 22 special tokens on
the last 22 ids, as Llama-3 keeps its 256 special tokens at the top of its 128,256. Generic fast-tokenizer class
(as Llama-3's), Qwen2.5's ChatML template.

    python3 bench/standin_tokenizer.py QWEN_FOLDER OUT_FOLDER
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import typer

IDS = 128_256


def main(source: Path, out: Path) -> None:
    data = json.loads((source / "tokenizer.json").read_text())
    specials = data["added_tokens"]
    keep = IDS - len(specials)
    vocab = {token: i for token, i in data["model"]["vocab"].items() if i < keep}
    merges = []
    for merge in data["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        if left in vocab and right in vocab and left + right in vocab:
            merges.append(merge)
    renumbered = {}
    for offset, token in enumerate(specials):
        renumbered[token["id"]] = keep + offset
        token["id"] = keep + offset
    data["model"]["vocab"], data["model"]["merges"], data["added_tokens"] = vocab, merges, specials
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "TokenizersBackend"  # the generic fast tokenizer, as Llama-3's
    if "added_tokens_decoder" in config:
        config["added_tokens_decoder"] = {str(renumbered[int(k)]): v for k, v in config["added_tokens_decoder"].items()}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    if (source / "chat_template.jinja").is_file():
        shutil.copy(source / "chat_template.jinja", out / "chat_template.jinja")
    print(f"{len(vocab)} tokens + {len(specials)} specials = {len(vocab) + len(specials)} ids, "
          f"{len(merges)} of {len(json.loads((source / 'tokenizer.json').read_text())['model']['merges'])} merges")


if __name__ == "__main__":
    typer.run(main)
