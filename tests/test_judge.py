"""The judge: grade parsing, the expected-value grade distribution (checked against a brute-force computation
without cache, padding or batching), and, with the embedded model, discrimination of coherent vs broken text."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import typer
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from typer.testing import CliRunner

from judge_reference import single_pass_node_logits
from mmw.errors import SpecError
from mmw.judge.judge import (
    MAX_GRADE,
    MODES,
    Judge,
    digit_start_mask,
    grade_trie,
    judge_discrimination,
    paired_discrimination,
    parse_grade,
    shuffle_words,
)

ROOT = Path(__file__).resolve().parent.parent

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = "Grade : Prompt Response system user assistant the a story cat sat . , book report good bad".split()


@pytest.mark.parametrize(
    ("reply", "grade"),
    [
        ("85", 85.0),
        ("Grade: 72/100. Well written.", 72.0),
        ("I would give it 7.5 out of 10", 75.0),
        ("8/10", 80.0),
        ("The response deserves 100.", 100.0),
        ("0", 0.0),
        ("Score: 64.5", 64.5),
        ("no number here", None),
        ("", None),
        ("150", None),  # the first number is out of range: no grade, not a clipped one
        ("-5 points", None),
        ("11/10", None),
        ("GPT4 says 90", 90.0),  # digits inside a word are not a grade
    ],
)
def test_parse_grade(reply, grade):
    assert parse_grade(reply) == grade


def word_tokenizer(vocab_words: list[str], digits_split: bool) -> PreTrainedTokenizerFast:
    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials + vocab_words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    splitters = [pre_tokenizers.Whitespace()]
    if digits_split:
        splitters.append(pre_tokenizers.Digits(individual_digits=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(splitters)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.padding_side = "left"
    tokenizer.chat_template = CHATML
    return tokenizer


class RecordedLogs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def tiny_judge(digits_split: bool) -> Judge:
    numbers = [str(d) for d in range(10)] if digits_split else [str(n) for n in range(MAX_GRADE + 1)]
    tokenizer = word_tokenizer(WORDS + numbers, digits_split)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        initializer_range=0.3,  # peaky attention, so a wrong position or mask changes the output
    )
    return Judge(tokenizer, LlamaForCausalLM(config).eval(), batch_size=2)


def test_grade_trie_for_digit_and_whole_number_tokenizers():
    digits = grade_trie(word_tokenizer(WORDS + [str(d) for d in range(10)], digits_split=True))
    assert [len(p) for p in digits.paths] == [1] * 10 + [2] * 90 + [3]
    # Inner nodes: the first digits that can go on ("1".."9") and "10" (which can become 100).
    assert len(digits.inner) == 10 and all(len(node) == 1 for node in digits.inner[:9])
    assert digits.inner[9] == digits.paths[10]
    whole = grade_trie(word_tokenizer(WORDS + [str(n) for n in range(101)], digits_split=False))
    assert all(len(p) == 1 for p in whole.paths) and whole.inner == ()


@pytest.mark.parametrize("words", [["7up", "a1", "12", " 3", "x", "", "٣"], WORDS + [str(d) for d in range(10)]])
def test_digit_mask_marks_the_tokens_whose_text_starts_with_a_digit(words):
    """The mask from one batched decode is the one decoding each id alone gives (the transformers call it replaced),
    and is False for ids past the tokenizer (a model's padded vocabulary)."""
    tokenizer = word_tokenizer(words, digits_split=False)
    mask = digit_start_mask(tokenizer, len(tokenizer) + 5)
    one_by_one = [bool(text) and text[0].isdigit() for text in (tokenizer.decode([i]) for i in range(len(tokenizer)))]
    assert mask.tolist() == one_by_one + [False] * 5
    assert sum(one_by_one) == sum(w[:1].isdigit() for w in words if w)  # "7up", "12", the Arabic-Indic three, digits


def test_grade_trie_needs_numbers_in_the_vocabulary():
    with pytest.raises(SpecError, match="rate.judge"):
        grade_trie(word_tokenizer(WORDS, digits_split=True))


PAIRS = [
    ("Write a story about a cat.", "the cat sat . the cat sat ."),
    ("Write a book report.", "good book"),
    ("Write a story.", "a story , a good story about the bad cat . the end"),
]


def brute_force_grade_probability(judge: Judge, prompt: str, text: str, grade: int) -> float:
    """P(grade) from separate unpadded full forwards per path prefix (no cache, no batching)."""
    context = judge.tokenizer.encode(judge._chat(prompt, text) + judge.trie.prefill, add_special_tokens=False)
    path = judge.trie.paths[grade]

    def next_probs(prefix: tuple[int, ...]) -> torch.Tensor:
        with torch.inference_mode():
            logits = judge.model(input_ids=torch.tensor([context + list(prefix)])).logits[0, -1]
        return torch.softmax(logits.double(), -1)

    probability = 1.0
    for k in range(len(path)):
        probability *= next_probs(path[:k])[path[k]].item()
    if path in judge.trie.inner:
        probability *= 1 - next_probs(path)[judge.digit_start.cpu()].sum().item()
    return probability


@pytest.mark.parametrize("digits_split", [True, False])
def test_grade_distribution_matches_brute_force(digits_split, one_thread):
    judge = tiny_judge(digits_split)
    prompts, texts = [p for p, _ in PAIRS], [t for _, t in PAIRS]
    probs = judge.grade_distribution(prompts, texts)  # batches of 2 with left padding
    assert probs.shape == (3, MAX_GRADE + 1)
    assert np.all(probs >= 0) and np.all(probs.sum(-1) <= 1 + 1e-6)
    for row in range(3):
        for grade in (0, 1, 7, 10, 19, 85, 100):
            expected = brute_force_grade_probability(judge, prompts[row], texts[row], grade)
            assert probs[row, grade] == pytest.approx(expected, rel=1e-3, abs=1e-9)


def test_padding_batches_to_a_multiple_of_tokens_keeps_the_grade_distribution(one_thread):
    """What the judge does on CUDA (batch widths rounded up so shapes repeat), forced on the CPU: extra masked
    pad positions change no probability (brute force is per text, unpadded)."""
    judge = tiny_judge(digits_split=True)
    prompts, texts = [p for p, _ in PAIRS], [t for _, t in PAIRS]
    unpadded = judge.grade_distribution(prompts, texts)
    judge.pad_multiple = 16
    padded = judge.grade_distribution(prompts, texts)
    np.testing.assert_allclose(padded, unpadded, rtol=1e-4, atol=1e-9)
    for row in range(3):
        expected = brute_force_grade_probability(judge, prompts[row], texts[row], 7)
        assert padded[row, 7] == pytest.approx(expected, rel=1e-3, abs=1e-9)


# Rows of mixed lengths (left padding of 0..12 tokens in a batch of 4), all beginning with the rating prompt's head.
MIXED = [*PAIRS, ("Write a book report.", "a good book report about a bad cat . the cat sat . the end . good")]

# Tolerance of the shared-head forward against the single-pass reference, in float32. Both compute the same
# function; they differ only in the order of the sums (the head's keys and values come from a 1-row forward, and
# attention sums over them in a separate block), i.e. in rounding: measured <= 4e-6 on logits of magnitude ~6
# (a few ulps after two layers). A wrong position, mask or cache shifts these logits by 0.01 to 1.
LOGIT_ATOL = 5e-5


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("digits_split", [True, False])
# the last three: CUDA's ways (causal: the default there), on the CPU
@pytest.mark.parametrize("widths", ["own", "rows16", "attention128", "causal"])
def test_shared_head_forward_matches_the_single_pass_reference(attention, digits_split, widths, one_thread):
    judge = tiny_judge(digits_split)
    judge.model.set_attn_implementation(attention)
    layout = {"own": (None, False, False), "rows16": (16, False, False), "attention128": (16, True, False),
              "causal": (16, True, True)}[widths]
    judge.pad_multiple, judge.round_attention, judge.split_attention = layout
    sequences = [judge.tokenizer.encode(judge._chat(p, t) + judge.trie.prefill, add_special_tokens=False)
                 for p, t in MIXED]
    assert len({len(s) for s in sequences}) == len(MIXED)
    assert len(judge.head) > 10 and all(tuple(s[:len(judge.head)]) == judge.head for s in sequences)
    reference = single_pass_node_logits(judge, sequences)
    shared = judge.node_logits(sequences)
    assert shared.shape == reference.shape == (len(MIXED), 1 + len(judge.trie.inner), len(judge.tokenizer))
    torch.testing.assert_close(shared, reference, rtol=0, atol=LOGIT_ATOL)
    torch.testing.assert_close(judge.grades_from_logits(shared), judge.grades_from_logits(reference),
                               rtol=1e-4, atol=1e-9)
    assert torch.equal(judge.node_logits(sequences), shared)  # same inputs, same bits
    again = tiny_judge(digits_split)  # a new judge computes the head's cache afresh: the same bits again
    again.model.set_attn_implementation(attention)
    again.pad_multiple, again.round_attention, again.split_attention = layout
    assert torch.equal(again.node_logits(sequences), shared)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on the CPU needs a C++ compiler")
@pytest.mark.parametrize("layout", ["rows", "attention128", "causal"])  # causal: what runs on CUDA
def test_compiled_layers_match_the_eager_forward_and_compile_once_for_every_width(layout, one_thread):
    """The compiled judge (what runs on CUDA) computes the eager judge's logits; every layer and every batch width
    shares one compiled graph (the layer's number and the width are traced as inputs, and so are the attention's
    rounded widths), and the greedy mode's ``generate`` runs the layers eagerly."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from mmw.judge.backends import TransformersBackend

    eager, compiled = tiny_judge(digits_split=False), tiny_judge(digits_split=False)
    torch._dynamo.reset()
    counters.clear()
    restarts = RecordedLogs()  # Dynamo restarting its analysis: the trace paid twice in every process's set-up
    tracer = logging.getLogger("torch._dynamo.convert_frame")
    level = tracer.level
    tracer.setLevel(logging.INFO)
    tracer.addHandler(restarts)
    try:
        compiled = Judge(compiled.tokenizer, compiled.model, batch_size=2, compiled=True,
                         round_attention=layout != "rows", split_attention=layout == "causal")
    finally:
        tracer.removeHandler(restarts)
        tracer.setLevel(level)
    assert not [m for m in restarts.messages if "Restarting analysis" in m], restarts.messages
    assert compiled.arithmetic != eager.arithmetic
    assert TransformersBackend(compiled, "tiny").cache_id("expected") != \
        TransformersBackend(eager, "tiny").cache_id("expected")
    assert TransformersBackend(compiled, "tiny").cache_id("greedy") == \
        TransformersBackend(eager, "tiny").cache_id("greedy")
    sequences = [compiled.tokenizer.encode(compiled._chat(p, t) + compiled.trie.prefill, add_special_tokens=False)
                 for p, t in MIXED]
    widths = set()
    for batch in (sequences[:2], sequences[2:]):  # two batches of different widths
        widths.add(max(map(len, batch)))
        torch.testing.assert_close(compiled.node_logits(batch), eager.node_logits(batch), rtol=0, atol=LOGIT_ATOL)
    assert len(widths) == 2 and len(compiled.model.model.layers) == 2
    # a batch of one row (a group's remainder): the same graph, not one with its size fixed
    torch.testing.assert_close(compiled.node_logits(sequences[1:2]), eager.node_logits(sequences[1:2]),
                               rtol=0, atol=LOGIT_ATOL)
    assert counters["stats"]["unique_graphs"] == 1
    prompts, texts = [p for p, _ in MIXED], [t for _, t in MIXED]
    assert compiled.replies(prompts, texts) == eager.replies(prompts, texts)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("cached", [False, True])
def test_the_pruned_last_layer_is_the_whole_layer_at_the_kept_positions(family, cached, one_thread):
    """``mmw.judge.last_layer.pruned_forward`` computes a decoder layer's output at the last ``keep`` positions as
    the whole layer does (float32 on the CPU: the same function, the sums in another order), with or without a
    cache of earlier positions, for every layer class it claims (Qwen2: biased projections; Qwen3: per-head norms
    of queries and keys); every other position's output and the keys, values and mask of the layer are used."""
    import transformers

    from mmw.judge.last_layer import last_layer, pruned_forward

    name = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    torch.manual_seed(1)
    config = getattr(transformers, f"{name}Config")(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, initializer_range=0.3, sliding_window=None,
        attn_implementation="sdpa")
    model = getattr(transformers, f"{name}ForCausalLM")(config).eval()
    layer = last_layer(model)
    assert layer is model.model.layers[-1] and type(layer).__name__ == f"{name}DecoderLayer"
    rows, seen, positions, keep = 3, 4 if cached else 0, 9, 3
    hidden = torch.randn(rows, positions, 32)
    position_ids = torch.arange(seen, seen + positions).expand(rows, -1)
    embeddings = model.model.rotary_emb(hidden, position_ids)
    allowed = torch.ones(positions, seen + positions, dtype=torch.bool).tril(seen)
    allowed = allowed[None, None].repeat(rows, 1, 1, 1)
    allowed[1, :, :, seen:seen + 2] = False  # a row whose first two positions are hidden: the mask is read
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)

    def cache():
        made = transformers.DynamicCache(config=config)
        if cached:
            generator = torch.Generator().manual_seed(2)
            for index in range(2):
                made.update(torch.randn(rows, 2, seen, 8, generator=generator),
                            torch.randn(rows, 2, seen, 8, generator=generator), index)
        return made

    with torch.no_grad():
        whole = layer(hidden, attention_mask=mask, position_embeddings=embeddings, past_key_values=cache(),
                      position_ids=position_ids)
        pruned = pruned_forward(layer, hidden, keep, mask[:, :, -keep:], embeddings, cache())
    assert pruned.shape == (rows, keep, 32)
    torch.testing.assert_close(pruned, whole[:, -keep:], rtol=0, atol=2e-5)
    with torch.no_grad():  # and it reads the other positions: change one, its keys and values move the output
        hidden[0, 0] += 1
        moved = pruned_forward(layer, hidden, keep, mask[:, :, -keep:], embeddings, cache())
    assert (moved[0] - pruned[0]).abs().max() > 1e-3 and torch.equal(moved[1:], pruned[1:])


