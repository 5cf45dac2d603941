"""transformers' KGW watermark (``WatermarkLogitsProcessor``, ``WatermarkDetector``) as a plugin, unmodified.

Generation runs transformers' processor (seeding scheme ``lefthash`` or ``selfhash``, its own hashing and green
lists). Detection runs transformers' ``WatermarkDetector``: its per-n-gram green verdict (the method its own
``_score_ngrams_in_passage`` calls) gives each token's green indicator, counted once per distinct n-gram as its
``ignore_repeated_ngrams`` does; and either
- ``detection: green`` (default): the indicators are pivots with the exact Binomial(n, gamma) null, gamma =
  floor(V * greenlist_ratio) / V, the size of transformers' green list (every size: E, checkpoint, anytime), or
- ``detection: zscore``: transformers' own z-score and p-value (``_compute_z_score``, ``_compute_pval``: a
  closed-form approximation of the normal tail) at every prefix (E and the checkpoint size only).

The hashing key is derived one-way from mmw's key (31 bits: transformers multiplies it by token ids in int64).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from mmw.watermark import prf
from mmw.watermark.plugins import Pivots, PluginDetector, PrefixPValues, WatermarkPlugin
from mmw.validation import Integer, Section, allowed

ZSCORE_REASON = ("detection=zscore: transformers' z-score p-value is a per-text statistic with no declared per-token "
                 "null; detection=green gives the anytime size")
#: The PRF tag of the hashing key derived from mmw's key.
KEY_TAG = 0x4B47_5748  # "KGWH"


class KGWParams(Section):
    seeding_scheme: Literal["lefthash", "selfhash"] = allowed("lefthash, selfhash", default="lefthash")
    bias: float = allowed("a number > 0 (transformers' delta)", default=2.0, gt=0.0, le=1e6)
    greenlist_ratio: float = allowed("a number in (0, 1) (gamma)", default=0.25, gt=0.0, lt=1.0)
    context_width: Integer = allowed("an integer >= 1", default=1, ge=1, le=64)
    detection: Literal["green", "zscore"] = allowed("green, zscore", default="green")


def hashing_key(key: int) -> int:
    return prf.prf_int(key & prf.MASK64, KEY_TAG) & 0x7FFF_FFFF


def watermarking_config(params: KGWParams, key: int) -> dict:
    return {"greenlist_ratio": params.greenlist_ratio, "bias": params.bias, "hashing_key": hashing_key(key),
            "seeding_scheme": params.seeding_scheme, "context_width": params.context_width}


class _LazyDevice:
    """transformers' processor, built on the device of the first scores it sees (its RNG and table live there)."""

    def __init__(self, vocab_size: int, config: dict):
        self.vocab_size, self.config, self.inner = vocab_size, config, None

    def __call__(self, input_ids, scores):
        import torch

        if self.inner is None:
            from transformers.generation import WatermarkLogitsProcessor

            self.inner = WatermarkLogitsProcessor(vocab_size=self.vocab_size, device=scores.device, **self.config)
        try:
            return self.inner(input_ids, scores)
        except IndexError:
            # selfhash: when none of its 40 rejection-sampling candidates is green, transformers indexes with an
            # empty float tensor and raises. Its intent is then "no token gets the bias": run row by row, leaving
            # such a row's scores unchanged.
            rows = []
            for row in range(scores.shape[0]):
                try:
                    rows.append(self.inner(input_ids[row:row + 1], scores[row:row + 1]))
                except IndexError:
                    rows.append(scores[row:row + 1])
            return torch.cat(rows)


class KGWDetector(PluginDetector):
    def __init__(self, params: KGWParams, key: int, vocab_size: int):
        from transformers import PretrainedConfig
        from transformers.generation import WatermarkDetector

        self.params = params
        config = PretrainedConfig(vocab_size=vocab_size, bos_token_id=None)
        self.reference = WatermarkDetector(config, "cpu", watermarking_config(params, key),
                                           ignore_repeated_ngrams=True)
        processor = self.reference.processor
        self.gamma = processor.greenlist_size / vocab_size
        selfhash = params.seeding_scheme == "selfhash"
        self.ngram = processor.context_width + 1 - int(selfhash)  # as transformers' _score_ngrams_in_passage
        self.selfhash = selfhash

    def greens(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per token: green indicator (1/0) and unit count (1 for the first occurrence of its n-gram, else 0)."""
        import torch

        n = len(tokens)
        green, units = np.zeros(n), np.zeros(n, dtype=np.int64)
        ids = torch.as_tensor(tokens, dtype=torch.int64)
        seen: set[tuple[int, ...]] = set()
        for end in range(self.ngram - 1, n):
            ngram = tuple(tokens[end - self.ngram + 1: end + 1].tolist())
            if ngram in seen:
                continue
            seen.add(ngram)
            window = ids[end - self.ngram + 1: end + 1]
            prefix = window if self.selfhash else window[:-1]
            green[end] = float(self.reference._get_ngram_score(prefix, int(tokens[end])))
            units[end] = 1
        return green, units

    def score(self, tokens: np.ndarray) -> Pivots | PrefixPValues:
        green, units = self.greens(np.asarray(tokens, dtype=np.int64))
        if self.params.detection == "green":
            return Pivots(values=-green, units=units, null="green", gamma=float(self.gamma))
        count, greens = np.cumsum(units).astype(np.float64), np.cumsum(green)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = self.reference._compute_pval(self.reference._compute_z_score(greens, count))
        return PrefixPValues(np.where(count > 0, p, 1.0), reason=ZSCORE_REASON)


class KGW(WatermarkPlugin):
    """KGW as transformers ships it (lefthash or selfhash)."""

    label = "KGW (transformers)"
    distortion_free = False
    Params = KGWParams

    def processor(self, params, key, vocab_size, temperature, row_seeds):
        return _LazyDevice(vocab_size, watermarking_config(params, key))

    def detector(self, params, key, vocab_size):
        return KGWDetector(params, key, vocab_size)

    def no_pivot_reason(self, params):
        return None if params.detection == "green" else ZSCORE_REASON
