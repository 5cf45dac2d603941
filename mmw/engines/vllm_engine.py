"""The vLLM engine (``model.engine: vllm``): every prompt as one vLLM request, watermarked inside vLLM.

The watermark runs as a vLLM V1 logits processor (``mmw.engines.vllm_processor``) calling the same
``WatermarkStep`` as the transformers engine, with the same per-row seeds (``row_seed(seed, prompt_id)``): the
detector works unchanged, and baseline and watermarked runs differ only by the watermark. vLLM's own sampling is
sampling from the processor's output, which has one finite logit (so it returns the processor's choice).

vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here whatever the caller's environment says): the
processor then lives in this process and hands over the per-token entropies it recorded (with a separate engine
process the entropy columns would be null, an output an environment variable would decide). Resumable like the transformers engine: chunks of prompts are stored as parts first.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import polars as pl

from mmw import provenance
from mmw.engines.generate import GENERATION_SCHEMA, parts_dir_of, row_seed
from mmw.engines.models import default_cache_dir, resolve_dtype, resolve_source, vllm_enforce_eager
from mmw.errors import SpecError
from mmw.io import PartsStore, plan_units, row_key, write_table
from mmw.watermark.scheme import SchemeSpec

ENGINES = ("transformers", "vllm")
INSTALL_HINT = ("install vllm into this environment (CUDA machine: pip install vllm; CPU: bash scripts/setup-vllm.sh "
                "and run with .venv-vllm/bin/python), or set model.engine: transformers")


def require_vllm() -> None:
    """Fail in milliseconds, before any model is loaded, when ``model.engine: vllm`` cannot run here."""
    if importlib.util.find_spec("vllm") is None:
        raise SpecError("model.engine", f"'vllm' is not installed: {INSTALL_HINT}", ENGINES)


def model_folder(name: str) -> str:
    """A folder or hub id vLLM can load: embedded GGUF models become a cached HF folder (as for transformers)."""
    return resolve_source(name, default_cache_dir())


class VllmGenerator:
    """One vLLM engine for a model; ``generate_table`` runs a generation stage on it."""

    def __init__(self, name: str, device: str = "auto", dtype: str = "auto", max_model_len: int | None = None,
                 max_num_seqs: int = 256, key: int | None = None):
        """``max_num_seqs``: requests decoded together (the params' ``model.batch_size``); ``max_model_len``
        None = the model's own context length."""
        require_vllm()
        from mmw.engines import vllm_processor

        # The key reaches the processor through the environment, never through a (loggable) request.
        if key is not None:
            os.environ[vllm_processor.KEY_ENV] = str(key)
        else:
            os.environ.pop(vllm_processor.KEY_ENV, None)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: the entropies come back (docstring)
        import torch
        from transformers import AutoConfig, AutoTokenizer
        from vllm import LLM

        on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache; vLLM's default takes 4+
        folder = model_folder(name)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        config = AutoConfig.from_pretrained(folder)
        # Same rule as mmw.stages.common.generator_vocab_size: ids the tokenizer can also produce.
        self.vocab_size = min(len(self.tokenizer), int(config.vocab_size))
        self.eos_ids = {i for i in (self.tokenizer.eos_token_id,) if i is not None}
        try:
            from transformers import GenerationConfig

            eos = GenerationConfig.from_pretrained(folder).eos_token_id
            self.eos_ids |= set([eos] if isinstance(eos, int) else (eos or []))
        except OSError:
            pass
        vllm_dtype = dtype if dtype != "auto" else ("float32" if on_cpu else "bfloat16")
        if dtype == "fast":  # vLLM has no "fast": load_model's rule, as a dtype name
            vllm_dtype = str(resolve_dtype(dtype, torch.device("cpu" if on_cpu else "cuda"))).removeprefix("torch.")
        self.name, self.dtype = name, vllm_dtype
        self.llm = LLM(model=folder, tokenizer=folder, dtype=vllm_dtype, seed=0, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, logits_processors=[vllm_processor.WatermarkLogitsProcessor],
                       enable_prefix_caching=False, enforce_eager=vllm_enforce_eager(device))
        provenance.note(name, vllm_dtype, f"vllm on {'cpu' if on_cpu else 'cuda'}")

    def generate_ids(self, prompts: list[list[int]], seeds: list[int], spec: SchemeSpec | None, temperature: float,
                     max_new_tokens: int, n: int = 1) -> list[list[dict]]:
        """Generate for tokenized prompts, request i with row seed ``seeds[i]``. Returns per prompt a list of
        ``n`` completions {tokens (up to the first EOS, excluded), mean_entropy, mean_spike_entropy}."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from mmw.engines import vllm_processor

        args = vllm_processor.request_args(spec, self.vocab_size, temperature)
        # vLLM samples from the processor's output, which has one finite logit: any temperature returns it.
        # Not 0: vLLM refuses n > 1 with greedy sampling.
        params = [SamplingParams(temperature=1.0, max_tokens=max_new_tokens, seed=seed, n=n, extra_args=args,
                                 detokenize=False, stop_token_ids=sorted(self.eos_ids)) for seed in seeds]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    use_tqdm=False)
        entropies: dict[tuple[int, int], tuple[float, float]] = {}
        for proc in list(vllm_processor.ACTIVE):
            entropies.update(proc.take_entropies())
        results = []
        for seed, output in zip(seeds, outputs, strict=True):
            rows = []
            # vLLM gives child i of an n > 1 request the seed ``seed + i`` (its processor row seed too).
            for index, completion in enumerate(sorted(output.outputs, key=lambda c: c.index)):
                tokens = list(completion.token_ids)
                end = next((j for j, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
                tokens = tokens[:end]
                recorded = [entropies.get((seed + index, step)) for step in range(len(tokens))]
                known = [r for r in recorded if r is not None]
                mean = (lambda k: sum(r[k] for r in known) / len(known)) if known and len(known) == len(tokens) \
                    else None
                rows.append({"tokens": tokens, "mean_entropy": mean(0) if mean else None,
                             "mean_spike_entropy": mean(1) if mean else None})
            results.append(rows)
        return results

    def generate_table(self, prompts: pl.DataFrame, out_path: Path, spec: SchemeSpec | None, temperature: float,
                       max_new_tokens: int, seed: int, fingerprint: str, chunk: int = 512) -> pl.DataFrame:
        """Same contract as ``mmw.engines.generate.generate_table`` (columns, order, atomic write, resumable by
        chunks of ``chunk`` prompts stored under ``<out_path>.parts``)."""
        out_path = Path(out_path)
        parts_dir = parts_dir_of(out_path)
        full = "\x00".join(["vllm", self.name, self.dtype, str(max_new_tokens), str(seed), fingerprint])
        ids, chats = prompts["prompt_id"].to_list(), prompts["chat"].to_list()
        keys = [row_key(full, pid, chat) for pid, chat in zip(ids, chats, strict=True)]

        def finite(v: float | None, n: int) -> float | None:
            return v if v is not None and n > 0 and math.isfinite(v) else None

        def run_chunk(rows: list[int]) -> pl.DataFrame:
            encoded = self.tokenizer([chats[i] for i in rows], add_special_tokens=False)["input_ids"]
            outs = self.generate_ids(encoded, [row_seed(seed, ids[i]) for i in rows], spec, temperature,
                                     max_new_tokens)
            first = [o[0] for o in outs]
            tokens = [o["tokens"] for o in first]
            return pl.DataFrame({
                "prompt_id": [ids[i] for i in rows],
                "text": self.tokenizer.batch_decode(tokens, skip_special_tokens=True),
                "tokens": tokens, "n_tokens": [len(t) for t in tokens],
                "mean_entropy": [finite(o["mean_entropy"], len(o["tokens"])) for o in first],
                "mean_spike_entropy": [finite(o["mean_spike_entropy"], len(o["tokens"])) for o in first]},
                schema=GENERATION_SCHEMA)

        # Chunks in prompt order, planned over every prompt: a resumed run sends vLLM the same request sets.
        store = PartsStore(parts_dir, GENERATION_SCHEMA, "chunks")
        ordered = store.run(keys, plan_units(range(len(keys)), chunk), run_chunk)
        table = prompts.select("prompt_id", "task", "prompt").join(
            ordered.select(list(GENERATION_SCHEMA)), on="prompt_id", how="left", maintain_order="left")
        write_table(table, out_path)
        store.clear()
        return table