def test_a_layer_class_the_pruning_does_not_know_runs_whole(one_thread):
    """A decoder layer with Llama's sub-modules but another forward (Granite scales its residuals) is not pruned:
    the judge computes it whole and says so in its arithmetic; a known one is pruned under the causal split."""
    import transformers

    from mmw.judge.last_layer import last_layer, last_layer_pruned

    config = transformers.GraniteConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, residual_multiplier=0.5)
    granite = transformers.GraniteForCausalLM(config)
    assert last_layer(granite) is None
    with last_layer_pruned(granite, 3) as pruned:
        assert not pruned and granite.model.layers[-1]._compiled_call_impl is None
    judge = tiny_judge(digits_split=True)
    judge.split_attention = True
    assert judge.prune_last_layer and judge.arithmetic.endswith("+last")
    judge.model.set_attn_implementation("eager")  # no causal split without SDPA: nothing pruned either
    assert "last" not in judge.arithmetic


def test_a_batch_with_a_row_not_beginning_with_the_head_is_computed_whole(one_thread):
    """A row whose tokens differ from the head (a tokenizer merging across its end) sends its whole batch through
    the plain single pass: the reference's bits exactly."""
    judge = tiny_judge(digits_split=True)
    sequences = [judge.tokenizer.encode(judge._chat(p, t) + judge.trie.prefill, add_special_tokens=False)
                 for p, t in MIXED]
    sequences[1] = sequences[1][1:]
    assert torch.equal(judge.node_logits(sequences), single_pass_node_logits(judge, sequences))


