"""The watermark step's law and entropies on a GPU: ``mmw::softmax_law`` (``mmw.kernels.softmax``, two passes)
against torch's code compiled by Inductor (``entropies`` + ``probabilities``), on the same logits, same card.

* agreement: at ``--batch`` x 128,256 float32 logits (Gaussian of scales 1, 3, 8 and real models' laws), T = 1
  and 0.7: the largest relative difference of the law and of each entropy; the law pass that also bins the law by
  the tournament's first g-bits against the pass alone and the draw's own first histogram pass (values that differ:
  0 expected); then the tokens of whole compiled steps (plain sampling and the tournament, m = 30) with and without
  the kernels, and of the tournament with its first histogram in the law pass and apart, same key and inputs, over
  8 steps.
* timing: each side alone captured in a CUDA graph, GPU ms a replay (median of ``--replays``), in ``--rounds``
  interleaved rounds: the law and both entropies, at T = 1 and 0.7, with the first histogram in the law pass and
  apart; a copy of the float64 law beside them (the
  bandwidth bound); and the kernels at each launch width of LAUNCH_THREADS x LAUNCH_PARTS, the fastest written to
  ``--out``/fastest_launch as ``THREADS,PARTS`` (MMW_BENCH_SOFTMAX of bench/gpu_tournament.py).

    PYTHONPATH=. python3 bench/gpu_softmax.py --out DIR
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_tournament  # noqa: E402
from gpu_tournament import AGREEMENT_SCALES, KEY, VOCAB, law_logits, law_name, spec, step_inputs  # noqa: E402

from mmw.inductor import inductor_options  # noqa: E402
from mmw.watermark.processor import WatermarkStep, entropies  # noqa: E402
from mmw.watermark.samplers.base import probabilities, softmax_law  # noqa: E402
from mmw.watermark.samplers.tournament import CHUNK_BITS, FIXED_POINT, cuda_binned_law  # noqa: E402


#: Launch widths the timing part scans (``mmw.kernels.softmax.THREADS`` and ``PARTS``).
LAUNCH_THREADS = (128, 256, 512)
LAUNCH_PARTS = (8, 16, 32, 64)


def torch_law(logits: torch.Tensor, temperature: float):
    """The step's code before the kernels: Inductor's float64 log-softmax and softmax."""
    return probabilities(logits, temperature), torch.stack(entropies(logits))


def graph_ms(fn, replays: int) -> float:
    """Median GPU ms of one replay of ``fn`` captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    events = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().clamp(min=torch.finfo(torch.float64).tiny)
    return float(((a - b).abs() / scale).max())


def first_apart(logits: torch.Tensor, temperature: float, seeds: torch.Tensor):
    """The law and entropies, then the draw's first histogram pass over the written law (the launch
    ``mmw.kernels.tournament.launch_choose`` makes when it is not given that pass)."""
    from mmw.kernels import tournament as kt

    probs, stats = softmax_law(logits, temperature)
    width = min(CHUNK_BITS, spec().layers)
    rows = probs.shape[0]
    bins = torch.empty(rows, kt.PARTS, 1 << width, dtype=torch.int64, device=probs.device)
    totals = torch.empty(rows, kt.PARTS, dtype=torch.int64, device=probs.device)
    tables = torch.ones(1, rows, 1 << CHUNK_BITS, dtype=torch.float64, device=probs.device)
    kt.histogram32_kernel(kt.HISTOGRAM_UNROLL, kt.HISTOGRAM_CACHED_TABLES, kt.HISTOGRAM_MIN_BLOCKS,
                          kt.HISTOGRAM_SKIP_ZERO)[(kt.PARTS, rows), kt.THREADS, kt._launch_stream(probs)](
        *(kt._device_array(x) for x in (probs, seeds, tables)), 0, CHUNK_BITS, 0, width, FIXED_POINT,
        kt._device_array(bins), kt._device_array(totals))
    return probs, stats, bins, totals


