"""Build a real but tiny argostranslate package (``.argosmodel``) offline, for tests.

No translation model can be downloaded here, so the test builds one: a SentencePiece model trained on a few
sentences, a randomly initialised Hugging Face Marian model sharing that vocabulary, converted to CTranslate2
by ctranslate2's own converter, zipped with argostranslate's ``metadata.json`` layout. Its translations are
gibberish; everything around the model (install, pair discovery, tokenisation, batching, decoding) is real.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import sentencepiece
import torch
from ctranslate2.converters import TransformersConverter
from transformers import MarianConfig, MarianMTModel, MarianTokenizer

TRAINING_TEXT = """The old man sailed far out into the sea before the sun rose.
He caught a great fish after two long days and nights.
Sharks came and ate the fish on the way back to the harbour.
The boy waited for him on the beach and brought him coffee.
Every morning the village woke up to the sound of the waves.
A report about a book should describe its story, themes and characters.
The president visited the capital and met the ministers on Monday.
Le vieil homme est parti en mer. Старик вышел в море. O velho foi para o mar."""


def build_argos_package(
    out_dir: Path, from_code: str, to_code: str, seed: int = 0, vocab_size: int = 160
) -> Path:
    """Write ``translate-<from>_<to>-1_0.argosmodel`` into ``out_dir`` and return its path.

    The model is a 1-layer Marian transformer (d_model 16) with weights drawn from ``torch.manual_seed(seed)``.
    """
    work = out_dir / f"build-{from_code}-{to_code}"
    hf_dir, package_name = work / "hf", f"translate-{from_code}_{to_code}-1_0"
    hf_dir.mkdir(parents=True, exist_ok=True)

    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING_TEXT.splitlines()), model_writer=proto, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
        bos_id=-1, eos_id=-1, unk_id=0, num_threads=1, minloglevel=2,
    )
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto.getvalue())
    # Marian's vocabulary: </s> and <unk> first, the SentencePiece pieces, <pad> last (ctranslate2 drops it).
    vocab = {"</s>": 0, "<unk>": 1}
    for piece_id in range(processor.get_piece_size()):
        vocab.setdefault(processor.id_to_piece(piece_id), len(vocab))
    vocab["<pad>"] = len(vocab)
    (hf_dir / "vocab.json").write_text(json.dumps(vocab))
    for name in ("source.spm", "target.spm"):
        (hf_dir / name).write_bytes(proto.getvalue())
    MarianTokenizer(
        source_spm=str(hf_dir / "source.spm"), target_spm=str(hf_dir / "target.spm"), vocab=str(hf_dir / "vocab.json")
    ).save_pretrained(hf_dir)

    config = MarianConfig(
        vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=512,
        pad_token_id=vocab["<pad>"], eos_token_id=0, decoder_start_token_id=vocab["<pad>"], forced_eos_token_id=0,
    )
    torch.manual_seed(seed)
    MarianMTModel(config).save_pretrained(hf_dir)

    package_dir = work / package_name
    TransformersConverter(str(hf_dir)).convert(str(package_dir / "model"), force=True)
    (package_dir / "sentencepiece.model").write_bytes(proto.getvalue())
    (package_dir / "metadata.json").write_text(json.dumps({
        "package_version": "1.0", "argos_version": "1.0", "type": "translate",
        "from_code": from_code, "from_name": from_code.upper(), "to_code": to_code, "to_name": to_code.upper(),
    }))

    archive = out_dir / f"{package_name}.argosmodel"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted(package_dir.rglob("*")):
            zipped.write(path, Path(package_name) / path.relative_to(package_dir))
    return archive