def test_a_template_that_rewrites_the_prompt_has_no_head(one_thread):
    """Where the chat template changes the rated prompt's text, the judge cannot tell where its fixed head ends:
    it shares nothing and computes every row whole."""
    judge = tiny_judge(digits_split=True)
    judge.tokenizer.chat_template = CHATML.replace("{{ m['content'] }}", "{{ m['content'] | upper }}")
    sequences = [judge.tokenizer.encode(judge._chat(p, t) + judge.trie.prefill, add_special_tokens=False)
                 for p, t in MIXED]
    assert judge.head == ()
    assert torch.equal(judge.node_logits(sequences), single_pass_node_logits(judge, sequences))


def test_the_single_pass_reference_is_the_brute_force_distribution(one_thread):
    """The reference of the shared-head tests, checked on its own: rows of mixed lengths in one padded batch."""
    judge = tiny_judge(digits_split=True)
    sequences = [judge.tokenizer.encode(judge._chat(p, t) + judge.trie.prefill, add_special_tokens=False)
                 for p, t in MIXED]
    probs = judge.grades_from_logits(single_pass_node_logits(judge, sequences))
    for row, (prompt, text) in enumerate(MIXED):
        for grade in (7, 10, 85):
            expected = brute_force_grade_probability(judge, prompt, text, grade)
            assert probs[row, grade].item() == pytest.approx(expected, rel=1e-3, abs=1e-9)


