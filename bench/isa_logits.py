"""Does the float32 CPU path change a model's logits? One forward pass of a random-initialised SmolLM2-shaped model
(seeded, so every machine builds the same weights), run in a child process per environment: the default dispatch,
and with torch's own kernels and MKL pinned to AVX2 (``ATEN_CPU_CAPABILITY``, ``MKL_CBWR``, ``ONEDNN_MAX_CPU_ISA``).
Prints each environment's logits digest and the largest difference from the default: the same digest on two
machines means the same numeric path for this model.

    nice -n 15 .venv/bin/python bench/isa_logits.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

ENVIRONMENTS = {
    "default": {},
    "aten avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "mkl cbwr avx2": {"MKL_CBWR": "AVX2"},
    "all pinned avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}

CHILD = """
import hashlib, json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
model = LlamaForCausalLM(config).eval()
ids = torch.randint(0, config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    logits = model(ids).logits.float()
torch.save(logits, sys.argv[1])
print(json.dumps({"digest": hashlib.md5(logits.numpy().tobytes()).hexdigest(),
                  "capability": torch.backends.cpu.get_cpu_capability()}))
"""


def main() -> None:
    reference = None
    import torch

    for index, (name, extra) in enumerate(ENVIRONMENTS.items()):
        path = f"/tmp/isa_logits_{os.getpid()}_{index}.pt"
        done = subprocess.run([sys.executable, "-c", CHILD, path], env={**os.environ, **extra}, capture_output=True,
                              text=True, check=True)
        info = json.loads(done.stdout.strip().splitlines()[-1])
        logits = torch.load(path)
        os.remove(path)
        if reference is None:
            reference = logits
        diff = (logits - reference).abs().max().item()
        flips = (logits.argmax(-1) != reference.argmax(-1)).sum().item()
        print(f"{name:<16} capability={info['capability']:<8} md5={info['digest']} max|diff|={diff:.3g} "
              f"argmax flips={flips}/{logits.shape[0] * logits.shape[1]}")


if __name__ == "__main__":
    main()
