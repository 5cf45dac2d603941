"""SynthID-Text's tournament sampler on a GPU: before (the layer-by-layer law, ``tournament_probs``: two passes over
the vocabulary a layer) and after (``Tournament.law``: the chunked law, ceil(m / 10) histogram passes), each against
plain sampling on the same card in the same process, back to back.

* ``kernels``: the numba passes alone (``mmw.kernels.tournament``), each captured in a CUDA graph, per launch
  shape, beside a copy of the probabilities (the bandwidth bound).
* ``step``: the watermark step alone at ``--batch`` rows x 128,256 logits (float32, an LLM's spread of a few nats),
  compiled as ``generate``'s processor compiles it (CUDA graphs); GPU ms per call from CUDA events (median of
  ``--calls``) for plain sampling, before and after, in ``--rounds`` interleaved rounds; the tokens after vs the
  layer-by-layer law run eagerly on the same inputs (flat and peaked logits); a torch profiler table of one step of
  each (kernels, host syncs), written under ``--out``.
* ``decode``: random-init Llama-3-8B shape in bf16, ``--batch`` prompts of 64 tokens, ``--new-tokens`` new tokens,
  through the stage's own call (``mmw.engines.generate.generate_batch``) on both paths: mmw's graph loop (plain,
  tournament before, after) and transformers' ``generate`` (HF plain sampling, mmw's tournament through its
  processor before and after, and mmw's plain sampling through it). Every prompt is 64 tokens (no padding), and a
  batch runs all its steps unless every row draws its end of text. One warm-up run each, then ``--rounds`` rounds,
  every configuration once a round in that order (A B A B ...); each ratio is taken within a round against that
  round's baseline, and the median and range over rounds are reported. The graph loop's GPU ms a step come from
  CUDA events around each step. Every run also records the process's CPU seconds (``time.process_time``).
  ``--host-rounds N``: N more interleaved rounds with the host seconds inside the calls that differ between the
  ``generate`` configurations timed (``HostTimers``: mmw's processor, transformers' softmax / multinomial /
  argmax), and each run's wall with the baseline's calls put in place of its own over its wall (the ratio of a
  host-bound path, the rest of the run being common code). ``--profile-rounds N``: N more interleaved rounds under
  a CUDA-only profiler, each run's kernels and copies summed (GPU ms a step through ``generate``).

``--law real``: every part draws from real models' laws instead (the profiles of ``bench/tournament_laws.py``,
stretched to 128,256 ids; in the decode part a forward hook puts them in place of the model's logits): the
random-init model's near-flat law makes every token cost two shared atomic adds in each histogram pass, a trained
model's about one.

    PYTHONPATH=. python3 bench/gpu_tournament.py --out DIR          (bench/gpu_tournament_h200.sh on the H200)

The GPU image has no polars: ``generate_batch`` does not use it, so a placeholder module stands in for the import.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import itertools
import json
import math
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import typer

# The GPU image lacks polars; nothing this bench runs calls it (MMW_BENCH_NO_POLARS=1 tries the stand-in elsewhere).
if importlib.util.find_spec("polars") is None or os.environ.get("MMW_BENCH_NO_POLARS"):
    class _Placeholder:  # any call or attribute of it (module-level schemas) gives another placeholder
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, *args, **kwargs):
            return _Placeholder()

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder()

    def _placeholder(name: str) -> _Placeholder:
        if name.startswith("__"):  # inspect and importlib probe dunders: say there are none
            raise AttributeError(name)
        return _Placeholder()

    _stub = types.ModuleType("polars")
    _stub.__dict__["__getattr__"] = _placeholder
    sys.modules["polars"] = _stub

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_generate import build_model  # noqa: E402
from gpu_graph import free, sync, word_tokenizer  # noqa: E402
from tournament_laws import law_bank  # noqa: E402

from numba import cuda, float64, int64  # noqa: E402,F401 (_tree_table's)

from mmw.kernels.tournament import MAX_BINS, _block_sum  # noqa: E402,F401 (_tree_table's)
from mmw.watermark import prf  # noqa: E402
from mmw.engines import generate as engine  # noqa: E402
from mmw.engines import graph_decode  # noqa: E402
from mmw.params import EngineParams  # noqa: E402
from mmw.engines.attention import grouped_query_sdpa  # noqa: E402
from mmw.watermark.processor import WatermarkProcessor, WatermarkStep, row_state, watermark_step  # noqa: E402
from mmw.watermark.samplers.base import Sampler, inverse_cdf, probabilities  # noqa: E402
from mmw.watermark.samplers.parts import TournamentPart  # noqa: E402
from mmw.watermark.samplers.tournament import Tournament, tournament_probs  # noqa: E402
from mmw.watermark.scheme import SchemeSpec  # noqa: E402

KEY = 1234
#: The table kernel's block widths the kernels part times (``mmw.kernels.tournament.TABLE_THREADS``).
TABLE_THREADS = (32, 64, 128, 256, 512, 1024)
#: The draw's scan widths it times (``PICK_THREADS``).
PICK_THREADS = (128, 256, 512)
#: The histogram's register budgets it times: blocks a multiprocessor (``HISTOGRAM_MIN_BLOCKS``; None: unbounded).
HISTOGRAM_MIN_BLOCKS = (None, 6, 8)
#: The "before" configurations run under another key: ``watermark_step`` shares one compiled step per (scheme,
#: key, ...), and the before step's sampler is swapped for the layer-by-layer law before its first call.
KEY_BEFORE = 4321
VOCAB = 128256
#: The logits the parts draw from: "gaussian" (the kernels' and step's Gaussian logits, the decode part's random-init
#: model's own, near-flat laws: two shared atomic adds a token in a histogram pass) or "real" (the profiles of real
#: models' laws in REAL_LAWS, bench/tournament_laws.py: ~1 add a token, most ids' masses 0 by the last pass).
LAW = "gaussian"
REAL_LAWS = Path(__file__).resolve().parent / "results" / "tournament" / "real_laws.npz"
#: Laws the decode part's real-law logits rotate through (each its own order of the ids).
DECODE_LAWS = 512
TOURNAMENT = dict(sampler="tournament", layers=30, randomness="window", window=4, score="sum")


class LayerByLayer(Sampler, TournamentPart):
    """The tournament as it was: its law computed layer by layer (two passes over the vocabulary a layer), and the
    processor's repeated-context rows drawn by a second, plain softmax and scan (it has no ``choose_or_plain``)."""

    def prepare(self, device):
        self.token_ids(device)

    def choose(self, logits, seeds, temperature, plain_u):
        if temperature == 0:
            return logits.argmax(dim=-1)
        hashes = prf.prf_t(seeds.unsqueeze(-1), self.token_ids(logits.device).unsqueeze(0))
        probs = tournament_probs(probabilities(logits, temperature), hashes, self.spec.layers, self.spec.leaves)
        return inverse_cdf(probs, plain_u)

    def statistic(self, tokens, seeds):
        raise NotImplementedError("generation only")


