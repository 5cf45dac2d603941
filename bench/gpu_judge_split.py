"""The judge's expected mode with its attention split causally (``Judge.split_attention``, the CUDA default) against
the dense tree mask it ran before, each compiled on two short rows (as the judge is) or on a batch of long ones: on
one GPU, the same model and rows, the variants one after the other (each a fresh compilation), per kind of row (texts, attacked copies): ms a judgement over ``--passes`` passes, the
device time by kernel kind (torch profiler, 4 batches), and how far each variant's numbers are from the first's.

Rows as ``bench/gpu_judge_rows.py``: ``--texts`` random-token texts of ``--tokens`` tokens and, for the first third,
one copy per attack of params-full.yaml's list; the judge a random-init Llama-3-8B shape in bf16, batch 16.

    PYTHONPATH=.:bench python3 bench/gpu_judge_split.py --tokenizer /tmp/tokq --out DIR
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import typer
from gpu_judge_plan import stand_in_judge_model, stand_in_rows  # bench/ is run as scripts
from gpu_judge_rows import categories, sync

from mmw.engines import attention as attention_module
from mmw.engines.models import _padding_left
from mmw.judge.backends import TransformersBackend
from mmw.judge.judge import CompiledLayers, Judge

#: (name, split_attention, words): the layout, and the length of the batch of rows the judge is first compiled on
#: (0: the judge's own two short rows; else a batch of rows of that many words: Inductor tunes its kernels' launch
#: settings on the first sizes it sees, which was a suspect for the split's slower elementwise kernels). A name
#: ending in /inplace or /cat runs the split with its output assembled as this function says (same values, other
#: copies); "split/..." otherwise runs mmw's own (which concatenates, as /cat; it wrote in place when the first
#: four variants were measured); "split/whole" runs mmw's split with its last decoder layer whole
#: (``Judge.prune_last_layer`` off: every position's queries, output projection and MLP, as before the pruning).
VARIANTS = [("dense/short", False, 0), ("split/short", True, 0), ("split/long", True, 1024), ("dense/long", False, 1024)]


def split_assembled(how: str):
    """``mmw.engines.attention._causal_split_attention`` with its output assembled as ``how``: "inplace" (the extra
    rows written into the causal call's own output, then transposed) or "cat" (the context rows and the extra rows
    concatenated, then transposed)."""
    pad, sdpa = torch.nn.functional.pad, torch.nn.functional.scaled_dot_product_attention

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        batch, heads, queries, dim = query.shape
        kv_heads, keys, width = key.shape[1], key.shape[2], attention_mask.shape[-1]
        groups, extra = heads // kv_heads, attention_mask.shape[-2]
        context, head = queries - extra, keys - queries
        key, value = pad(key, (0, 0, 0, width - keys)), pad(value, (0, 0, 0, width - keys))
        out = sdpa(pad(query, (0, 0, head, width - keys)), key, value, is_causal=True, scale=scaling,
                   enable_gqa=groups > 1)
        folded = query[:, :, context:].reshape(batch, kv_heads, groups * extra, dim)
        nodes = sdpa(folded, key, value, attn_mask=attention_mask.repeat(1, 1, groups, 1),
                     scale=scaling).reshape(batch, heads, extra, dim)
        if how == "inplace":
            out[:, :, head + context:head + queries] = nodes
            return out[:, :, head:head + queries].transpose(1, 2).contiguous(), None
        return torch.cat([out[:, :, head:head + context], nodes], 2).transpose(1, 2).contiguous(), None

    return attention


def main(tokenizer: Path = typer.Option(...), texts: int = 96, tokens: int = 1024, batch: int = 16,
         passes: int = 3, rounds: int = 1, tiny: bool = False, only: str = "", out: str = "") -> None:
    """``only``: comma-separated variant names (default: the four of :data:`VARIANTS`); split/inplace,
    split/cat and split/whole are chosen by name only. ``rounds``: the chosen variants run that many times in turn
    (A B A B ...), each run a fresh compilation; the profile and the numbers compared are the first round's."""
    result: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__, "passes": passes, "rounds": rounds, "batch": batch, "variants": {}}
    tok, rows, prompts = stand_in_rows(tokenizer, texts, tokens)
    _padding_left(tok)
    model = stand_in_judge_model(tok, tiny)
    model.set_attn_implementation("sdpa")
    kinds = {"texts": list(range(texts)), "attacked": list(range(texts, len(rows)))}
    probs: dict[str, dict[str, np.ndarray]] = {}
    activity = torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available() else \
        torch.profiler.ProfilerActivity.CPU
    chosen = [v for v in VARIANTS + [(f"split/{how}", True, 0) for how in ("inplace", "cat", "whole")]
              if v[0] in (only.split(",") if only else [name for name, _, _ in VARIANTS])]
    own = attention_module._causal_split_attention
    for round_, (name, split, compile_tokens) in ((r, v) for r in range(rounds) for v in chosen):
        torch._dynamo.reset()  # a fresh compilation, on this variant's first rows
        how = name.split("/")[1]
        attention_module._causal_split_attention = split_assembled(how) if how in ("inplace", "cat") else own
        sync()
        start = time.perf_counter()
        long_first = bool(compile_tokens) and torch.cuda.is_available()
        judge = Judge(tok, model, batch_size=batch, split_attention=split, compiled=False if long_first else None,
                      prune_last_layer=how != "whole")
        if long_first:  # compiled first on a batch of long rows
            judge._compiled = CompiledLayers(model)
            judge.node_logits([tok.encode(judge._chat("?", " ".join(["word"] * compile_tokens)) + judge.trie.prefill,
                                          add_special_tokens=False)] * batch)
        sync()
        entry: dict = {"judge_build_s": round(time.perf_counter() - start, 2), "compiled": judge._compiled is not None,
                       "round": round_, "arithmetic": judge.arithmetic, "kinds": {}}
        backend = TransformersBackend(judge, "stand-in")
        row_tokens = judge.token_counts(rows)
        list(judge.grade_distributions([([prompts[i] for i in u], [rows[i] for i in u])
                                        for u in backend.plan(rows[:2 * batch])]))  # warm-up
        for kind, members in kinds.items():
            kind_rows, kind_prompts = [rows[i] for i in members], [prompts[i] for i in members]
            units = [([kind_prompts[i] for i in u], [kind_rows[i] for i in u]) for u in backend.plan(kind_rows)]
            seconds = []
            for _ in range(passes):
                sync()
                start = time.perf_counter()
                got = np.concatenate(list(judge.grade_distributions(units)))  # what rate_units reads
                sync()
                seconds.append(time.perf_counter() - start)
            entry["kinds"][kind] = {
                "rows": len(members),
                "text_tokens_per_row": round(sum(row_tokens[i] for i in members) / len(members), 1),
                "ms_per_judgement": [round(1000 * s / len(members), 2) for s in seconds]}
            if round_:
                continue
            probs.setdefault(kind, {})[name] = got
            with torch.profiler.profile(activities=[activity]) as profile:
                list(judge.grade_distributions(units[:4]))
                sync()
            split_ms = categories(profile)
            profiled = sum(len(u[1]) for u in units[:4])
            entry["kinds"][kind].update({
                "device_ms_per_judgement_profiled": {k: round(v / profiled, 2) for k, v in split_ms["ms"].items()},
                "top_kernels_ms": split_ms["top"][:10]})
        result["variants"].setdefault(name, []).append(entry)
        print(name, json.dumps({k: v if k != "kinds" else {kk: {x: y for x, y in vv.items() if x != "top_kernels_ms"}
                                                           for kk, vv in v.items()} for k, v in entry.items()}),
              flush=True)
        del judge, backend
    # how far each variant's numbers are from the first one's: grade probabilities, and the expected grades
    result["against_first"] = {}
    first = chosen[0][0]
    for kind, by_variant in probs.items():
        a = by_variant[first]
        grades = np.arange(a.shape[1])
        mean_a = a @ grades / np.maximum(a.sum(-1), 1e-30)
        for name, b in by_variant.items():
            mean_b = b @ grades / np.maximum(b.sum(-1), 1e-30)
            result["against_first"][f"{kind}/{name}"] = {
                "probability_max_abs_diff": float(np.abs(a - b).max()),
                "mass_max_rel_diff": float((np.abs(a.sum(-1) - b.sum(-1)) / a.sum(-1)).max()),
                "expected_grade_max_abs_diff": round(float(np.abs(mean_a - mean_b).max()), 5),
                "expected_grade_mean_abs_diff": round(float(np.abs(mean_a - mean_b).mean()), 6)}
    print(json.dumps(result["against_first"]), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_judge_split.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
