"""One decode for the configurations of a pack (mmw.sweep.decode, PackedExecutor.decode).

A configuration's rows from a stacked decode are its rows from a decode of its own: same tokens, same order, the
recorded entropies equal up to float rounding (a stacked batch has more rows, and a CPU GEMM blocks by rows); with
one configuration a decode the tables are identical. Fast tests use the tiny random Llama of test_engine with the
real watermark processor; the heavy test runs the pack's decode on the embedded generator against each
configuration's own ``generate watermarked`` stage.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from test_engine import tiny, tiny_chats, tiny_model  # noqa: F401 - fixtures

from mmw.sweep import decode as shared_decode
from mmw.engines.generate import generate
from mmw.sweep.decode import StackedProcessor, generate_together
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

SCHEMES = [(SchemeSpec(sampler="distribution_shift", randomness="window", window=1, score="sum", delta=2.5, gamma=0.5),
            11),
           (SchemeSpec(sampler="distribution_shift", randomness="window", window=1, score="sum", delta=5.0, gamma=0.5),
            22),
           (SchemeSpec(sampler="exponential", randomness="window", window=3, score="sum"), 33),
           (SchemeSpec(sampler="binary", randomness="fixed", key_length=4, score="align", skip_prob=0.05), 44)]


def factories(vocab: int, temperature: float = 1.0) -> list:
    return [(lambda s, k: (lambda seeds: WatermarkProcessor(s, k, vocab, seeds, temperature, compiled=False)))(s, k)
            for s, k in SCHEMES]


@pytest.mark.parametrize("batch_size,decode_rows", [(4, 16), (4, 9), (6, 100), (2, 1)])
def test_each_configuration_gets_the_rows_of_its_own_decode(tiny, batch_size: int, decode_rows: int) -> None:
    tokenizer, model = tiny
    chats, ids = tiny_chats(6)  # 2..11 words: left padding inside every batch
    made = factories(len(tokenizer))
    alone = [generate(model, tokenizer, chats, f, 12, batch_size, prompt_ids=ids, seed=5, progress=False)
             for f in made]
    together = generate_together(model, tokenizer, chats, made, 12, batch_size, decode_rows, prompt_ids=ids, seed=5)
    assert len(together) == len(SCHEMES)
    for own, stacked in zip(alone, together, strict=True):
        assert stacked.columns == own.columns and stacked["prompt_id"].to_list() == ids
        assert stacked["tokens"].to_list() == own["tokens"].to_list()
        assert stacked["text"].to_list() == own["text"].to_list()
        for column in ("mean_entropy", "mean_spike_entropy"):
            np.testing.assert_allclose(stacked[column].to_numpy(), own[column].to_numpy(), rtol=1e-5)
        if decode_rows < batch_size * 2:  # one configuration per decode: the very same batches
            assert stacked.equals(own)
    # The configurations' keys and schemes are their own: no two get the same texts.
    texts = [str(t["tokens"].to_list()) for t in together]
    assert len(set(texts)) == len(texts)


def test_no_decode_holds_more_rows_than_the_cap_or_one_batch(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer, model = tiny
    chats, ids = tiny_chats(5)
    sizes: list[int] = []
    real = shared_decode.generate_batch

    def spy(model_, tokenizer_, input_ids, processor, max_new_tokens, settings=None):
        sizes.append(len(input_ids))
        return real(model_, tokenizer_, input_ids, processor, max_new_tokens, settings)

    monkeypatch.setattr(shared_decode, "generate_batch", spy)
    generate_together(model, tokenizer, chats, factories(len(tokenizer)), 4, 2, 5, prompt_ids=ids)
    # Batches of 2, 2 and 1 rows; the four configurations go 5 // 2 = 2 to a decode: 2 groups x 3 batches, where
    # one configuration at a time would make 12 decodes.
    assert sizes == [4, 4, 2, 4, 4, 2]


def test_a_stacked_processor_refuses_a_batch_of_other_rows_and_bad_settings(tiny) -> None:
    tokenizer, model = tiny
    vocab = len(tokenizer)
    parts = [f([1, 2]) for f in factories(vocab)[:2]]
    stacked = StackedProcessor(parts, [2, 2])
    scores = torch.randn(3, vocab)
    with pytest.raises(ValueError, match="3 rows but the parts own 4"):
        stacked(torch.zeros(3, 4, dtype=torch.long), scores)
    with pytest.raises(ValueError, match="one row count per processor"):
        StackedProcessor(parts, [4])
    chats, ids = tiny_chats(2)
    with pytest.raises(ValueError, match="decode_rows"):
        generate_together(model, tokenizer, chats, factories(vocab), 4, 2, 0, prompt_ids=ids)
    with pytest.raises(ValueError, match="prompt_ids"):
        generate_together(model, tokenizer, chats, factories(vocab), 4, 2, 4, prompt_ids=["a", "a"])


def test_a_stacked_step_is_each_parts_own_step() -> None:
    """Each part sees only its rows: the chosen tokens and recorded entropies of the stacked call are the parts'
    calls on their slices, in order."""
    vocab = 50
    torch.manual_seed(3)
    scores, input_ids = torch.randn(5, vocab), torch.randint(0, vocab, (5, 7))
    made = factories(vocab)
    alone = [made[0]([1, 2, 3]), made[2]([4, 5])]
    expected = torch.cat([alone[0](input_ids[:3], scores[:3]), alone[1](input_ids[3:], scores[3:])])
    stacked = StackedProcessor([made[0]([1, 2, 3]), made[2]([4, 5])], [3, 2])
    assert torch.equal(stacked(input_ids, scores), expected)
    lengths = [1, 1, 0, 1, 1]
    np.testing.assert_array_equal(stacked.mean_entropy(lengths), np.concatenate(
        [alone[0].mean_entropy(lengths[:3]), alone[1].mean_entropy(lengths[3:])]))


@pytest.mark.heavy
def test_a_packs_one_decode_gives_each_configuration_its_stages_generations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the embedded generator: the pack's decode of three configurations (two in one decode, the third in a
    second: ``decode_rows`` 6 over 3 prompts) writes what each configuration's own ``generate watermarked`` stage
    writes with its key — the same tokens and texts — and leaves out a configuration whose params are invalid."""
    from pipeline_repo import REPO, tiny_board

    from mmw.engines.models import shared_loads
    from mmw.io import GENERATIONS, PROMPTS, read_table
    from mmw.stages import generate as generate_stage
    from mmw.stages import prompts as prompts_stage
    from mmw.sweep.definition import apply_overrides
    from mmw.sweep.pack import PackedExecutor
    from mmw.sweep.runner import Job

    board = tiny_board()
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(board, sort_keys=False))
    jobs = [Job("a", "a", {"scheme.delta": 2.5}, env={"MMW_KEY": "decode-key-a-0123456789"}),
            Job("b", "b", {"scheme.sampler": "exponential", "scheme.delta": None, "scheme.gamma": None,
                           "scheme.window": 3}, env={"MMW_KEY": "decode-key-b-0123456789"}),
            Job("c", "c", {"scheme.delta": -1.0}, env={"MMW_KEY": "decode-key-c-0123456789"}),
            Job("d", "d", {"scheme.delta": 5.0}, env={"MMW_KEY": "decode-key-d-0123456789"})]
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "params.yaml").write_text(yaml.safe_dump(board, sort_keys=False))
    cwd = Path.cwd()
    monkeypatch.delenv("MMW_KEY", raising=False)
    with shared_loads():
        os.chdir(shared)
        try:
            shutil.copytree(REPO / "data" / "tasks", shared / "data" / "tasks")
            prompts_stage.run(Path("params.yaml"))
        finally:
            os.chdir(cwd)
        executor = PackedExecutor(tmp_path, pack=0, echo=lambda _: None, board=board, decode_rows=6)
        root = tmp_path / "root"
        root.mkdir()
        decoded = executor.decode(jobs, root, shared)
        assert sorted(decoded) == [0, 1, 3]  # c's delta is invalid: its own stage will say so
        assert not list(root.glob("*.yaml"))  # the params files it validated are gone
        for index in decoded:
            job = jobs[index]
            own = tmp_path / f"own-{job.name}"
            own.mkdir()
            (own / "params.yaml").write_text(yaml.safe_dump(apply_overrides(board, job.overrides), sort_keys=False))
            (own / PROMPTS).parent.mkdir(parents=True)
            shutil.copy(shared / PROMPTS, own / PROMPTS)
            os.chdir(own)
            monkeypatch.setenv("MMW_KEY", job.env["MMW_KEY"])
            try:
                generate_stage.run("watermarked", Path("params.yaml"))
            finally:
                os.chdir(cwd)
                monkeypatch.delenv("MMW_KEY")
            expected = read_table(own / GENERATIONS["watermarked"])
            got = read_table(decoded[index])
            assert got.columns == expected.columns and got.height == expected.height == 3
            assert got.drop("mean_entropy", "mean_spike_entropy").equals(
                expected.drop("mean_entropy", "mean_spike_entropy")), job.name
            np.testing.assert_allclose(got["mean_entropy"].to_numpy(), expected["mean_entropy"].to_numpy(),
                                       rtol=1e-5)
    assert len({str(read_table(p)["tokens"].to_list()) for p in decoded.values()}) == 3
    for path in decoded.values():
        assert not any(k.encode() in path.read_bytes() for k in (j.env["MMW_KEY"] for j in jobs))
