"""FPR audit over keys: how far one deployment's false-positive rate can sit from alpha.

The null guarantee P(p <= alpha) <= alpha holds over the key. A user deploys *one* key, and on text that repeats
itself (code, lists, man pages) the verdicts of different texts under that key share random draws, so the one-key
FPR of a corpus scatters around alpha much more than a binomial would. The audit re-detects the baseline under
``K`` extra keys and reports the spread of the per-key FPR.

The audit keys are derived from the run's key by a keyed hash (BLAKE2b with its own personalisation): one-way, so
neither the keys nor anything written from them reveals the run's key, and never written themselves.
"""

from __future__ import annotations

import hashlib

import numpy as np
from scipy import stats

#: The central interval of Binomial(n, alpha) / n that a calibrated key's FPR falls in with this probability.
BAND_LEVEL = 0.95


def audit_keys(key: int, count: int) -> list[int]:
    """``count`` 64-bit keys derived one-way from ``key`` (distinct from it and from each other)."""
    return [int.from_bytes(hashlib.blake2b(key.to_bytes(8, "little"), digest_size=8, person=b"mmw-audit",
                                           salt=index.to_bytes(8, "little")).digest(), "little")
            for index in range(count)]


def key_spread(audit_pvalues: np.ndarray, alpha: float) -> dict[str, float | int | None]:
    """Spread of the one-key FPR over the audit keys.

    Args:
        audit_pvalues: float64 [texts, K], full-text p-value of each baseline text under each audit key.
        alpha: the detection threshold.

    Returns:
        ``fpr_keys`` (K), ``fpr_key_min/median/max`` (per-key FPR = share of texts with p <= alpha),
        ``fpr_keys_above_band`` (share of keys whose FPR exceeds the upper end of the central 95% interval of
        Binomial(texts, alpha) / texts: about 2.5% or less for a calibrated detector on independent texts) and
        ``fpr_key_band_high`` (that upper end). Nones when there are no keys or no texts.
    """
    n_texts, n_keys = audit_pvalues.shape
    if n_keys == 0 or n_texts == 0:
        return {"fpr_keys": n_keys, "fpr_key_min": None, "fpr_key_median": None, "fpr_key_max": None,
                "fpr_keys_above_band": None, "fpr_key_band_high": None}
    per_key = (audit_pvalues <= alpha).mean(axis=0)
    band_high = float(stats.binom.interval(BAND_LEVEL, n_texts, alpha)[1] / n_texts)
    return {"fpr_keys": n_keys, "fpr_key_min": float(per_key.min()), "fpr_key_median": float(np.median(per_key)),
            "fpr_key_max": float(per_key.max()), "fpr_keys_above_band": float(np.mean(per_key > band_high)),
            "fpr_key_band_high": band_high}
