"""SchemeSpec: one validated watermark configuration (the ``scheme:`` section of params.yaml).

Validation follows the paper's "limitations of building blocks": combinations that are meaningless or
broken are rejected with an error that names the key and says what is allowed. A key whose value is ``null``
counts as absent, so ``dvc exp run -S scheme.sampler=exponential -S scheme.delta=null`` switches schemes cleanly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from mmw.errors import SpecError
from mmw.validation import Integer, Section, allowed, validate

SAMPLERS = ("distribution_shift", "exponential", "inverse_transform", "binary")
RANDOMNESS = ("window", "minhash", "fixed")
SCORES = ("sum", "align", "edit")
BINARY_CODES = ("huffman", "fixed")
DISTORTION_FREE = ("exponential", "inverse_transform", "binary")
KNOWN_KEYS = (
    "sampler", "randomness", "window", "key_length", "delta", "gamma", "skip_prob",
    "score", "psi", "trials", "alpha", "binary_code",
)
DEFAULT_TRIALS = 100


class _SchemeFields(Section):
    """Each key's own type and range (the one validation dialect, mmw.validation); the rules between keys are
    :meth:`SchemeSpec.from_params`'s."""

    sampler: Literal[SAMPLERS] = allowed(", ".join(SAMPLERS))  # type: ignore[valid-type]
    randomness: Literal[RANDOMNESS] = allowed(", ".join(RANDOMNESS))  # type: ignore[valid-type]
    window: Integer | None = allowed("an integer >= 0", default=None, ge=0, le=1 << 20)
    key_length: Integer | None = allowed("an integer >= 1", default=None, ge=1, le=1 << 24)
    delta: float | None = allowed("a number > 0", default=None, gt=0.0, le=1e6)
    gamma: float | None = allowed("a number in (0, 1)", default=None, gt=0.0, lt=1.0)
    skip_prob: float | None = allowed("a number in [0, 1)", default=None, ge=0.0, lt=1.0)
    score: Literal[SCORES] = allowed(", ".join(SCORES))  # type: ignore[valid-type]
    psi: float | None = allowed("a number >= 0", default=None, ge=0.0, le=1e6)
    trials: Integer | None = allowed("an integer >= 1", default=None, ge=1, le=1 << 20)
    alpha: float | None = allowed("a number in (0, 1)", default=None, gt=0.0, lt=1.0)
    binary_code: Literal[BINARY_CODES] | None = allowed(", ".join(BINARY_CODES), default=None)  # type: ignore[valid-type]


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
        if params.get("key") is not None:
            raise SpecError(f"{prefix}.key", "the watermark key is the top-level `key:` of params (or $MMW_KEY), "
                            "not part of the scheme", KNOWN_KEYS)
        # Types, ranges and unknown keys; ``given`` keeps only the keys set (a null counts as absent).
        given = validate(_SchemeFields, {k: v for k, v in params.items() if v is not None},
                         prefix).model_dump(exclude_none=True)

        def forbid(k: str, why: str) -> None:
            if k in given:
                raise SpecError(f"{prefix}.{k}", f"not used {why}; remove it or set it to null")

        sampler, randomness, score = given["sampler"], given["randomness"], given["score"]

        window = key_length = None
        if randomness in ("window", "minhash"):
            forbid("key_length", f"with randomness={randomness} (key_length is for randomness=fixed)")
            if "window" not in given:
                raise SpecError(f"{prefix}.window", f"required with randomness={randomness}", "an integer >= 0")
            window = given["window"]
            if randomness == "minhash" and window == 0:
                raise SpecError(f"{prefix}.window", "min-hash over an empty window is meaningless; "
                                "for constant randomness use randomness=window with window=0", "an integer >= 1")
        else:
            forbid("window", "with randomness=fixed (window is for randomness=window|minhash)")
            if "key_length" not in given:
                raise SpecError(f"{prefix}.key_length", "required with randomness=fixed", "an integer >= 1")
            key_length = given["key_length"]

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
        # Sampler x score: the edit DP compares per-token costs with the gap cost psi, which only means something
        # when the statistic is on the -Exp(1) scale (C1, C2) or in [-1, 0] (C4). The binary sampler's per-token
        # statistic is a sum of ~depth (10-17) positive Exp(1) node values, always far above 2 psi, so the DP takes
        # only gaps and every text (and every null trial) scores exactly 2 n psi: p = 1, nothing is ever detected.
        # The paper tests the edit score with distribution shift only.
        if score == "edit" and sampler == "binary":
            raise SpecError(f"{prefix}.score", "the edit score cannot detect the binary sampler: its per-token "
                            "statistic (a sum of ~10-17 positive node values) always exceeds the gap cost 2*psi, "
                            "so every text scores 2*n*psi and p = 1; use score=align with randomness=fixed, or "
                            "score=sum", ("sum", "align"))
        # Constant randomness (window=0) gives every token one seed. The sum score counts each random draw once,
        # and C2 draws one uniform per seed (the whole text is one draw), C3 one per tree node (shared by every
        # token, most of them forced by the model): the evidence stops growing with length. Measured on synthetic
        # text of entropy log 16: 17% (C2) and 0-8% (C3) detected at 64 and 200 tokens (tests/test_power.py).
        if window == 0 and sampler in ("inverse_transform", "binary"):
            raise SpecError(f"{prefix}.window", f"window=0 (constant randomness) cannot detect sampler={sampler}: "
                            "every token shares one seed, so the text holds "
                            + ("one random draw" if sampler == "inverse_transform" else
                               "only the tree nodes' draws, shared by all tokens")
                            + " and evidence stops growing with length", "an integer >= 1")

        delta = gamma = None
        skip_prob = 0.0
        binary_code = None
        if sampler == "distribution_shift":
            forbid("skip_prob", "by the distribution-shift sampler (it is not deterministic given the key)")
            if "delta" not in given:
                raise SpecError(f"{prefix}.delta", "required with sampler=distribution_shift", "a number > 0")
            delta = float(given["delta"])
            gamma = float(given.get("gamma", 0.5))
        else:
            forbid("delta", f"by sampler={sampler} (delta is the distribution-shift bias)")
            forbid("gamma", f"by sampler={sampler} (gamma is the distribution-shift green-list fraction)")
            if "skip_prob" in given:
                skip_prob = float(given["skip_prob"])
        if sampler == "binary":
            binary_code = given.get("binary_code", "huffman")
        else:
            forbid("binary_code", f"by sampler={sampler} (binary_code is for sampler=binary)")

        psi = None
        if score == "edit":
            if "psi" not in given:
                raise SpecError(f"{prefix}.psi", "required with score=edit", "a number >= 0")
            psi = float(given["psi"])
        else:
            forbid("psi", f"by score={score} (psi is the edit-score gap cost)")

        alpha = float(given.get("alpha", 0.02))

        trials = None
        if score in ("align", "edit"):
            trials = given.get("trials", DEFAULT_TRIALS)
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