def test_forward_benchmark_runs_every_variant_on_a_tiny_model(tmp_path, one_thread):
    """bench/judge_forward.py on the CPU (a tiny random model): a timing and a floor per variant, and the judge's
    candidates (the shared head, two passes) give the single pass's logits."""
    tokenizer = word_tokenizer(WORDS + [str(d) for d in range(10)], digits_split=True)
    tokenizer.save_pretrained(tmp_path / "tok")
    spec = importlib.util.spec_from_file_location("judge_forward", ROOT / "bench" / "judge_forward.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    app = typer.Typer()
    app.command()(bench.main)
    outcome = CliRunner().invoke(app, ["--config", "tiny", "--tokenizer", str(tmp_path / "tok"), "--batch", "3",
                                       "--context", "120", "--repeats", "1", "--batches", "1",
                                       "--out", str(tmp_path / "out")])
    assert outcome.exit_code == 0, outcome.output
    result = json.loads((tmp_path / "out" / "judge_forward.json").read_text())
    runs = {run["variant"]: run for run in result["runs"]}
    assert set(runs) == {"single", "shared", "two-pass", "causal"} and result["head_tokens"] > 10
    for run in runs.values():
        assert run["ms_per_judgement"] > 0 and run["floor_ms_per_judgement"] > 0 and run["judgements"] == 3
    for name in ("shared", "two-pass"):
        assert runs[name]["max_abs_logit_diff"] < LOGIT_ATOL and runs[name]["max_abs_rating_diff"] < 1e-3


def test_expected_rating_is_in_range_and_none_without_mass(one_thread):
    judge = tiny_judge(digits_split=True)
    prompts, texts = [p for p, _ in PAIRS], [t for _, t in PAIRS]
    ratings = judge.rate_expected(prompts, texts)
    probs = judge.grade_distribution(prompts, texts)
    for rating, row in zip(ratings, probs, strict=True):
        assert 0 <= rating <= 100
        assert rating == pytest.approx(row @ np.arange(101) / row.sum())
    judge.min_mass = 1.0  # a random model never puts all its mass on grades
    assert judge.rate_expected(prompts, texts) == [None, None, None]


def bigram_judge(transitions: dict[str, str]) -> Judge:
    """A real Llama whose next token depends only on the current token, wired by hand: ``transitions[a] = b`` makes
    b the certain successor of a (every other token is followed by EOS). The attention and MLP outputs are zeroed,
    so the residual stream is the current token's embedding (one-hot); the output layer maps it to its successor.
    Its replies and grade probabilities are therefore known exactly, whatever the prompt, padding or batch."""
    tokenizer = word_tokenizer(WORDS + [str(n) for n in range(MAX_GRADE + 1)], digits_split=False)
    vocab = tokenizer.get_vocab()
    size = len(tokenizer)
    config = LlamaConfig(
        vocab_size=size, hidden_size=size + (-size) % 8, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(size, config.hidden_size))
        head = torch.zeros(size, config.hidden_size)
        head[tokenizer.eos_token_id, :size] = 1.0  # default successor: EOS
        for current, successor in transitions.items():
            head[:, vocab[current]] = 0.0
            head[vocab[successor], vocab[current]] = 1.0
        model.lm_head.weight.copy_(head * 10.0)  # logit 10 * sqrt(hidden) ~ 60 above every other token
    return Judge(tokenizer, model, batch_size=2, max_new_tokens=6)


def test_greedy_rating_is_the_grade_the_judge_writes(one_thread):
    """The chat template ends with the "assistant" token. A judge that writes "85" there is rated 85 on every text
    (left-padded batches of 2, texts of different lengths); one that writes "good" has no grade: None, never 0."""
    prompts, texts = [p for p, _ in PAIRS], [t for _, t in PAIRS]
    grader = bigram_judge({"assistant": "85"})
    assert grader.replies(prompts, texts) == ["85"] * 3
    assert grader.rate_greedy(prompts, texts) == [85.0] * 3
    chatter = bigram_judge({"assistant": "good"})
    assert chatter.replies(prompts, texts) == ["good"] * 3
    assert chatter.rate_greedy(prompts, texts) == [None] * 3
    with pytest.raises(SpecError, match="rate.mode: unknown mode 'best'"):
        grader.rate(prompts, texts, modes=["best"])


def test_expected_rating_is_the_grade_the_judge_is_sure_of(one_thread):
    """After the "Grade:" prefill a judge certain to write 7 has expected rating 7 (mass ~1), and one that never
    writes a grade has no rating."""
    prompts, texts = [p for p, _ in PAIRS], [t for _, t in PAIRS]
    sure = bigram_judge({":": "7"})
    probs = sure.grade_distribution(prompts, texts)
    np.testing.assert_allclose(probs[:, 7], 1.0, atol=1e-9)
    assert sure.rate_expected(prompts, texts) == pytest.approx([7.0] * 3, abs=1e-6)
    assert bigram_judge({":": "good"}).rate_expected(prompts, texts) == [None] * 3


def test_templates_without_a_system_turn_get_the_instructions_in_the_user_turn(one_thread):
    judge = tiny_judge(digits_split=True)
    judge.tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    chat = judge._chat("Write a story.", "the cat sat .")
    assert chat.startswith("<|im_start|>user\nYou are given a prompt and a response")
    assert chat.endswith("Prompt: Write a story.\nResponse: the cat sat .<|im_end|>\n<|im_start|>assistant\n")
    assert judge.grade_distribution([], []).shape == (0, MAX_GRADE + 1)


def test_shuffle_words_keeps_the_words():
    text = "one two three four five six seven eight nine ten"
    shuffled = shuffle_words(text, np.random.default_rng(0))
    assert shuffled != text and sorted(shuffled.split()) == sorted(text.split())


def test_paired_discrimination_detects_a_clear_preference_and_ignores_failures():
    rng = np.random.default_rng(0)
    original = list(rng.normal(70, 5, 30))
    broken = [x - 15 + rng.normal(0, 5) for x in original]
    original[3] = None  # a failed judgement drops its pair, it is not a 0
    report = paired_discrimination(original, broken, alpha=0.05)
    assert report["n_pairs"] == 29 and report["n_failed"] == 1
    assert report["discriminates"] and report["pvalue"] < 1e-4
    assert report["mean_original"] == pytest.approx(np.mean([x for x in original if x is not None]))
    # The test is one-sided: preferring the broken texts is no discrimination.
    assert not paired_discrimination(broken, original, alpha=0.05)["discriminates"]
    assert paired_discrimination([50.0] * 5, [50.0] * 5, alpha=0.05)["pvalue"] == 1.0
    assert paired_discrimination([None] * 3, [1.0] * 3, alpha=0.05)["n_pairs"] == 0


def test_paired_discrimination_false_alarm_rate_is_at_most_alpha():
    rng = np.random.default_rng(1)
    alarms = [
        paired_discrimination(list(rng.normal(50, 10, 40)), list(rng.normal(50, 10, 40)), 0.05)["discriminates"]
        for _ in range(400)
    ]
    assert np.mean(alarms) < 0.05 + 3 * np.sqrt(0.05 * 0.95 / 400)


# --- the embedded model as judge (heavy) ---------------------------------------------------------------------
# Measured: SmolLM2-135M cannot judge. Its greedy replies to the rating prompt restate the text and hold no
# grade, and its expected grades (~15-35) do not separate coherent text from word salad or "the the the ...".
# These tests check what holds for any judge on real generations; the pipeline reports discrimination.


@pytest.fixture(scope="module")
def embedded_judge():
    from mmw.engines.models import load_model

    tokenizer, model = load_model("embedded:smollm2-135m", device="cpu")
    return Judge(tokenizer, model, batch_size=4, max_new_tokens=12)


COHERENT = [
    ("Write a story about a child who befriends a stray dog.",
     "Every morning on her way to school, Maya saw the same thin brown dog waiting by the bakery. One cold day "
     "she shared half of her sandwich with him. The next morning he followed her to the school gate, and by the "
     "end of the week he was waiting there every afternoon. Her parents agreed to let him stay."),
    ("Write a book report about Treasure Island, written by Robert Louis Stevenson.",
     "Treasure Island is an adventure novel by Robert Louis Stevenson. Young Jim Hawkins finds a map to the "
     "buried treasure of Captain Flint and sails with Squire Trelawney and Doctor Livesey to find it. The cook, "
     "Long John Silver, turns out to be the leader of a band of pirates."),
    ("Write a news article about Emmanuel Macron's visit to Olaf Scholz in Geneva.",
     "French President Emmanuel Macron met German Chancellor Olaf Scholz in Geneva on Tuesday to discuss energy "
     "prices and European defence. The two leaders held talks for three hours and announced a joint plan to "
     "connect their electricity grids."),
]
# More real texts for the stronger judge's paired test (8 pairs: all ordered right gives p = 1/256).
MORE_COHERENT = [
    ("Write a book report about Pride and Prejudice, written by Jane Austen.",
     "Pride and Prejudice follows Elizabeth Bennet, the second of five daughters, as she deals with manners, "
     "marriage and money in rural England. Her first impression of the proud Mr Darcy is poor, and his first "
     "proposal is refused, but a letter he writes changes her mind and both learn to see past their pride."),
    ("Write a story about a fisherman who finds a message in a bottle.",
     "Old Tomas pulled the bottle out of his net at dawn. Inside was a letter from a girl who lived across the "
     "bay, asking whoever found it to write back. He answered that evening, and for the rest of the summer "
     "their letters crossed the water every week, carried by the ferry instead of the tide."),
    ("Write a news article about Joe Biden's visit to Fumio Kishida in Tokyo.",
     "President Joe Biden arrived in Tokyo on Monday for talks with Prime Minister Fumio Kishida. The two "
     "leaders discussed trade, regional security and a shared programme for semiconductor research, and they "
     "agreed to meet again at the end of the year to review progress."),
    ("Write a story about a robot learning to paint.",
     "The robot's first paintings were perfect copies of photographs, and nobody liked them. So it started to "
     "watch the children in the park, who painted the sky purple when they were happy. Its next canvas was a "
     "crooked purple sky over a green sun, and the gallery sold it the same day."),
    ("Write a book report about The Old Man and the Sea, written by Ernest Hemingway.",
     "The Old Man and the Sea tells of Santiago, an aging Cuban fisherman who has gone eighty-four days without a "
     "catch. Far out in the Gulf Stream he hooks a giant marlin and fights it for three days, only to lose it to "
     "sharks on the way home. The book is a short, quiet study of endurance and dignity."),
]


@pytest.mark.heavy
def test_embedded_small_model_writes_grades_in_range(embedded_judge):
    """What holds even for a judge that cannot judge (SmolLM2, see above): after the prefill it writes a number, its
    expected grades lie in 0..100, and greedy replies give a grade in 0..100 or None. Whether a judge separates
    coherent from degenerate text is compared in the Qwen test below."""
    prompts = [p for p, _ in COHERENT[:2]] + [COHERENT[0][0]]
    texts = [t for _, t in COHERENT[:2]] + ["the " * 60]
    probs = embedded_judge.grade_distribution(prompts, texts)
    assert np.all(probs.sum(-1) > 0.5)  # after the "Grade: " prefill the judge writes a number
    expected = embedded_judge.rate_expected(prompts, texts)
    assert all(r is not None and 0 <= r <= 100 for r in expected)
    greedy = embedded_judge.rate_greedy(prompts, texts)
    assert all(g is None or 0 <= g <= 100 for g in greedy)


@pytest.mark.heavy
def test_judge_discrimination_report_on_real_generations(embedded_judge):
    from mmw.engines.generate import generate
    from mmw.watermark.processor import WatermarkProcessor
    from mmw.tasks import build_prompts, render_chat

    tokenizer, model = embedded_judge.tokenizer, embedded_judge.model
    prompts = build_prompts(["book_report", "story", "fake_news"], 2)
    generations = generate(
        model, tokenizer, render_chat(tokenizer, prompts["prompt"].to_list()),
        lambda seeds: WatermarkProcessor(None, None, len(tokenizer), seeds, 1.0), 48, 6,
        prompt_ids=prompts["prompt_id"].to_list(), progress=False,
    )
    texts = generations["text"].to_list()
    report = judge_discrimination(embedded_judge, prompts["prompt"].to_list(), texts, seed=3)
    assert report["n_texts"] == 6
    assert {mode: len(ratings) for mode, ratings in report["original_ratings"].items()} == dict.fromkeys(MODES, 6)
    for mode in MODES:
        result = report[mode]
        assert result["n_pairs"] + result["n_failed"] == 6
        assert 0 <= result["pvalue"] <= 1 and result["discriminates"] == (result["pvalue"] < 0.05)
    assert report["expected"]["n_pairs"] == 6 and 0 <= report["expected"]["mean_shuffled"] <= 100
    assert report["best_mode"] in (None, *[m for m in MODES if report[m]["discriminates"]])


@pytest.mark.heavy
def test_embedded_qwen_judge_rates_text_above_its_word_salad():
    """The stronger embedded judge must order coherent texts above the same words shuffled (paired, one-sided)."""
    from mmw.engines.models import load_model

    tokenizer, model = load_model("embedded:qwen2.5-coder-1.5b", device="cpu")
    judge = Judge(tokenizer, model, batch_size=4)
    pairs = COHERENT + MORE_COHERENT
    prompts, texts = [p for p, _ in pairs], [t for _, t in pairs]
    rng = np.random.default_rng(11)
    original = judge.rate_expected(prompts, texts)
    shuffled = judge.rate_expected(prompts, [shuffle_words(t, rng) for t in texts])
    result = paired_discrimination(original, shuffled, 0.05)
    assert result["n_pairs"] == len(pairs), "the judge put no probability on a grade"
    assert result["discriminates"] and result["mean_original"] > result["mean_shuffled"], result
    # Coherent vs degenerate, compared: one repeated word rates below every coherent text.
    degenerate = judge.rate_expected([p for p, _ in COHERENT], ["the " * 60] * len(COHERENT))
    assert max(degenerate) < min(original), (degenerate, original)


def test_grade_distributions_read_one_group_ahead_and_give_each_groups_own_numbers(one_thread):
    """The rate stage's path: the numbers of each group are those ``grade_distribution`` gives it alone, bit for
    bit, and the next group is read (so tokenized and queued on a GPU) before a group's numbers are handed over."""
    judge = tiny_judge(digits_split=True)
    groups = [([p for p, _ in MIXED[:2]], [t for _, t in MIXED[:2]]), ([MIXED[2][0]], [MIXED[2][1]]),
              ([MIXED[3][0]], [MIXED[3][1]])]
    read = []

    def source():
        for index, group in enumerate(groups):
            read.append(index)
            yield group

    handed = []
    for index, probs in enumerate(judge.grade_distributions(source())):
        handed.append(list(read))
        np.testing.assert_array_equal(probs, judge.grade_distribution(*groups[index]))
    assert handed == [[0, 1], [0, 1, 2], [0, 1, 2]]
    assert list(judge.grade_distributions([])) == []
