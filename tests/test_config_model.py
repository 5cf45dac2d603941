"""The config model answers as recorded in tests/data/scheme_golden.json.gz (tests/make_scheme_golden.py):
every config of the paper, small and smoke sweeps (as they were expanded then) normalizes to the same scheme,
4,000 seeded scheme mappings give the same scheme or the same error text, and 596 one-change variants of
params.yaml the same board or error text; and the parts' declarations are consistent with the model."""

from __future__ import annotations

import re
from typing import Any

import pytest

import make_scheme_golden as golden
from mmw.watermark.scheme import KNOWN_KEYS, PARTS, SchemeSpec
from mmw.validation import Key, Unused

RECORDED = golden.load()


_CHOICES = re.compile(r"=(\w+(?:\|\w+)+)")


def _grown_choices(recorded: str, now: str) -> bool:
    """The same text, except that an `a|b` list of alternatives in it (e.g. the randomness sources a key is for)
    has since gained values: each recorded list is contained in the current one."""
    if _CHOICES.sub("=*", recorded) != _CHOICES.sub("=*", now):
        return False
    pairs = zip(_CHOICES.findall(recorded), _CHOICES.findall(now), strict=True)
    return all(set(old.split("|")) <= set(new.split("|")) for old, new in pairs)


def _same(recorded: Any, now: Any) -> bool:
    """Equal, except that a board may since have gained keys (with defaults) that the recording lacks: recorded
    mappings must be contained in the current ones, and an error's list of allowed keys or values may have grown
    (a new scheme key, a new sampler), its problem unchanged."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        return set(recorded) <= set(now) and all(_same(v, now[k]) for k, v in recorded.items())
    if isinstance(recorded, str) and isinstance(now, str) and recorded != now and _grown_choices(recorded, now):
        return True
    if isinstance(recorded, str) and isinstance(now, str) and recorded != now and "; allowed: " in now:
        head, _, shown = recorded.partition("; allowed: ")
        now_head, _, now_shown = now.partition("; allowed: ")
        return head == now_head and set(shown.split(", ")) <= set(now_shown.split(", "))
    return bool(recorded == now)


def _mismatches(recorded: list[dict[str, Any]], answer: Any, inputs: list[Any], exact: bool = True) -> list[str]:
    out = []
    for want, given in zip(recorded, inputs, strict=True):
        got = answer(given)
        expected = {k: v for k, v in want.items() if k not in ("scheme", "label")}
        if (got != expected) if exact else not _same(expected, got):
            out.append(f"{str(given)[:300]}:\n  recorded {str(expected)[:300]}\n  now      {str(got)[:300]}")
    return out


def test_every_sweep_config_normalizes_to_the_recorded_scheme() -> None:
    for name in golden.SWEEPS:
        recorded = list(RECORDED["sweeps"][name].values())
        assert recorded, name
        wrong = _mismatches(recorded, golden.scheme_result, [r["scheme"] for r in recorded])
        assert not wrong, "\n".join(wrong[:5])


def test_scheme_mappings_give_the_recorded_scheme_or_error_text() -> None:
    schemes = [r["scheme"] for r in RECORDED["schemes"]]
    wrong = _mismatches(RECORDED["schemes"], golden.scheme_result, schemes, exact=False)
    assert not wrong, f"{len(wrong)} differ:\n" + "\n".join(wrong[:5])
    assert sum("error" in r for r in RECORDED["schemes"]) > 3000 and sum("spec" in r for r in RECORDED["schemes"]) > 500


def test_board_variants_give_the_recorded_board_or_error_text() -> None:
    variants = dict(golden.board_variants(RECORDED["board"]))  # the same changes (the file stores keys sorted)
    assert sorted(variants) == sorted(r["label"] for r in RECORDED["boards"])
    inputs = [variants[r["label"]] for r in RECORDED["boards"]]
    wrong = _mismatches(RECORDED["boards"], golden.board_result, inputs, exact=False)
    assert not wrong, f"{len(wrong)} differ:\n" + "\n".join(wrong[:5])
    assert sum("error" in r for r in RECORDED["boards"]) > 400 and sum("params" in r for r in RECORDED["boards"]) > 50


def test_a_normalized_spec_rebuilds_itself() -> None:
    for record in RECORDED["schemes"][:400]:
        if "spec" in record:
            spec = SchemeSpec.from_params(record["scheme"])
            assert SchemeSpec(**spec.to_dict()) == spec
            assert hash(SchemeSpec(**spec.to_dict())) == hash(spec)


@pytest.mark.parametrize("kind", list(PARTS))
def test_every_part_names_only_scheme_keys_once(kind: str) -> None:
    for part in PARTS[kind].values():
        names = [rule.name for rule in part.scheme_keys]
        assert len(names) == len(set(names)), part
        assert set(names) <= set(KNOWN_KEYS) - set(PARTS), part
        assert all(isinstance(rule, Key | Unused) for rule in part.scheme_keys), part
        assert {r.key for r in part.refuses} <= set(KNOWN_KEYS), part
        assert part.part == kind