def spec() -> SchemeSpec:
    return SchemeSpec.from_params(TOURNAMENT)


class ThreeHistograms(Tournament):
    """The tournament's law in three numba histogram passes, written by the last pass and drawn by
    ``inverse_cdf`` (the code before the fused draw, ``mmw::tournament_choose``)."""

    fused_draw = False


class TorchSoftmax(Tournament):
    """The tournament as it is, in a step whose law and entropies come from torch's code (compiled by Inductor)
    instead of ``mmw::softmax_law``: ``make_before`` clears the step's ``fused_softmax``, and "before" then also
    has a plain step of its own (the same change is in every step)."""


def _tree_table(partial, width, leaves, fixed_point, tables, c, last, totals, plain, sums):
    """The table kernel as it was before the block's width became ``TABLE_THREADS`` (the "before" of
    ``--before launch``, compiled by ``tree_table_kernel``): tables[c, row] = the row's ``chunk_table`` (the sum
    over partial's segments); one block of 2^width threads a row, thread b owning bin b; each layer's G is a tree sum
    in shared memory (a fixed order). Bins from 2^width up to the table's size are set to 1. For the ``last`` chunk,
    sums[row, s] = the law's mass in segment s, a tree sum a segment of partial[row, s, b] times the table (the
    model's own mass, totals[row, s], where plain[row])."""
    red = cuda.shared.array(MAX_BINS, float64)
    row = cuda.blockIdx.x
    b = cuda.threadIdx.x
    n_bins = cuda.blockDim.x
    count = int64(0)
    for p in range(partial.shape[1]):
        count += partial[row, p, b]
    mass = float64(count) / fixed_point
    table = float64(1.0)
    for j in range(width):
        g = (b >> (width - 1 - j)) & 1
        total = _block_sum(red, mass if g else 0.0)
        if leaves == 2:
            factor = 1.0 + g - total
        else:
            miss = 1.0 - total
            if g:
                factor = (1.0 - math.pow(miss, float64(leaves))) / max(total, 2.2250738585072014e-308)
            else:
                factor = math.pow(miss, float64(leaves - 1))
        mass *= factor
        table *= factor
    tables[c, row, b] = table
    for k in range(n_bins + b, tables.shape[2], n_bins):
        tables[c, row, k] = 1.0
    if last:
        if plain[row]:
            if b == 0:
                for s in range(partial.shape[1]):
                    sums[row, s] = float64(totals[row, s]) / fixed_point
        else:
            for s in range(partial.shape[1]):
                segment = _block_sum(red, float64(partial[row, s, b]) / fixed_point * table)
                if b == 0:
                    sums[row, s] = segment