def first_pass_agreement(batch: int) -> dict:
    """The law pass that also bins the law by its first g-bits (``cuda_binned_law``) against the law pass alone
    and the draw's own first histogram pass over the written law: counts of differing values (0 expected)."""
    row = dict(law_diff=0, stats_diff=0, bins_diff=0, totals_diff=0)
    gen = torch.Generator("cuda").manual_seed(37)
    for scale in AGREEMENT_SCALES + (None,):
        logits = law_logits(batch, scale, 41)
        seeds = torch.randint(-2**62, 2**62, (batch,), device="cuda", generator=gen)
        for temperature in (1.0, 0.7):
            binned = cuda_binned_law(logits, temperature, seeds, min(CHUNK_BITS, spec().layers))
            apart = first_apart(logits, temperature, seeds)
            for key, a, b in zip(("law_diff", "stats_diff", "bins_diff", "totals_diff"), binned, apart):
                row[key] += int((a != b).sum())
    print(f"agreement, the first histogram in the law pass vs apart (differing values): {row}", flush=True)
    return row


def first_pass_tokens(batch: int, steps: int) -> dict:
    """Tokens of compiled tournament steps whose draw takes its first histogram from the law pass against steps
    whose draw makes that pass itself, same key and inputs."""
    sides = [WatermarkStep(spec(), KEY, VOCAB, 1.0, compiled=True, mode="default") for _ in range(2)]
    sides[1].sampler.binned_first_pass = False
    same = total = 0
    for scale in AGREEMENT_SCALES + (None,):
        scores, context, at, state = step_inputs(batch, scale, 43)
        histories = [side.new_history(batch, "cuda") for side in sides]
        for _ in range(steps):
            a, b = (side(scores, context, at.clone(), **state, history=h) for side, h in zip(sides, histories))
            same += int((a[0] == b[0]).sum())
            total += batch
            at += 1
    row = dict(same=same, total=total, compiled=[side.is_compiled for side in sides])
    print(f"tokens, tournament, first histogram in the law pass vs apart: {same}/{total} equal", flush=True)
    return row


