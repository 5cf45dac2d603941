"""SchemeSpec: one validated watermark configuration (the ``scheme:`` section of params.yaml).

Validation follows the paper's "limitations of building blocks": combinations that are meaningless or
broken are rejected with an error that names the key and says what is allowed. A key whose value is ``null``
counts as absent, so ``dvc exp run -S scheme.sampler=exponential -S scheme.delta=null`` switches schemes cleanly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mmw.errors import SpecError

SAMPLERS = ("distribution_shift", "exponential", "inverse_transform", "binary")
RANDOMNESS = ("window", "minhash", "fixed")
SCORES = ("sum", "align", "edit")
BINARY_CODES = ("huffman", "fixed")
DISTORTION_FREE = ("exponential", "inverse_transform", "binary")
KNOWN_KEYS = (
    "sampler", "randomness", "window", "key_length", "delta", "gamma", "skip_prob",
    "score", "psi", "trials", "alpha", "binary_code", "key",
)
DEFAULT_TRIALS = 100


@dataclass(frozen=True)
class SchemeSpec:
    """A watermark = randomness source R + sampler C + score S (+ their parameters).

    ``window`` is H (R1/R2), ``key_length`` is L (R3). ``delta``/``gamma`` belong to the distribution-shift
    sampler, ``skip_prob`` to the distortion-free ones, ``psi`` to the edit score and ``trials`` to the
    empirical (permutation) null used by the align and edit scores.
    """

    sampler: str
    randomness: str
    score: str
    window: int | None = None
    key_length: int | None = None
    delta: float | None = None
    gamma: float | None = None
    skip_prob: float = 0.0
    psi: float | None = None
    trials: int | None = None
    alpha: float = 0.02
    binary_code: str | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_params(cls, params: dict[str, Any], prefix: str = "scheme") -> "SchemeSpec":
        """Validate a params mapping; raises SpecError naming ``<prefix>.<key>``."""
        if not isinstance(params, dict):
            raise SpecError(prefix, f"expected a mapping, got {type(params).__name__}")
        given = {k: v for k, v in params.items() if v is not None}
        for k in given:
            if k not in KNOWN_KEYS:
                raise SpecError(f"{prefix}.{k}", "unknown key", KNOWN_KEYS)

        def choice(k: str, allowed: tuple[str, ...]) -> str:
            if k not in given:
                raise SpecError(f"{prefix}.{k}", "required", allowed)
            if given[k] not in allowed:
                raise SpecError(f"{prefix}.{k}", f"unknown value {given[k]!r}", allowed)
            return given[k]

        def number(k: str, kind: type, lo: float, hi: float, lo_open: bool, hi_open: bool, shown: str) -> Any:
            v = given[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
                raise SpecError(f"{prefix}.{k}", f"expected a number, got {v!r}", shown)
            v = kind(v)
            if (v < lo or (lo_open and v == lo)) or (v > hi or (hi_open and v == hi)):
                raise SpecError(f"{prefix}.{k}", f"{v} is out of range", shown)
            return v

        def forbid(k: str, why: str) -> None:
            if k in given:
                raise SpecError(f"{prefix}.{k}", f"not used {why}; remove it or set it to null")

        sampler = choice("sampler", SAMPLERS)
        randomness = choice("randomness", RANDOMNESS)
        score = choice("score", SCORES)

        window = key_length = None
        if randomness in ("window", "minhash"):
            forbid("key_length", f"with randomness={randomness} (key_length is for randomness=fixed)")
            if "window" not in given:
                raise SpecError(f"{prefix}.window", f"required with randomness={randomness}", "an integer >= 0")
            window = number("window", int, 0, 1 << 20, False, False, "an integer >= 0")
            if randomness == "minhash" and window == 0:
                raise SpecError(f"{prefix}.window", "min-hash over an empty window is meaningless; "
                                "for constant randomness use randomness=window with window=0", "an integer >= 1")
        else:
            forbid("window", "with randomness=fixed (window is for randomness=window|minhash)")
            if "key_length" not in given:
                raise SpecError(f"{prefix}.key_length", "required with randomness=fixed", "an integer >= 1")
            key_length = number("key_length", int, 1, 1 << 24, False, False, "an integer >= 1")

        # Score x randomness: the paper's limitations of building blocks.
        if score == "sum" and randomness == "fixed":
            raise SpecError(f"{prefix}.score", "the sum score is not robust with fixed randomness (one deleted "
                            "token misaligns every later value); with randomness=fixed use align or edit, or use "
                            "randomness=window with window=0 for constant randomness", ("align", "edit"))
        if score == "align" and randomness != "fixed":
            raise SpecError(f"{prefix}.score", f"align searches over key shifts, meaningless with text-dependent "
                            f"randomness={randomness} (nothing can be misaligned)", ("sum", "edit (window=1)"))
        if score == "edit" and randomness != "fixed" and window != 1:
            raise SpecError(f"{prefix}.score", f"edit with text-dependent randomness needs window=1 (got "
                            f"{window}): with a longer window an edit changes the random values, not only "
                            "their alignment", ("sum", "edit with window=1"))
        if score in ("align", "edit") and randomness == "fixed" and key_length == 1:
            raise SpecError(f"{prefix}.score", "key_length=1 is constant randomness, which cannot be misaligned; "
                            "use score=sum with randomness=window, window=0", ("sum"))

        delta = gamma = None
        skip_prob = 0.0
        binary_code = None
        if sampler == "distribution_shift":
            forbid("skip_prob", "by the distribution-shift sampler (it is not deterministic given the key)")
            if "delta" not in given:
                raise SpecError(f"{prefix}.delta", "required with sampler=distribution_shift", "a number > 0")
            delta = number("delta", float, 0.0, 1e6, True, False, "a number > 0")
            gamma = number("gamma", float, 0.0, 1.0, True, True, "a number in (0, 1)") if "gamma" in given else 0.5
        else:
            forbid("delta", f"by sampler={sampler} (delta is the distribution-shift bias)")
            forbid("gamma", f"by sampler={sampler} (gamma is the distribution-shift green-list fraction)")
            if "skip_prob" in given:
                skip_prob = number("skip_prob", float, 0.0, 1.0, False, True, "a number in [0, 1)")
        if sampler == "binary":
            binary_code = choice("binary_code", BINARY_CODES) if "binary_code" in given else "huffman"
        else:
            forbid("binary_code", f"by sampler={sampler} (binary_code is for sampler=binary)")

        psi = None
        if score == "edit":
            if "psi" not in given:
                raise SpecError(f"{prefix}.psi", "required with score=edit", "a number >= 0")
            psi = number("psi", float, 0.0, 1e6, False, False, "a number >= 0")
        else:
            forbid("psi", f"by score={score} (psi is the edit-score gap cost)")

        alpha = number("alpha", float, 0.0, 1.0, True, True, "a number in (0, 1)") if "alpha" in given else 0.02

        trials = None
        if score in ("align", "edit"):
            trials = number("trials", int, 1, 1 << 20, False, False, "an integer >= 1") if "trials" in given \
                else DEFAULT_TRIALS
            smallest_p = 1.0 / (trials + 1)
            if smallest_p > alpha:
                need = int(-(-1.0 // alpha)) - 1
                raise SpecError(f"{prefix}.trials", f"with {trials} trials the smallest p-value is "
                                f"1/{trials + 1} > alpha={alpha}: nothing could ever be detected",
                                f"trials >= {need}")
        else:
            forbid("trials", "by score=sum (its null distribution is exact)")

        return cls(sampler=sampler, randomness=randomness, score=score, window=window, key_length=key_length,
                   delta=delta, gamma=gamma, skip_prob=skip_prob, psi=psi, trials=trials, alpha=alpha,
                   binary_code=binary_code)

    # ------------------------------------------------------------------ views
    @property
    def text_dependent(self) -> bool:
        return self.randomness in ("window", "minhash")

    @property
    def exact_null(self) -> bool:
        """Sum scores have exact nulls (Gamma/Binomial); align and edit use the permutation test."""
        return self.score == "sum"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict without unset fields (safe to log: the key is never part of the spec)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        parts = [self.sampler, self.randomness]
        parts.append(f"H={self.window}" if self.text_dependent else f"L={self.key_length}")
        if self.delta is not None:
            parts.append(f"delta={self.delta:g} gamma={self.gamma:g}")
        if self.skip_prob:
            parts.append(f"skip={self.skip_prob:g}")
        parts.append(self.score + (f"(psi={self.psi:g})" if self.psi is not None else ""))
        return " ".join(parts)
