"""The judge's expected-mode forward compiled (``mmw.judge.judge.CompiledLayers``) vs eager, at full scale on one GPU.

Rows and judge as bench/gpu_judge_plan.py (random-token texts of ``--tokens`` tokens and their attacked copies, a
random-init Llama-3-8B judge in bf16), batches as the rate stage cuts them on CUDA (by tokens, widths rounded to
128). One eager pass after a warm-up, then the compiled judge's first pass (its compilation included, reported
apart) and a second pass. Inductor keeps compiled code in ``TORCHINDUCTOR_CACHE_DIR``: run twice with the same
folder to see a process that finds its compilation cached (what a sweep's later configurations on one machine do).

``--variants gqa,rows128,expanded`` compiles the judge once per variant in one process, against the same eager
reference. The result also counts the positions each batch plan forwards: the rows' own tokens, rows padded to
their batch's longest (what the judge forwards now), and rows rounded up to 128 (``rows128``, the judge before).

    PYTHONPATH=.:bench python3 bench/gpu_judge_compile.py --tokenizer DIR --texts 96 --variants gqa,expanded --out DIR
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import typer
from gpu_judge_plan import stand_in_judge_model, stand_in_rows  # bench/ is run as scripts, not a package

from mmw.judge.judge import MAX_GRADE, Judge
from mmw.judge.backends import TransformersBackend


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(tokenizer: Path = typer.Option(...), texts: int = 96, tokens: int = 1024, batch: int = 16,
         tiny: bool = False, label: str = "", profile: bool = False,
         variants: str = typer.Option("gqa", help="compiled judges to time in turn, joined by commas: gqa (K/V "
                                                  "heads read by their query-head groups, rows padded to their "
                                                  "batch's longest, attention widths rounded to 128: the default), "
                                                  "rows128 (the same with rows rounded to 128 instead), expanded "
                                                  "(K/V copied to every query head)"),
         trace: int = typer.Option(0, help="also write a Chrome trace (CPU and CUDA) of this many batches"),
         eager_pass: bool = typer.Option(True, help="time an eager pass (the reference of the differences)"),
         out: str = "") -> None:
    tok, rows, prompts = stand_in_rows(tokenizer, texts, tokens)
    model = stand_in_judge_model(tok, tiny)
    eager = Judge(tok, model, batch_size=batch, compiled=False, round_attention=True)
    eager.pad_multiple = 128  # as on CUDA (a CPU smoke run pads the same way)
    plan = TransformersBackend(eager, "stand-in").plan(rows)

    def rate(judge: Judge, units: list[list[int]]) -> tuple[float, np.ndarray]:
        sync()
        start = time.perf_counter()
        probs = np.zeros((len(rows), MAX_GRADE + 1))
        groups = (([prompts[i] for i in unit], [rows[i] for i in unit]) for unit in units)
        for unit, block in zip(units, judge.grade_distributions(groups), strict=True):  # as the rate stage
            probs[unit] = block
        sync()
        return time.perf_counter() - start, probs

    def expected(probs: np.ndarray) -> np.ndarray:
        return probs @ np.arange(MAX_GRADE + 1) / np.maximum(probs.sum(-1), 1e-300)

    result = {"label": label, "rows": len(rows), "batch": batch, "batches": len(plan),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "positions": forwarded_positions(eager, prompts, rows, plan)}
    if eager_pass:
        result["eager_warmup_s"] = round(rate(eager, plan[:3])[0], 2)
    seconds, reference = rate(eager, plan if eager_pass else plan[:1])
    result["eager"] = {"s": round(seconds, 2), "ms_per_judgement": round(1000 * seconds / len(rows), 2)}
    print(result, flush=True)

    from torch._dynamo.utils import counters

    variant_probs = {}
    seen: list[str] = []
    for choice in variants.split(","):
        key = "" if choice == "gqa" else f"_{choice}"  # "compiled_*" names the default
        key += f"_again{seen.count(choice)}" * (choice in seen)  # a variant repeated later in the process
        seen.append(choice)
        t0 = time.perf_counter()
        graphs = int(counters["stats"]["unique_graphs"])
        Judge.grouped_query = choice != "expanded"
        compiled = Judge(tok, model, batch_size=batch, compiled=True, round_attention=choice != "rows128")
        compiled.pad_multiple = 128
        result[f"compiled{key}_arithmetic"] = compiled.arithmetic
        result[f"compiled{key}_setup_s"] = round(time.perf_counter() - t0, 2)
        first_unit, _ = rate(compiled, plan[:1])  # the compilation happens in the first forward
        result[f"compiled{key}_first_batch_s"] = round(first_unit, 2)
        for name in ("pass1", "pass2"):
            seconds, probs = rate(compiled, plan)
            result[f"compiled{key}_{name}"] = {"s": round(seconds, 2),
                                               "ms_per_judgement": round(1000 * seconds / len(rows), 2)}
            print(choice, name, result[f"compiled{key}_{name}"], flush=True)
        if profile:  # where a compiled pass's GPU time goes, by kernel family
            result[f"profile{key}"] = kernel_families(lambda: rate(compiled, plan), len(rows))
            print(json.dumps(result[f"profile{key}"]), flush=True)
        if trace:
            trace_batches(lambda: rate(compiled, plan[:trace]), Path(out or ".", f"trace{key}.json"))
        variant_probs[choice + key] = probs
        result[f"compiled{key}_graphs"] = int(counters["stats"]["unique_graphs"]) - graphs
        if eager_pass:
            result[f"compiled{key}_max_abs_diff_expected_rating"] = float(
                np.nanmax(np.abs(expected(probs) - expected(reference))))
            result[f"compiled{key}_max_abs_diff_grade_probability"] = float(np.abs(probs - reference).max())
        print(json.dumps(result), flush=True)
    if len(variant_probs) > 1:
        first, *others = variant_probs.values()
        result["variants_bit_identical"] = all(np.array_equal(first, other) for other in others)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"gpu_judge_compile{'_' + label if label else ''}.json").write_text(json.dumps(result, indent=1))


def forwarded_positions(judge: Judge, prompts: list[str], rows: list[str], plan: list[list[int]]) -> dict:
    """Positions a batch plan forwards past the shared head: the rows' own, rows padded to their batch's longest,
    rows rounded up to 128."""
    lengths = [len(judge.tokenizer.encode(judge._chat(p, t) + judge.trie.prefill, add_special_tokens=False))
               - len(judge.head) for p, t in zip(prompts, rows, strict=True)]
    widths = [max(lengths[i] for i in unit) for unit in plan]
    return {"real": sum(lengths),
            "batch_longest": sum(w * len(unit) for w, unit in zip(widths, plan, strict=True)),
            "rounded_128": sum(-(-w // 128) * 128 * len(unit) for w, unit in zip(widths, plan, strict=True))}


FAMILIES = (("gemm", ("gemm", "sm90_xmma", "cutlass", "cublas", "nvjet", "matmul")),
            ("attention", ("fmha", "flash", "attention", "cudnn")),
            ("triton (compiled norms, rotary, activations)", ("triton",)))


def trace_batches(run, path: Path) -> None:
    """A Chrome trace (CPU ops and CUDA kernels) of one ``run()``: where the device waits for the host."""
    from torch.profiler import ProfilerActivity, profile

    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    prof.export_chrome_trace(str(path))


def kernel_families(run, judgements: int) -> dict:
    """GPU time of one ``run()`` by kernel family (by kernel name), ms a judgement, and the 40 largest kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
    totals: dict[str, float] = {}
    kernels = []
    for event in prof.key_averages():
        gpu_us = getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
        if not gpu_us:
            continue
        name = event.key.lower()
        family = next((f for f, keys in FAMILIES if any(k in name for k in keys)), "other")
        totals[family] = totals.get(family, 0.0) + gpu_us
        kernels.append((gpu_us, event.key[:120]))
    kernels.sort(reverse=True)
    return {"ms_per_judgement": {f: round(us / 1000 / judgements, 2) for f, us in sorted(totals.items())},
            "gpu_ms_per_judgement": round(sum(totals.values()) / 1000 / judgements, 2),
            "top_kernels_ms_per_judgement": [[round(us / 1000 / judgements, 3), name] for us, name in kernels[:40]]}


if __name__ == "__main__":
    typer.run(main)
