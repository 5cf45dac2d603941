"""One decoding step's attention, kernel by kernel: time, run-to-run repeatability and error, at the full-scale
decode shape (Llama-3-8B: 32 query heads over 8 K/V heads of 128; 296 rows; a static cache of 1,087 positions of
which ``written`` hold tokens, left padding of 0-15 positions a row).

Kernels:
  cudnn         SDPA with ``enable_gqa`` and the boolean mask, cuDNN only (what SDPA picks on Hopper);
  efficient     the stage's: query heads folded into each group's queries, SDPA's memory-efficient kernel
                (``mmw.engines.attention.decode_attention``) over the whole cache;
  efficient-cut the same over the written positions rounded up to 128 (``graph_decode.KEY_BUCKET = 128``);
  flex          ``flex_attention`` compiled (its split-K decoding kernel), GQA, a block mask whose blocks all read
                the boolean mask: the whole cache;
  flex-cut      the same block mask with only the written blocks listed (unwritten blocks are never read).
``--sweep NAME,...`` (or ``all``) adds ``flex-cut`` under the ``kernel_options`` and block sizes of ``SWEEP``
(``set_flex_options`` / ``mmw.engines.attention.FLEX_BLOCK`` set per setting, so the stage's own
``decode_blocks``/``flex_decode`` run), one row ``flex-cut[NAME]`` each; the options Inductor chose for each compile
(``SPLIT_KV``, ``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages``) are recorded under ``chosen``.
Each kernel runs ``--repeats`` times on the same inputs: "rows differing" counts rows whose output is not bit-equal
to the first run's; "max error" is against float32 math attention; "rows vs stage" counts rows that differ from the
stage's ``flex-cut`` (same inputs). Times, per layer call, after warm-up: ``ms`` the CUDA-event median of
``--timed`` single calls (host launch gaps included, as earlier tables measured), ``graph_ms`` the median over
``--timed`` event pairs of 10 replays of a CUDA graph holding one call (as the captured decode step runs it);
``gbps`` the K/V bytes the listed blocks hold (positions read x 2 x 128 x 2 bytes x 8 heads x rows) over
``graph_ms``; x 32 layers x 1,024 steps gives a generation's attention time.

    PYTHONPATH=.:bench python3 bench/gpu_decode_kernels.py --out DIR
    PYTHONPATH=.:bench python3 bench/gpu_decode_kernels.py --only flex-cut --sweep all --out DIR
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch
import typer

B, H, HKV, D, L = 296, 32, 8, 128, 1087
BLOCK = 128  # mmw.engines.attention.FLEX_BLOCK
#: flex-cut settings of ``--sweep``: name -> (block mask's block size, kernel_options). torch 2.11 on an H200 picks
#: SPLIT_KV = max(1, 2 x SMs // (rows x K/V heads)) = 1 at 296 x 8, BLOCK_M 16 (4 query heads of a group x 4 padding
#: rows), and for head dim 128 in bf16 BLOCK_N 64, 1 stage, 2 warps (its Hopper branch of 3 stages is overwritten).
SWEEP = {
    "default": (128, {}),
    "st3": (128, {"num_stages": 3}),
    "st4": (128, {"num_stages": 4}),
    "w4st3": (128, {"num_warps": 4, "num_stages": 3}),
    "n128w4st2": (128, {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2}),
    "s2": (128, {"SPLIT_KV": 2}),
    "s2st3": (128, {"SPLIT_KV": 2, "num_stages": 3}),
    "s4st3": (128, {"SPLIT_KV": 4, "num_stages": 3}),
    "b64": (64, {}),
    "b64st3": (64, {"num_stages": 3}),
    "b64s2st3": (64, {"SPLIT_KV": 2, "num_stages": 3}),
    "tma": (128, {"USE_TMA": True}),
    # Around the stage's setting (4 warps, 3 stages; mmw.engines.attention.FLEX_DECODE_OPTIONS on Hopper):
    "w4st2": (128, {"num_warps": 4, "num_stages": 2}),
    "w4st4": (128, {"num_warps": 4, "num_stages": 4}),
    "w8st3": (128, {"num_warps": 8, "num_stages": 3}),
    "b64w4st3": (64, {"num_warps": 4, "num_stages": 3}),
    "s2w4st3": (128, {"SPLIT_KV": 2, "num_warps": 4, "num_stages": 3}),
    "n32w4st3": (128, {"BLOCK_N": 32, "num_warps": 4, "num_stages": 3}),
}
#: The kernel_options ``set_flex_options`` installed last ({}: torch's own choice).
FLEX_OPTIONS: dict = {}


def set_flex_options(options: dict) -> None:
    """Make the stage's ``attention.flex_decode`` pass ``options`` as flex_attention's ``kernel_options`` on this
    card ({}: torch's own choice), through the stage's own table ``attention.FLEX_DECODE_OPTIONS``."""
    from mmw.engines import attention

    FLEX_OPTIONS.clear()
    FLEX_OPTIONS.update(options)
    attention.FLEX_DECODE_OPTIONS = {torch.cuda.get_device_capability(): dict(options)}


CHOSEN_KEYS = ("SPLIT_KV", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "USE_TMA", "GQA_SHARED_HEADS")


def inputs(written: int, device: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cpu").manual_seed(written)
    q = torch.randn(B, H, 1, D, generator=gen).to(device, torch.bfloat16)
    k = torch.randn(B, HKV, L, D, generator=gen).to(device, torch.bfloat16)
    v = torch.randn(B, HKV, L, D, generator=gen).to(device, torch.bfloat16)
    pad = torch.randint(0, 16, (B,), generator=gen).to(device)
    pos = torch.arange(L, device=device)
    valid = (pos[None, :] >= pad[:, None]) & (pos[None, :] < written)
    return q, k, v, valid


def reference(q, k, v, valid) -> torch.Tensor:
    """float32 math attention, [B, H, 1, D]."""
    g = H // HKV
    kf = k.float().repeat_interleave(g, dim=1)
    vf = v.float().repeat_interleave(g, dim=1)
    scores = (q.float() @ kf.transpose(-1, -2)) / D ** 0.5
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    return torch.softmax(scores, -1) @ vf


def kernels(written: int):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mmw.engines import attention

    nblocks = -(-L // BLOCK)
    cut = -(-written // BLOCK) * BLOCK

    def cudnn(q, k, v, valid):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :],
                                                                    enable_gqa=True)

    def efficient(q, k, v, valid):
        return attention.decode_attention(None, q, k, v, valid[:, None, None, :], None)[0].transpose(1, 2)

    def efficient_cut(q, k, v, valid):
        window = attention.DecodeWindow(key_limit=cut)
        return attention.decode_attention(None, q, k, v, valid[:, None, None, :], None, window)[0].transpose(1, 2)

    masks = {}

    def flex_with(listed: int):
        """The stage's flex path (``attention.decode_blocks`` + ``attention.flex_decode``), ``listed`` blocks read."""
        def run(q, k, v, valid):
            key = (listed, valid.data_ptr())
            if key not in masks:
                masks[key] = attention.decode_blocks(valid, torch.full((B, 1, 1), listed, dtype=torch.int32,
                                                                       device=valid.device))
            return attention.flex_decode(q, k, v, masks[key], None)
        return run

    def flex_setting(name: str):
        """``flex-cut`` under ``SWEEP[name]``: the written blocks of that size listed, those kernel_options."""
        block, options = SWEEP[name]

        def run(q, k, v, valid):
            saved, saved_options, saved_table = attention.FLEX_BLOCK, dict(FLEX_OPTIONS), attention.FLEX_DECODE_OPTIONS
            attention.FLEX_BLOCK = block
            set_flex_options(options)
            try:
                key = (name, valid.data_ptr())
                if key not in masks:
                    listed = torch.full((B, 1, 1), -(-written // block), dtype=torch.int32, device=valid.device)
                    masks[key] = attention.decode_blocks(valid, listed)
                CHOOSING[0] = name
                return attention.flex_decode(q, k, v, masks[key], None)
            finally:  # the stage's own table back (``flex-cut`` runs the stage's choice)
                attention.FLEX_BLOCK = saved
                FLEX_OPTIONS.clear()
                FLEX_OPTIONS.update(saved_options)
                attention.FLEX_DECODE_OPTIONS = saved_table
        run.read_positions = min(-(-written // block) * block, L)
        return run

    found = {"cudnn": cudnn, "efficient": efficient, "efficient-cut": efficient_cut,
             "flex": flex_with(nblocks), "flex-cut": flex_with(-(-written // BLOCK))}
    found["flex"].read_positions = L
    found["flex-cut"].read_positions = min(cut, L)
    for name in SWEEP_NAMES:
        found[f"flex-cut[{name}]"] = flex_setting(name)
    return found


SWEEP_NAMES: list[str] = []
#: The sweep setting being compiled, and the options Inductor's flex decoding lowering chose for each.
CHOOSING: list[str] = [""]
CHOSEN: dict[str, list[dict]] = {}


def record_choices() -> None:
    """Record the template options of every flex decoding compile under the current setting's name (torch's
    private lowering; nothing is recorded if its names moved)."""
    try:
        from torch._inductor.kernel.flex import flex_decoding
    except ImportError:
        return
    template = flex_decoding.flex_decoding_template
    original = template.maybe_append_choice

    def recording(*args, **kwargs):
        CHOSEN.setdefault(CHOOSING[0] or "stage", []).append(
            {k: (v if isinstance(v, (int, float, bool, str)) else str(v)) for k, v in kwargs.items()
             if k in CHOSEN_KEYS})
        return original(*args, **kwargs)

    template.maybe_append_choice = recording


def graph_time(fn, args, timed: int) -> tuple[float, torch.Tensor]:
    """Median ms of one call replayed from a CUDA graph (event pairs around 10 replays), and the graph's output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(timed):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 10)
    return statistics.median(times), out


def main(writtens: str = "192,576,1087", repeats: int = 20, timed: int = 30, only: str = "", sweep: str = "",
         out: str = "") -> None:
    SWEEP_NAMES[:] = list(SWEEP) if sweep == "all" else [n for n in sweep.split(",") if n]
    record_choices()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "shape": {"rows": B, "heads": H, "kv_heads": HKV, "head_dim": D, "cache": L}, "kernels": {},
              "sweep": {n: {"block": SWEEP[n][0], "kernel_options": SWEEP[n][1]} for n in SWEEP_NAMES},
              "chosen": CHOSEN}

    def save() -> None:
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "gpu_decode_kernels.json").write_text(json.dumps(result, indent=1))

    for written in [int(w) for w in writtens.split(",")]:
        q, k, v, valid = inputs(written, "cuda")
        ref = reference(q, k, v, valid)
        stage = None
        for name, fn in kernels(written).items():
            if only and name not in only.split(",") and not name.startswith("flex-cut["):
                continue
            try:
                CHOOSING[0] = ""
                first = fn(q, k, v, valid)
                torch.cuda.synchronize()
                differing = 0
                for _ in range(repeats):
                    again = fn(q, k, v, valid)
                    differing = max(differing, int((again != first).flatten(1).any(1).sum()))
                times = []
                for _ in range(timed):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn(q, k, v, valid)
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e))
                graph_ms, replayed = graph_time(fn, (q, k, v, valid), timed)
                differing = max(differing, int((replayed != first).flatten(1).any(1).sum()))
                if name == "flex-cut":
                    stage = first
                positions = getattr(fn, "read_positions", None)
                row = {"ms": round(statistics.median(times), 4), "graph_ms": round(graph_ms, 4),
                       "rows_differing": differing, "max_error": float((first.float() - ref).abs().max()),
                       "rows_vs_stage": None if stage is None else int((first != stage).flatten(1).any(1).sum()),
                       "read_positions": positions,
                       "gbps": None if positions is None else round(B * HKV * positions * D * 2 * 2 / graph_ms / 1e6),
                       "generation_s_at_this_length": round(graph_ms * 32 * 1024 / 1000, 2)}
            except Exception as err:  # a kernel the installed torch cannot run is a result, not a crash
                row = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            result["kernels"].setdefault(name, {})[written] = row
            print(f"written {written:5d}  {name:22s} {row}", flush=True)
            save()
    print(f"\n{'kernel':24s} " + " ".join(f"{w:>26s}" for w in writtens.split(",")))
    for name, rows in result["kernels"].items():
        cells = [("error" if "error" in r else f"{r['graph_ms']:.3f} ({r['ms']:.3f}) d{r['rows_differing']} "
                  f"{r['gbps']}") for r in rows.values()]
        print(f"{name:24s} " + " ".join(f"{c:>26s}" for c in cells))
    print("chosen:", json.dumps(CHOSEN))
    save()


if __name__ == "__main__":
    typer.run(main)