@contextlib.contextmanager
def draw_launch(**settings):
    """The fused draw launched with the attributes of ``mmw.kernels.tournament`` named in ``settings`` replaced
    (``HISTOGRAM_UNROLL``, ``HISTOGRAM_CACHED_TABLES``, ``HISTOGRAM_MIN_BLOCKS``, ``HISTOGRAM_SKIP_ZERO``,
    ``PICK_THREADS``, ``TABLE_THREADS``, or the table kernel ``_table_kernel``), the module's own after."""
    from mmw.kernels import tournament as kt

    saved = {name: getattr(kt, name) for name in settings}
    for name, value in settings.items():
        setattr(kt, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(kt, name, value)


@functools.cache
def tree_table_kernel():
    """``_tree_table`` compiled (launched with 2^width threads: 1,024 at m = 30)."""
    return cuda.jit(_tree_table)


def before_settings() -> dict:
    """The fused draw as it was before the launch work: one read in flight a histogram thread, three tables
    cached, the compiler's own register budget, the tables by one thread a bin (m = 30: 1,024) with a tree a
    segment, the segment scanned by 256 threads."""
    return dict(HISTOGRAM_UNROLL=1, HISTOGRAM_CACHED_TABLES=3, HISTOGRAM_MIN_BLOCKS=None, HISTOGRAM_SKIP_ZERO=False,
                TABLE_THREADS=1 << 10, PICK_THREADS=256, _table_kernel=tree_table_kernel())


class OneReadInFlight(Tournament):
    """The fused draw with ``before_settings()``. The settings are module globals that the numba launches read when
    a step is traced or captured, so every run of this configuration goes inside ``before_launch()``, outside any
    compiled code (a context manager inside the traced ``choose`` would have its global writes replayed by Dynamo
    after the graph, not around it)."""


class FirstPassApart(Tournament):
    """The tournament as it is, except that its draw makes its first histogram pass over the written law itself
    instead of taking it from the step's pass that writes the law (``binned_first_pass``)."""

    binned_first_pass = False


def before_launch(key: int = KEY_BEFORE):
    """The context a run under ``key`` goes in: ``before_settings()`` for the "before" key of ``--before launch``,
    else none."""
    if key == KEY_BEFORE and BEFORE is OneReadInFlight:
        return draw_launch(**before_settings())
    return contextlib.nullcontext()


#: The "before" sampler: ``--before layer`` (the layer-by-layer law), ``histogram`` (``ThreeHistograms``),
#: ``launch`` (``OneReadInFlight``), ``softmax`` (``TorchSoftmax``) or ``first`` (``FirstPassApart``).
BEFORE: type = ThreeHistograms


def make_before(step: WatermarkStep) -> None:
    """Make ``step`` (not yet called) the "before" configuration: BEFORE's sampler, or for ``TorchSoftmax`` the
    step's law and entropies from torch's code (plain steps too)."""
    if BEFORE is TorchSoftmax:
        step.fused_softmax = False
    elif step.spec is not None and type(step.sampler) is not BEFORE:
        step.sampler = BEFORE(step.spec, step.key, VOCAB)


def before_steps() -> tuple:
    """The schemes with a "before" configuration: the tournament, and plain sampling for ``--before softmax``."""
    return (spec(), None) if BEFORE is TorchSoftmax else (spec(),)


def install_before(mode: str | None) -> None:
    """Make the shared steps the processor will fetch under KEY_BEFORE the "before" configurations (same call as
    the processor's: ``watermark_step``'s cache keys on how it is called)."""
    for scheme in before_steps():
        if mode is None:
            step = watermark_step(scheme, KEY_BEFORE, VOCAB, 1.0, True, dynamic=False)
        else:
            step = watermark_step(scheme, KEY_BEFORE, VOCAB, 1.0, True, mode, dynamic=False)
        make_before(step)


@functools.cache
def _real_profiles():
    import numpy as np

    with np.load(REAL_LAWS) as stored:
        return stored["knots"], stored["values"].astype(np.float32)


def real_logits(rows: int, seed: int, dtype: torch.dtype = torch.float32, device: str = "cuda",
                vocab: int = VOCAB) -> torch.Tensor:
    """``rows`` logits rows [rows, vocab]: real models' laws (REAL_LAWS), each its own order of ids."""
    knots, values = _real_profiles()
    return law_bank(knots, values, rows, vocab, seed=seed, device=device, dtype=dtype)


def law_logits(batch: int, scale: float | None, seed: int) -> torch.Tensor:
    """float32 [batch, VOCAB] logits: Gaussian of ``scale`` (None: the bench's law, LAW: scale 3 or real laws)."""
    if scale is None and LAW == "real":
        return real_logits(batch, seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(batch, VOCAB, device="cuda", generator=gen) * (3.0 if scale is None else scale)


#: Gaussian logit scales on which the kernels and step parts compare tokens (flat to peaked laws).
AGREEMENT_SCALES = (1.0, 3.0, 8.0)


def law_name(scale: float | None) -> str:
    return "real laws" if scale is None else f"logit scale {scale}"


def replay_real_laws(model, batch: int):
    """A forward hook that replaces the model's logits with real laws' (``real_logits``: DECODE_LAWS of them in the
    model's dtype, ~DECODE_LAWS x 0.26 MB), the law of a row at a step picked by the row, its last input token and
    its position (no state: the same inside a captured CUDA graph); the model's own forward still runs, so every
    configuration pays it. Returns the hook's handle."""
    bank = real_logits(DECODE_LAWS, 11, model.dtype, model.device, model.config.vocab_size)
    rows = torch.arange(batch, device=model.device)

    def hook(module, args, kwargs, output):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        where = kwargs.get("position_ids")
        where = kwargs.get("cache_position") if where is None else where
        step = 0 if where is None else where.reshape(-1, where.shape[-1])[:, -1]  # [B] or [1]
        pick = (ids[:, -1] * 7919 + rows[: ids.shape[0]] * 131 + step * 104729) % DECODE_LAWS
        output.logits = bank.index_select(0, pick).unsqueeze(1).expand(-1, output.logits.shape[1], -1)
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


def step_inputs(batch: int, scale: float | None, seed: int) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scores = law_logits(batch, scale, seed)
    context = torch.randint(0, VOCAB, (batch, 4), device="cuda", generator=gen)
    steps = torch.randint(0, 512, (batch,), device="cuda", generator=gen)
    state = {k: v.cuda() for k, v in row_state(spec(), list(range(batch))).items()}
    return scores, context, steps, state


def time_calls(step: WatermarkStep, batch: int, calls: int) -> float:
    """Median GPU ms of one call of the step on fresh-looking inputs (the step index advances every call)."""
    scores, context, steps, state = step_inputs(batch, None, 1)
    history = step.new_history(batch, "cuda")
    ms = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(scores, context, steps, **state, history=history)
        end.record()
        steps += 1
        ms.append((start, end))
    sync()
    return statistics.median(s.elapsed_time(e) for s, e in ms)


def kernel_part(batch: int, result: dict) -> None:
    """The numba passes alone, each captured in a CUDA graph (no host time): GPU ms a replay, median of 20; the
    whole draw before (three histogram passes with 64-bit shared atomics, torch's tables, the law written, then
    ``inverse_cdf``) and after (``mmw::tournament_choose``) on the same inputs, with their tokens compared; beside a
    copy of the float64 probabilities."""
    from mmw.kernels import tournament as kt
    from mmw.watermark.samplers import tournament as st
    from mmw.watermark.samplers.tournament import CHUNK_BITS, FIXED_POINT

    gen = torch.Generator(device="cuda").manual_seed(5)
    probs = torch.softmax(law_logits(batch, None, 5).double(), -1)
    seeds = torch.randint(-2**62, 2**62, (batch,), device="cuda", generator=gen)
    tables = torch.rand(3, batch, 1 << CHUNK_BITS, device="cuda", generator=gen, dtype=torch.float64) + 0.5
    u = torch.rand(batch, device="cuda", generator=gen, dtype=torch.float64)
    plain = torch.zeros(batch, dtype=torch.bool, device="cuda")
    partial = torch.empty(batch, kt.PARTS, 1 << CHUNK_BITS, dtype=torch.int64, device="cuda")
    totals = torch.empty(batch, kt.PARTS, dtype=torch.int64, device="cuda")
    sums = torch.empty(batch, kt.PARTS, dtype=torch.float64, device="cuda")
    out = torch.empty(batch, dtype=torch.int64, device="cuda")
    dev = kt._device_array
    p, s_, t_, pa, to, su, o, uu = (dev(x) for x in (probs, seeds, tables, partial, totals, sums, out, u))
    pl = dev(plain.to(torch.uint8))

    def stream():
        return kt._launch_stream(probs)

    def timed(fn) -> float:
        fn()
        sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        ms = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            ms.append((start, end))
        sync()
        return statistics.median(s.elapsed_time(e) for s, e in ms)

    def before_draw():
        hist = lambda tabs, start, width: st.cuda_histogram(  # noqa: E731
            probs, seeds, torch.stack(tabs) if tabs else probs.new_ones(1, batch, 1 << CHUNK_BITS), len(tabs),
            CHUNK_BITS, start, width)
        tabs = st.chunk_tables(probs, 30, 2, hist)
        law = st.cuda_apply(probs, seeds, torch.stack(tabs), CHUNK_BITS, CHUNK_BITS)
        return st.inverse_cdf(law, u)

    variants = {
        "histogram cas64, 0 tables": lambda: kt.histogram(probs, seeds, tables, 0, CHUNK_BITS, 0, 10, FIXED_POINT),
        "histogram cas64, 2 tables": lambda: kt.histogram(probs, seeds, tables, 2, CHUNK_BITS, 20, 10, FIXED_POINT),
        **{f"histogram split32, {n} tables, {unroll} reads in flight, {blocks} blocks": functools.partial(
            lambda n, unroll, blocks: kt.histogram32_kernel(unroll, 2, blocks)[
                (kt.PARTS, batch), kt.THREADS, stream()](p, s_, t_, n, CHUNK_BITS, 10 * n, 10, FIXED_POINT, pa, to),
            n, unroll, blocks)
           for n in (0, 2) for unroll in (1, 2, 4) for blocks in HISTOGRAM_MIN_BLOCKS},
        **{f"histogram split32, {n} tables, 4 reads in flight, None blocks, zeros skipped": functools.partial(
            lambda n: kt.histogram32_kernel(4, 2, None, True)[
                (kt.PARTS, batch), kt.THREADS, stream()](p, s_, t_, n, CHUNK_BITS, 10 * n, 10, FIXED_POINT, pa, to),
            n)
           for n in (0, 2)},
        "table kernel before (a thread a bin, a tree a segment)": lambda: tree_table_kernel()[batch, 1024, stream()](
            pa, 10, 2, FIXED_POINT, t_, 1, False, to, pl, su),
        "table kernel before, last (segment masses)": lambda: tree_table_kernel()[batch, 1024, stream()](
            pa, 10, 2, FIXED_POINT, t_, 2, True, to, pl, su),
        **{f"table kernel, {threads} threads{last}": functools.partial(
            lambda threads, last: kt._table_kernel[batch, threads, stream()](
                pa, 10, 2, FIXED_POINT, t_, 2 if last else 1, bool(last), to, pl, su), threads, last)
           for threads in TABLE_THREADS for last in ("", ", last (segment masses)")},
        "torch chunk_table": lambda: st.chunk_table(partial.sum(1), 10, 2),
        "apply, 3 tables": lambda: kt.apply_tables(probs, seeds, tables, CHUNK_BITS, CHUNK_BITS),
        "inverse_cdf of a law": lambda: st.inverse_cdf(probs, u),
        **{f"pick, 3 tables, {threads} threads x 8": functools.partial(
            lambda threads: kt.pick_kernel(threads, 8)[batch, threads, stream()](
                p, s_, t_, 3, CHUNK_BITS, CHUNK_BITS, pl, su, uu, o), threads)
           for threads in PICK_THREADS},  # 1,024 x 8: too many registers
        "draw before (3 cas64 passes, torch tables, apply, inverse_cdf)": before_draw,
        "draw after (mmw::tournament_choose)": lambda: st.cuda_choose(probs, seeds, u, plain, 30, 2),
        "softmax float32 -> float64 (the plain step's)": lambda: torch.softmax(probs.float().double(), -1),
        "copy of the float64 probabilities": lambda: probs.clone(),
    }
    times = {}
    for name, fn in variants.items():
        try:
            times[name] = timed(fn)
        except Exception as error:  # noqa: BLE001 (a setting the card or numba refuses: say so, time the rest)
            print(f"kernels: {name}: {error!r}", flush=True)
            continue
        print(f"kernels: {name:72s} {times[name]:.3f} ms", flush=True)
    resources = {}  # registers a thread and static shared bytes a block, per compiled kernel
    for name, kernel in [*(((f"histogram split32, {u} reads in flight, {b} blocks"), kt.histogram32_kernel(u, 2, b))
                           for u in (1, 2, 4) for b in HISTOGRAM_MIN_BLOCKS),
                         ("table kernel", kt._table_kernel), ("table kernel before", tree_table_kernel()),
                         *((f"pick, {threads} threads x 8", kt.pick_kernel(threads, 8)) for threads in PICK_THREADS)]:
        try:
            resources[name] = dict(registers=min(kernel.get_regs_per_thread().values()),
                                   shared_bytes=min(kernel.get_shared_mem_per_block().values()))
        except Exception as error:  # noqa: BLE001 (a numba version without the query: say so, go on)
            resources[name] = dict(error=repr(error))
        print(f"kernels: resources of {name}: {resources[name]}", flush=True)
    # the table kernels of a draw at m = 30: two plain, one last
    table_ms = {threads: 2 * times[f"table kernel, {threads} threads"]
                + times[f"table kernel, {threads} threads, last (segment masses)"] for threads in TABLE_THREADS
                if f"table kernel, {threads} threads, last (segment masses)" in times
                and f"table kernel, {threads} threads" in times}
    table_threads = min(table_ms, key=table_ms.get)
    print(f"kernels: a draw's table kernels: {table_ms}; fastest at {table_threads} threads", flush=True)
    for parts in (4, 16, 32):  # the whole draw at other segment counts
        kt.PARTS = parts
        times[f"draw after, {parts} segments a row"] = timed(lambda: st.cuda_choose(probs, seeds, u, plain, 30, 2))
        print(f"kernels: draw after, {parts} segments a row {times[list(times)[-1]]:.3f} ms", flush=True)
    kt.PARTS = 8
    with draw_launch(**before_settings()):
        times["draw before (--before launch)"] = timed(lambda: st.cuda_choose(probs, seeds, u, plain, 30, 2))
    print(f"kernels: draw before (--before launch) {times['draw before (--before launch)']:.3f} ms", flush=True)
    launches = []  # the whole draw at each setting
    for unroll, blocks, skip in itertools.product((1, 2, 4), HISTOGRAM_MIN_BLOCKS, (False, True)):
        settings = dict(HISTOGRAM_UNROLL=unroll, HISTOGRAM_CACHED_TABLES=2, HISTOGRAM_MIN_BLOCKS=blocks,
                        HISTOGRAM_SKIP_ZERO=skip, PICK_THREADS=256, TABLE_THREADS=table_threads)
        name = (f"draw after, {unroll} reads in flight, {blocks} blocks, tables of {table_threads}"
                + (", zeros skipped" if skip else ""))
        try:
            with draw_launch(**settings):
                times[name] = timed(lambda: st.cuda_choose(probs, seeds, u, plain, 30, 2))
        except Exception as error:  # noqa: BLE001
            print(f"kernels: {name}: {error!r}", flush=True)
            continue
        launches.append((times[name], settings))
        print(f"kernels: {name} {times[name]:.3f} ms", flush=True)
    result["fastest_launch"] = min(launches, key=lambda entry: entry[0])[1]
    # the same sums, and the same tokens, before and after
    a = kt.histogram(probs, seeds, tables, 2, CHUNK_BITS, 20, 10, FIXED_POINT)
    kt.histogram32_kernel(kt.HISTOGRAM_UNROLL, 2, kt.HISTOGRAM_MIN_BLOCKS)[(kt.PARTS, batch), kt.THREADS, stream()](
        p, s_, t_, 2, CHUNK_BITS, 20, 10, FIXED_POINT, pa, to)
    same_hist = bool(torch.equal(a, partial.sum(1)))
    agree = {}
    for scale in AGREEMENT_SCALES + ((None,) if LAW == "real" else ()):
        same = 0
        for k in range(4):
            g = torch.Generator(device="cuda").manual_seed(50 + k)
            pr = torch.softmax(law_logits(batch, scale, 50 + k).double(), -1)
            uk = torch.rand(batch, device="cuda", generator=g, dtype=torch.float64)
            rows_plain = torch.rand(batch, device="cuda", generator=g) < 0.25
            law = st.tournament_probs_chunked(pr, prf.prf_t(seeds.unsqueeze(-1), torch.arange(
                VOCAB, device="cuda").unsqueeze(0)), 30, 2)
            ref = st.inverse_cdf(torch.where(rows_plain.unsqueeze(-1), pr, law), uk)
            same += int((st.cuda_choose(pr, seeds, uk, rows_plain, 30, 2) == ref).sum())
        agree[law_name(scale)] = dict(same=same, total=4 * batch)
    print(f"kernels: split32 histogram equals cas64: {same_hist}; tokens of the fused draw vs inverse_cdf of the "
          f"chunked law (torch, a quarter of the rows plain): {agree}", flush=True)
    result["kernels"] = dict(batch=batch, vocab=VOCAB, ms=times, histogram_equal=same_hist, tokens_agree=agree,
                             resources=resources)


def step_part(batch: int, calls: int, rounds: int, out: Path | None, result: dict) -> None:
    steps = {"plain": watermark_step(None, KEY, VOCAB, 1.0, True, dynamic=False),
             "tournament before": watermark_step(spec(), KEY_BEFORE, VOCAB, 1.0, True, dynamic=False),
             "tournament after": watermark_step(spec(), KEY, VOCAB, 1.0, True, dynamic=False)}
    if BEFORE is TorchSoftmax:
        steps["plain before"] = watermark_step(None, KEY_BEFORE, VOCAB, 1.0, True, dynamic=False)
    install_before(None)
    for name, step in steps.items():  # warm-up: compilation, CUDA-graph recording
        t0 = time.perf_counter()
        with before_launch(step.key):
            time_calls(step, batch, 3)
        print(f"step warm-up {name}: {time.perf_counter() - t0:.1f} s, compiled={step.is_compiled} "
              f"{step.compile_error or ''}", flush=True)
    per_round = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            with before_launch(step.key):
                per_round[name].append(time_calls(step, batch, calls))
    rows = {}
    for name, ms in per_round.items():
        extra = [m - p for m, p in zip(ms, per_round["plain"])]
        rows[name] = dict(ms_rounds=ms, ms_median=statistics.median(ms), extra_ms_rounds=extra)
        print(f"step {name:20s} GPU ms/call by round {[round(m, 3) for m in ms]}, over plain "
              f"{[round(e, 3) for e in extra]}", flush=True)

    # The tokens: the compiled chunked step against the layer-by-layer law run eagerly, same key and inputs.
    reference = WatermarkStep(spec(), KEY, VOCAB, 1.0, compiled=False)
    reference.sampler = LayerByLayer(spec(), KEY, VOCAB)
    agree = {}
    for scale in AGREEMENT_SCALES + ((None,) if LAW == "real" else ()):
        same = total = 0
        for seed in range(4):
            scores, context, steps_, state = step_inputs(batch, scale, 100 + seed)
            # Fresh histories: no seed of these inputs was seen before, so every row is drawn by the tournament.
            a = steps["tournament after"](scores, context, steps_.clone(), **state,
                                          history=reference.new_history(batch, "cuda"))[0]
            b = reference(scores, context, steps_.clone(), **state, history=reference.new_history(batch, "cuda"))[0]
            same += int((a == b).sum())
            total += batch
        agree[law_name(scale)] = dict(same=same, total=total)
        print(f"tokens after vs layer-by-layer (eager), {law_name(scale)}: {same}/{total} equal", flush=True)
    # Half the rows with a repeated context (their seed already in the history): drawn plainly on both sides.
    scores, context, steps_, state = step_inputs(batch, None, 200)
    steps_ += 1  # slot 0 counts as written
    histories = [reference.new_history(batch, "cuda") for _ in range(2)]
    seeds = reference.seeds(context, steps_, state["shift"])
    for history in histories:
        history[: batch // 2, 0] = seeds[: batch // 2]
    a = steps["tournament after"](scores, context, steps_.clone(), **state, history=histories[0])[0]
    b = reference(scores, context, steps_.clone(), **state, history=histories[1])[0]
    same = int((a == b).sum())
    agree["half the rows repeated"] = dict(same=same, total=batch)
    print(f"tokens after vs layer-by-layer (eager), half the rows repeated: {same}/{batch} equal", flush=True)

    # Where the time goes: kernels and host syncs of one step each, compiled without CUDA graphs.
    tables = {}
    profiled = (("plain", False), ("tournament before", True), ("tournament after", False))
    for name, before in profiled + ((("plain before", True),) if BEFORE is TorchSoftmax else ()):
        step = WatermarkStep(None if name.startswith("plain") else spec(), KEY, VOCAB, 1.0, compiled=True,
                             mode="default")
        if before:
            make_before(step)
        scores, context, steps_, state = step_inputs(batch, None, 7)
        with before_launch(KEY_BEFORE if before else KEY):
            time_calls(step, batch, 3)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    step(scores, context, steps_, **state, history=step.new_history(batch, "cuda"))
                sync()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
        tables[name] = table
        if out is not None:
            (out / f"profile_{name.replace(' ', '_')}.txt").write_text(table)
        print(f"\nprofile, {name} (3 calls):\n" + "\n".join(table.splitlines()[:16]), flush=True)
    result["step"] = dict(batch=batch, vocab=VOCAB, calls=calls, rows=rows, tokens_agree=agree)


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values``: the order statistics of 0-based ranks k and
    n-1-k, with k the largest rank whose binomial(n, 1/2) tail P(B <= k) is at most (1 - level) / 2, so the
    interval holds the median with probability >= level (no normal assumption about host-bound walls). With too
    few values for any such k, the range. Written out because the GPU image has no scipy (binom.ppf there)."""
    xs = sorted(values)
    n = len(xs)
    tail, k = 0.0, -1
    while True:
        tail += math.comb(n, k + 1) / 2**n
        if tail > (1 - level) / 2:
            break
        k += 1
    k = max(k, 0)
    return xs[k], xs[n - 1 - k]


class HostTimers:
    """Host seconds spent inside the calls that differ between the ``generate`` configurations, accumulated per
    run with ``time.perf_counter`` (no device sync): mmw's processor call (``WatermarkProcessor.__call__``) and
    transformers' own choice of the token (``softmax`` + ``multinomial`` when sampling, ``argmax`` when greedy).
    Everything else in a run (generate's loop, the forward's ~1,500 launches) is the same code on both sides.
    Also ``wait``: the seconds in generate's per-step check for unfinished rows (``_has_unfinished_sequences``),
    where the host waits for the device to finish the step: on a host-bound path, the part of the choice's GPU time
    that the host's own work after it did not cover."""

    NAMES = ("processor", "softmax", "multinomial", "argmax")
    WAIT = "wait"

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.NAMES + (self.WAIT,), 0.0)
        self._saved: list = []

    def _wrap(self, owner, attr: str, name: str) -> None:
        fn = getattr(owner, attr)
        seconds = self.seconds

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - t0

        self._saved.append((owner, attr, fn))
        setattr(owner, attr, timed)

    def __enter__(self) -> "HostTimers":
        self._wrap(WatermarkProcessor, "__call__", "processor")
        self._wrap(torch.nn.functional, "softmax", "softmax")
        self._wrap(torch, "multinomial", "multinomial")
        self._wrap(torch, "argmax", "argmax")
        from transformers.generation.utils import GenerationMixin

        self._wrap(GenerationMixin, "_has_unfinished_sequences", self.WAIT)
        return self

    def __exit__(self, *exc) -> None:
        for owner, attr, fn in reversed(self._saved):
            setattr(owner, attr, fn)
        self._saved.clear()


def decode_part(batch: int, new_tokens: int, rounds: int, result: dict, only: str = "",
                profile_rounds: int = 0, host_rounds: int = 0) -> None:
    model, cfg = build_model(32, 4096, "cuda", "llama3-8b")
    if LAW == "real":  # the model's forward runs as ever; its logits give way to real laws'
        replay_real_laws(model, batch)
    tok = word_tokenizer(cfg.vocab_size)
    torch.manual_seed(batch)
    ids = torch.randint(3, cfg.vocab_size, (batch, 64))
    prompts = ids.tolist()
    install_before(None)
    install_before("default")

    def run(static: bool, scheme: SchemeSpec | None, key: int, hf_plain: bool = False) -> tuple[float, float]:
        settings = EngineParams(static_decode=static, graph_decode=True)  # params engine:
        if hf_plain:  # transformers' own sampling, no processor, in generate_batch's own generate call
            batch_ids = ids.cuda()
            config = engine.neutral_generation_config(tok, model, new_tokens)
            config.cache_implementation = engine.CACHE_IMPLEMENTATION
            config.disable_compile = not engine.COMPILE_DECODING
            config.do_sample, config.top_k, config.top_p, config.temperature = True, 0, 1.0, 1.0
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            with torch.inference_mode(), engine.neutral_model_defaults(model), grouped_query_sdpa(model):
                model.generate(input_ids=batch_ids, attention_mask=torch.ones_like(batch_ids),
                               generation_config=config)
            sync()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            free(model)
            return wall, cpu
        proc = WatermarkProcessor(scheme, key, cfg.vocab_size, list(range(batch)), 1.0)
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        with before_launch(key):
            engine.generate_batch(model, tok, prompts, proc, new_tokens, settings)
        sync()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        free(model)
        return wall, cpu

    configs = {
        "graph loop: mmw plain": (True, None, KEY),
        "graph loop: tournament before": (True, spec(), KEY_BEFORE),
        "graph loop: tournament after": (True, spec(), KEY),
        "generate: HF plain sampling": (False, None, KEY, True),
        "generate: mmw plain": (False, None, KEY),
        "generate: tournament before": (False, spec(), KEY_BEFORE),
        "generate: tournament after": (False, spec(), KEY),
    }
    if BEFORE is TorchSoftmax:  # plain sampling changes too: its "before" beside each path's
        configs = {**{"graph loop: mmw plain before": (True, None, KEY_BEFORE)}, **configs}
        configs["generate: mmw plain before"] = (False, None, KEY_BEFORE)
    if only:  # one path's after configurations and that path's baseline: more rounds in the same time
        path = {"graph": "graph loop", "generate": "generate"}[only]
        configs = {n: a for n, a in configs.items() if n.split(":")[0] == path and "before" not in n}
    walls, cpus = {}, {}
    for name, args in configs.items():
        t0 = time.perf_counter()
        run(*args)
        print(f"decode warm-up {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        walls[name], cpus[name] = [], []
    gpu_ms = {}
    for r in range(rounds):
        for name, args in configs.items():
            timed = name.startswith("graph loop")
            graph_decode.STEP_EVENTS = [] if timed else None
            # transformers' generate is host-bound at this batch: a collection pause inside a timed run moves its
            # wall by whole steps, so the collector runs between runs, never inside one.
            gc.collect()
            gc.disable()
            try:
                wall, cpu = run(*args)
            finally:
                gc.enable()
            walls[name].append(wall)
            cpus[name].append(cpu)
            if timed:
                sync()
                ms = [s.elapsed_time(e) for s, e in graph_decode.STEP_EVENTS[4:]]
                gpu_ms.setdefault(name, []).append(statistics.median(ms))
            graph_decode.STEP_EVENTS = None
        print(f"round {r}: " + ", ".join(f"{n} {w[-1]:.3f} s (CPU {cpus[n][-1]:.3f} s)" for n, w in walls.items()),
              flush=True)
    # GPU time through a path with no events of its own (generate): every kernel's and copy's duration on the
    # device, summed from a CUDA-only profiler trace of one whole run, in further interleaved rounds (the trace's
    # host cost moves the wall, not the kernels' durations).
    # Host seconds inside the calls that differ (HostTimers), per run, in further interleaved rounds: within a run
    # they drift with the run's own pace, so "the rest" of a run (same code on every side) cancels.
    host = {}
    for r in range(host_rounds):
        for name, args in configs.items():
            gc.collect()
            gc.disable()
            try:
                with HostTimers() as timers:
                    wall, cpu = run(*args)
            finally:
                gc.enable()
            host.setdefault(name, []).append(dict(wall_s=wall, cpu_s=cpu, **timers.seconds))
        print(f"host round {r}: " + ", ".join(
            f"{n} {v[-1]['wall_s']:.3f} s, in the calls " + "/".join(f"{1e3 * v[-1][k] / new_tokens:.3f}"
                                                                      for k in HostTimers.NAMES + (HostTimers.WAIT,))
            + " ms/step"
            for n, v in host.items()), flush=True)
    kernel_ms = {}
    for r in range(profile_rounds):
        for name, args in configs.items():
            gc.collect()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                run(*args)
            kernel_ms.setdefault(name, []).append(device_ms(prof))
        print(f"profiled round {r}: " + ", ".join(f"{n} {v[-1] / new_tokens:.3f} GPU ms/step"
                                                  for n, v in kernel_ms.items()), flush=True)
    baselines = {"graph loop": "graph loop: mmw plain", "generate": "generate: HF plain sampling"}
    rows = {}
    for name, w in walls.items():
        base_name = baselines[name.split(":")[0]]
        base = walls[base_name]
        ratios = [b / x for b, x in zip(base, w)]
        lo, hi = median_interval(ratios)
        cpu_ratios = [b / x for b, x in zip(cpus[base_name], cpus[name])]
        clo, chi = median_interval(cpu_ratios)
        rows[name] = dict(walls_s=w, wall_median_s=statistics.median(w), ratio_rounds=ratios,
                          ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                          ratio_median_ci95=[lo, hi],
                          step_ms_median=1e3 * statistics.median(w) / new_tokens,
                          gpu_ms_per_step_rounds=gpu_ms.get(name),
                          cpu_s=cpus[name], cpu_median_s=statistics.median(cpus[name]),
                          cpu_ratio_rounds=cpu_ratios, cpu_ratio_median=statistics.median(cpu_ratios),
                          cpu_ratio_min=min(cpu_ratios), cpu_ratio_max=max(cpu_ratios),
                          cpu_ratio_median_ci95=[clo, chi])
        if name in kernel_ms:
            kr = [b / x for b, x in zip(kernel_ms[base_name], kernel_ms[name])]
            rows[name].update(kernel_ms_runs=kernel_ms[name],
                              kernel_ms_per_step_median=statistics.median(kernel_ms[name]) / new_tokens,
                              kernel_ratio_rounds=kr, kernel_ratio_median=statistics.median(kr))
        if name in host:
            # The run's wall with the baseline's own choice of the token put in place of this run's calls that
            # differ, over the run's wall: the ratio a host-bound path gives, with the rest of the run common.
            differ = [sum(h[k] for k in HostTimers.NAMES) for h in host[name]]
            base_differ = [sum(h[k] for k in HostTimers.NAMES) for h in host[base_name]]
            est = [(h["wall_s"] - d + bd) / h["wall_s"] for h, d, bd in zip(host[name], differ, base_differ)]
            rows[name].update(host_runs=host[name], host_differ_ms_per_step=[1e3 * d / new_tokens for d in differ],
                              host_ratio_rounds=est, host_ratio_median=statistics.median(est),
                              host_ratio_min=min(est), host_ratio_max=max(est))
            # The same with the wait for the device too: the run's wall with the baseline's calls and the baseline's
            # wait in place of its own (the rest of the run, common code, as this run's host paced it).
            w, bw = ([h[HostTimers.WAIT] for h in host[n]] for n in (name, base_name))
            est_wait = [(h["wall_s"] - d - x + bd + bx) / h["wall_s"]
                        for h, d, x, bd, bx in zip(host[name], differ, w, base_differ, bw)]
            rows[name].update(host_wait_ms_per_step=[1e3 * x / new_tokens for x in w],
                              host_wait_ratio_rounds=est_wait, host_wait_ratio_median=statistics.median(est_wait),
                              host_wait_ratio_min=min(est_wait), host_wait_ratio_max=max(est_wait))
    result["decode"] = dict(batch=batch, new_tokens=new_tokens, prompt_len=64, rounds=rounds, rows=rows)
    print(f"\nB={batch}, {new_tokens} new tokens, {rounds} interleaved rounds; ratio = baseline wall / wall, "
          "same round")
    for name, row in rows.items():
        gpu = row["gpu_ms_per_step_rounds"]
        print(f"{name:32s} wall {row['wall_median_s']:6.3f} s  x{row['ratio_median']:.3f} "
              f"[{row['ratio_min']:.3f}, {row['ratio_max']:.3f}] median CI95 [{row['ratio_median_ci95'][0]:.3f}, "
              f"{row['ratio_median_ci95'][1]:.3f}]  {row['step_ms_median']:6.2f} ms/step"
              + (f"  GPU {statistics.median(gpu):6.2f} ms/step {[round(g, 2) for g in gpu]}" if gpu else "")
              + f"\n{'':32s} CPU {row['cpu_median_s']:6.3f} s  x{row['cpu_ratio_median']:.3f} "
              f"[{row['cpu_ratio_min']:.3f}, {row['cpu_ratio_max']:.3f}] median CI95 "
              f"[{row['cpu_ratio_median_ci95'][0]:.3f}, {row['cpu_ratio_median_ci95'][1]:.3f}]"
              + (f"  kernels {row['kernel_ms_per_step_median']:6.3f} GPU ms/step x{row['kernel_ratio_median']:.4f} "
                 f"{[round(k, 4) for k in row['kernel_ratio_rounds']]}"
                 if "kernel_ms_runs" in row else "")
              + (f"\n{'':32s} host: the calls that differ {statistics.median(row['host_differ_ms_per_step']):.3f} "
                 f"ms/step; wall with the baseline's calls instead x{row['host_ratio_median']:.4f} "
                 f"[{row['host_ratio_min']:.4f}, {row['host_ratio_max']:.4f}]; the wait for the device "
                 f"{statistics.median(row['host_wait_ms_per_step']):.3f} ms/step; with the baseline's calls and "
                 f"wait instead x{row['host_wait_ratio_median']:.4f} [{row['host_wait_ratio_min']:.4f}, "
                 f"{row['host_wait_ratio_max']:.4f}]" if "host_runs" in row else ""),
              flush=True)


def device_ms(prof) -> float:
    """Milliseconds of device activity (kernels, copies, sets) in a CUDA-only profiler trace, summed from the raw
    Kineto events (no parse into function events, which takes minutes for a run's ~10^5 kernels)."""
    cuda = torch.autograd.DeviceType.CUDA
    return sum(e.duration_ns() for e in prof.profiler.kineto_results.events() if e.device_type() == cuda) / 1e6


def softmax_launch(setting: str) -> None:
    """``THREADS,PARTS`` (MMW_BENCH_SOFTMAX, e.g. the fastest launch bench/gpu_softmax.py timed): the step's softmax
    kernels (``mmw.kernels.softmax``) launched with those widths; empty: the module's own."""
    if setting:
        from mmw.kernels import softmax as ks

        ks.THREADS, ks.PARTS = (int(v) for v in setting.split(","))
        print(f"softmax launch: {ks.THREADS} threads, {ks.PARTS} blocks a row", flush=True)


def main(out: str = "", parts: str = "kernels,step,decode", batch: int = 296, new_tokens: int = 128, rounds: int = 3,
         calls: int = 30, before: str = "histogram", decode_only: str = "", profile_rounds: int = 0,
         host_rounds: int = 0, tune_launch: bool = False, law: str = "gaussian") -> None:
    """``--decode-only graph|generate``: the decode part's configurations on that path only, after sampler only
    (with that path's baseline), for more rounds in the same time. ``--before softmax``: "before" is every step
    (plain ones too) with its law and entropies from torch's code instead of ``mmw::softmax_law``. ``--before
    first``: "before" is the tournament's draw making its first histogram pass itself (``FirstPassApart``).
    ``--before launch``: "before" is the fused draw
    as it was before its launch work (``before_settings``: one read in flight a histogram thread, 1,024-thread
    table kernels with a tree a segment), "after" the module's settings and kernels. ``--tune-launch`` (with the
    kernels part): the parts after it launch the draw with the settings of the fastest whole draw the kernels part
    timed, so one call measures ``--before launch --parts kernels,decode`` against the best setting.
    ``--law real``: every part draws from real models' laws (REAL_LAWS) instead of Gaussian logits and the
    random-init model's near-flat laws (``LAW``)."""
    global BEFORE, LAW
    softmax_launch(os.environ.get("MMW_BENCH_SOFTMAX", ""))
    if law not in ("gaussian", "real"):
        raise typer.BadParameter(f"unknown {law!r}; allowed: gaussian, real", param_hint="--law")
    if law == "real" and not REAL_LAWS.is_file():
        raise typer.BadParameter(f"{REAL_LAWS} is missing: run bench/tournament_laws.py", param_hint="--law")
    LAW = law
    befores = {"layer": LayerByLayer, "histogram": ThreeHistograms, "launch": OneReadInFlight,
               "softmax": TorchSoftmax, "first": FirstPassApart}
    if before not in befores:
        raise typer.BadParameter(f"unknown {before!r}; allowed: {', '.join(befores)}", param_hint="--before")
    BEFORE = befores[before]
    if decode_only not in ("", "graph", "generate"):
        raise typer.BadParameter(f"unknown {decode_only!r}; allowed: graph, generate", param_hint="--decode-only")
    unknown = set(parts.split(",")) - {"kernels", "step", "decode"}
    if unknown:
        raise typer.BadParameter(f"unknown part(s) {sorted(unknown)}; allowed: kernels, step, decode",
                                 param_hint="--parts")
    if tune_launch and "kernels" not in parts:
        raise typer.BadParameter("needs the kernels part, which times the launches", param_hint="--tune-launch")
    out_dir = Path(out) if out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    import transformers

    result: dict = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, before=before, law=law,
                        transformers=transformers.__version__, date=time.strftime("%F %T"))

    def save() -> None:
        if out_dir is not None:
            tmp = out_dir / "gpu_tournament.json.tmp"
            tmp.write_text(json.dumps(result, indent=1))
            tmp.replace(out_dir / "gpu_tournament.json")

    if "kernels" in parts:
        kernel_part(batch, result)
        save()
        if tune_launch:  # what follows launches the draw as the fastest whole draw above was launched
            from mmw.kernels import tournament as kt

            for name, value in result["fastest_launch"].items():
                setattr(kt, name, value)
            print(f"launch settings from here on: {result['fastest_launch']}", flush=True)
    if "step" in parts:
        step_part(batch, calls, rounds, out_dir, result)
        save()
    if "decode" in parts:
        decode_part(batch, new_tokens, rounds, result, decode_only, profile_rounds, host_rounds)
        save()


if __name__ == "__main__":
    typer.run(main)
