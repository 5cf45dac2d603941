"""Is GPU generation bit-reproducible? The same batch generated again and again, in one process and across
processes, under the stage's decode paths, on a random-init Llama-3-8B shape (bf16).

Variants (each ``--repeats`` times in this process, same prompts, seeds and key):
  graph        the stage's default on CUDA: our decode loop captured as one CUDA graph, the watermark step compiled;
  graph-eager  the same loop captured, the watermark step eager (``engine.compile_step: false``);
  loop         our decode loop without the graph (``engine.graph_decode: false``), the step compiled (by default in
               ``reduce-overhead`` mode: its own CUDA graphs);
  eager        no CUDA graph anywhere: the loop and the step eager (both false).
``--sdpa`` restricts the attention to one of torch's SDPA backends for the whole process.
Prints and writes one SHA-256 per variant and repeat over every row's tokens; run the script in two processes
(optionally with ``--deterministic``: ``torch.use_deterministic_algorithms`` and a fixed cuBLAS workspace) and
compare the digests across the files.

    PYTHONPATH=.:bench python3 bench/gpu_repeat.py --label A --out DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch
import typer
from gpu_generate import build_model  # bench/ is run as scripts, not a package
from gpu_graph import word_tokenizer

from mmw.watermark import processor as processors
from mmw.engines import generate as engine
from mmw.engines import graph_decode
from mmw.params import EngineParams
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

KEY = 1234
C4 = dict(sampler="distribution_shift", randomness="window", window=1, delta=5.0, score="sum")
#: params engine.graph_decode / engine.compile_step of each variant.
VARIANTS = {"graph": {"graph_decode": True, "compile_step": True},
            "graph-eager": {"graph_decode": True, "compile_step": False},
            "loop": {"graph_decode": False, "compile_step": True},
            "eager": {"graph_decode": False, "compile_step": False}}


def stand_in_batch(rows: int, smoke: bool):
    """The determinism benches' workload: (model, config, tokenizer, prompts, C4 spec). A random-init Llama-3-8B
    shape in bf16 on CUDA (``smoke``: a 2-layer one on the CPU, decoded through the static loop there too), and
    ``rows`` prompts of 48-64 random tokens, the same in every process."""
    device = "cpu" if smoke else "cuda"
    if smoke:
        engine.CACHE_DEVICES = ("cpu", "cuda")
    model, cfg = build_model(2 if smoke else 32, 64 if smoke else 4096, device, "llama3-8b")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(48, 65, (rows,), generator=gen)]
    return model, cfg, word_tokenizer(cfg.vocab_size), prompts, SchemeSpec.from_params(C4)


def main(label: str = "A", rows: int = 296, new_tokens: int = 128, repeats: int = 3, deterministic: bool = False,
         variants: str = ",".join(VARIANTS), sdpa: str = typer.Option("", help="restrict SDPA to one backend: "
                                                                        "cudnn | efficient | flash | math"),
         decode: str = typer.Option("efficient", help="a decoding step's attention (engine.decode_attention): "
                                    "efficient (the stage's) | sdpa (SDPA's own GQA kernel, cuDNN on Hopper)"),
         key_bucket: int = typer.Option(0, help="bound the decoding attention's reads to the written cache positions "
                                            "rounded up to this many (graph_decode.KEY_BUCKET; 0: the whole cache)"),
         between: int = typer.Option(0, help="between two repeats, generate this many of the prompts with half the "
                                        "new tokens (another batch and cache shape): the repeats must not depend "
                                        "on what the process ran before"),
         flex_dynamic: bool = typer.Option(False, help="compile flex_decode for dynamic shapes (attention.FLEX_DYNAMIC)"),
         smoke: bool = False, out: str = "") -> None:
    graph_decode.KEY_BUCKET = key_bucket or None
    from mmw.engines import attention
    attention.FLEX_DYNAMIC = flex_dynamic
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    model, cfg, tok, prompts, spec = stand_in_batch(rows, smoke)
    result = {"label": label, "deterministic": deterministic, "rows": rows, "new_tokens": new_tokens,
              "gpu": torch.cuda.get_device_name() if not smoke else "cpu", "torch": torch.__version__,
              "decode": decode, "key_bucket": key_bucket, "between": between, "flex_dynamic": flex_dynamic,
              "digests": {}, "seconds": {}}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    if sdpa:
        # for the whole process; kept in a name: a generator context left unreferenced is collected at once and
        # restores the previous backends on exit (which is what an earlier version of this line did)
        restriction = sdpa_kernel([backends[sdpa]])
        restriction.__enter__()
        result["sdpa"] = sdpa
    for name in variants.split(","):
        settings = EngineParams(decode_attention=decode, **VARIANTS[name])
        compiled = None if settings.compile_step else False
        processors.watermark_step.cache_clear()
        digests, seconds = [], []
        for repeat in range(repeats):
            if between and repeat:
                other = WatermarkProcessor(spec, KEY, cfg.vocab_size, list(range(between)), 1.0, compiled)
                engine.generate_batch(model, tok, prompts[:between], other, max(new_tokens // 2, 1), settings)
                if hasattr(model, "_cache"):
                    del model._cache
            proc = WatermarkProcessor(spec, KEY, cfg.vocab_size, list(range(rows)), 1.0, compiled)
            t0 = time.perf_counter()
            cols = engine.generate_batch(model, tok, prompts, proc, new_tokens, settings)
            digests.append(hashlib.sha256(json.dumps(cols["tokens"]).encode()).hexdigest()[:16])
            if hasattr(model, "_cache"):
                del model._cache
            seconds.append(round(time.perf_counter() - t0, 2))
            print(label, name, digests[-1], f"{seconds[-1]:.1f} s", flush=True)
        result["digests"][name] = digests
        result["seconds"][name] = seconds
    print(json.dumps(result), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"gpu_repeat_{label}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