def main(out: str = "", batch: int = 296, rounds: int = 5, replays: int = 20, steps: int = 8) -> None:
    result: dict = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, batch=batch, vocab=VOCAB,
                        date=time.strftime("%F %T"))
    gpu_tournament.LAW = "real"  # scale None: real models' laws
    compiled_torch = torch.compile(torch_law, options=inductor_options("default"))

    agree = {}
    for scale in AGREEMENT_SCALES + (None,):
        logits = law_logits(batch, scale, 17)
        for temperature in (1.0, 0.7):
            probs, stats = softmax_law(logits, temperature)
            ref_probs, ref_stats = compiled_torch(logits, temperature)
            positive = ref_probs > 1e-300
            row = dict(law_rel=rel(probs[positive], ref_probs[positive]),
                       law_zero_mismatch=int(((probs > 0) != positive).sum()),
                       entropy_rel=rel(stats[0], ref_stats[0]), spike_rel=rel(stats[1], ref_stats[1]),
                       entropy_abs=float((stats[0] - ref_stats[0]).abs().max()))
            agree[f"{law_name(scale)}, T={temperature}"] = row
            print(f"agreement {law_name(scale)}, T={temperature}: {row}", flush=True)
    agree["first histogram"] = first_pass_agreement(batch)
    tokens = {}
    for name, scheme in (("plain", None), ("tournament", spec())):
        fused = WatermarkStep(scheme, KEY, VOCAB, 1.0, compiled=True, mode="default")
        plain_torch = WatermarkStep(scheme, KEY, VOCAB, 1.0, compiled=True, mode="default")
        plain_torch.fused_softmax = False
        same = total = 0
        stat_diff = 0.0
        for scale in AGREEMENT_SCALES + (None,):
            scores, context, at, state = step_inputs(batch, scale, 23)
            histories = [fused.new_history(batch, "cuda"), plain_torch.new_history(batch, "cuda")]
            for _ in range(steps):
                a = fused(scores, context, at.clone(), **state, history=histories[0])
                b = plain_torch(scores, context, at.clone(), **state, history=histories[1])
                same += int((a[0] == b[0]).sum())
                total += batch
                stat_diff = max(stat_diff, float((a[1] - b[1]).abs().max()), float((a[2] - b[2]).abs().max()))
                at += 1
        assert fused._fused_softmax and not plain_torch._fused_softmax
        tokens[name] = dict(same=same, total=total, entropy_abs_max=stat_diff,
                            compiled=[fused.is_compiled, plain_torch.is_compiled])
        print(f"tokens, {name}, kernels vs torch's code: {same}/{total} equal, entropies within {stat_diff:.3g}",
              flush=True)
    tokens["tournament, first histogram in the law pass vs apart"] = first_pass_tokens(batch, steps)
    result.update(agreement=agree, tokens=tokens)

    logits = law_logits(batch, None, 29)
    law64 = torch.softmax(logits.double(), -1)
    copy_out = torch.empty_like(law64)
    seeds = torch.randint(-2**62, 2**62, (batch,), device="cuda", generator=torch.Generator("cuda").manual_seed(31))
    first_width = min(CHUNK_BITS, spec().layers)
    sides = {"kernels: law + entropies": lambda: softmax_law(logits, 1.0),
             "kernels: law + entropies + first histogram": lambda: cuda_binned_law(logits, 1.0, seeds, first_width),
             "kernels: law + entropies, then the first histogram pass": lambda: first_apart(logits, 1.0, seeds),
             "kernels: law at T = 0.7 + entropies + first histogram": lambda: cuda_binned_law(logits, 0.7, seeds,
                                                                                              first_width),
             "kernels: law at T = 0.7 + entropies, then the first histogram pass": lambda: first_apart(logits, 0.7,
                                                                                                       seeds),
             "torch (Inductor): law + entropies": lambda: compiled_torch(logits, 1.0),
             "kernels: law at T = 0.7 + entropies": lambda: softmax_law(logits, 0.7),
             "torch (Inductor): law at T = 0.7 + entropies": lambda: compiled_torch(logits, 0.7),
             "copy of the float64 law": lambda: copy_out.copy_(law64)}
    from mmw.kernels import softmax as ks

    default = (ks.THREADS, ks.PARTS)
    launches = [(threads, parts) for threads in LAUNCH_THREADS for parts in LAUNCH_PARTS]

    def launched(threads: int, parts: int):
        def fn():
            ks.THREADS, ks.PARTS = threads, parts
            try:
                return softmax_law(logits, 1.0)
            finally:
                ks.THREADS, ks.PARTS = default
        return fn

    for threads, parts in launches:
        sides[f"kernels: law + entropies, {threads} threads x {parts} blocks a row"] = launched(threads, parts)
    timings = {name: [] for name in sides}
    for r in range(rounds):
        for name, fn in sides.items():
            timings[name].append(graph_ms(fn, replays))
        print(f"round {r}: " + ", ".join(f"{n} {v[-1]:.3f}" for n, v in timings.items()), flush=True)
    fastest = min(launches, key=lambda tp: statistics.median(
        timings[f"kernels: law + entropies, {tp[0]} threads x {tp[1]} blocks a row"]))
    result["fastest_launch"] = dict(THREADS=fastest[0], PARTS=fastest[1])
    print(f"fastest launch: {fastest[0]} threads x {fastest[1]} blocks a row", flush=True)
    result["ms"] = {name: dict(rounds=v, median=statistics.median(v), min=min(v), max=max(v))
                    for name, v in timings.items()}
    print(f"\nGPU ms a call (CUDA-graph replays, median of {replays}; median [range] over {rounds} rounds), "
          f"{batch} x {VOCAB}:")
    for name, row in result["ms"].items():
        print(f"  {name:46s} {row['median']:.3f} [{row['min']:.3f}, {row['max']:.3f}]")
    if out:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "fastest_launch").write_text(f"{fastest[0]},{fastest[1]}\n")
        (path / "gpu_softmax.json.tmp").write_text(json.dumps(result, indent=1))
        (path / "gpu_softmax.json.tmp").replace(path / "gpu_softmax.json")


if __name__ == "__main__":
    typer.run(main)
