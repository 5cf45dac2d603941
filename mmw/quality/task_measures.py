"""Task measures of the validation tasks (quality measure ``task``): pass@1 of generated code (HumanEval, run in
:mod:`mmw.sandbox`) and accuracy of multiple-choice answers. Light (no torch).

pass@1 with one sample per problem is the plain pass rate (the unbiased pass@k estimator with n = k = 1).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from mmw.quality.base import QualityMetric, SummaryColumn, Texts, number
from mmw.quality.params import QualityParams
from mmw.sandbox import SandboxLimits, isolation, run_tests
from mmw.tasks import CHOICES, JUDGE, HumanEvalProblem, task_references

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(response: str, entry_point: str) -> str:
    """The code in a chat response: the first fenced block that defines ``entry_point``, else the first fenced
    block, else the whole response (a model may answer with bare code). An unclosed last fence counts (the
    generation may stop at its token limit)."""
    blocks = _FENCE.findall(response)
    defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.MULTILINE)]
    if defining:
        return defining[0]
    return blocks[0] if blocks else response


def humaneval_program(problem: HumanEvalProblem, response: str) -> str:
    """The program under test for ``response``: the problem's prompt (imports, helpers, signature) and the model's
    code. The tests are not part of it: they run in the sandbox's harness (:func:`mmw.sandbox.run_tests`).

    Code that redefines the entry point replaces the prompt's stub (a later ``def`` wins); code that does not is
    taken as the body that continues the prompt's function, the way HumanEval completions are scored.
    """
    code = extract_code(response, problem.entry_point)
    defines = re.search(rf"^def\s+{re.escape(problem.entry_point)}\s*\(", code, re.MULTILINE)
    return problem.prompt + "    pass\n\n" + code if defines else problem.prompt + code


def humaneval_tests(problem: HumanEvalProblem) -> str:
    """The trusted source the harness runs: the prompt (for helpers the tests call, e.g. ``poly`` or
    ``encode_cyclic``; its stub of the entry point is replaced by the call into the program) and ``check``."""
    return f"{problem.prompt}\n    pass\n\n{problem.test}\n"


@dataclass(frozen=True)
class Verdict:
    """One generation's task score (1.0 pass / correct, 0.0 otherwise) and why (sandbox status, parse result)."""

    score: float
    status: str


def run_humaneval(problem: HumanEvalProblem, response: str, limits: SandboxLimits) -> Verdict:
    """Pass iff the sandbox's harness ran ``check`` to the end against the program: the verdict is the harness's
    exit status, which the program can neither write nor imitate (an early ``exit(0)``, a printed marker or an
    object equal to everything is no pass). Timeouts, crashes and sandbox refusals are failures, never
    exceptions."""
    result = run_tests(humaneval_program(problem, response), humaneval_tests(problem), problem.entry_point, limits)
    return Verdict(1.0 if result.passed else 0.0, result.status)


_BRACKETED = re.compile(r"[\[(]\s*([A-D])\s*[\])]")
_STATED = re.compile(r"\banswer\s*(?:is|:)?\s*:?\s*\(?([A-D])\b", re.IGNORECASE)
_LEADING = re.compile(r"^\s*([A-D])(?:[\s.):,]|$)")


def parse_choice(response: str, choices: Sequence[str] = ()) -> str | None:
    """The answer letter of a multiple-choice response: the first bracketed letter (the prompt asks for
    ``[X]``), else "answer is X", else a response that starts with the letter, else the one option whose full text
    the response contains (small models often answer with the option's words); None if none is found."""
    for pattern in (_BRACKETED, _STATED, _LEADING):
        match = pattern.search(response)
        if match and match.group(1).upper() in CHOICES:
            return match.group(1).upper()
    lowered = response.lower()
    named = [letter for letter, text in zip(CHOICES, choices, strict=False) if text.lower() in lowered]
    return named[0] if len(named) == 1 else None


def score_choice(answer: str, response: str, choices: Sequence[str] = ()) -> Verdict:
    chosen = parse_choice(response, choices)
    if chosen is None:
        return Verdict(0.0, "unparsed")
    return Verdict(float(chosen == answer), "correct" if chosen == answer else "wrong")


def task_verdicts(texts: pl.DataFrame, limits: SandboxLimits) -> list[Verdict | None]:
    """One verdict per row of ``texts`` (prompt_id, text); None for tasks measured by the judge only."""
    references = task_references(texts["prompt_id"].unique().to_list())
    verdicts: list[Verdict | None] = []
    for prompt_id, text in texts.select("prompt_id", "text").iter_rows():
        reference = references.get(prompt_id)
        if reference is None:
            verdicts.append(None)
        elif reference.problem is not None:
            verdicts.append(run_humaneval(reference.problem, text, limits))
        else:
            verdicts.append(score_choice(reference.answer, text, reference.choices))
    return verdicts


class TaskMeasure(QualityMetric):
    """pass@1 or accuracy where a task has one (null for judge-rated tasks, whose quality is the judge's Q). Needs
    the sandbox: refuses at construction where ``quality.sandbox`` cannot isolate code."""

    name = "task"
    columns = {"task_score": pl.Float64, "task_status": pl.String}
    header_defaults = {"sandbox": None}
    summary_columns = (SummaryColumn("task score base → wm", "task_score", percent=True, whole_or_none=True),)
    summary_note = "Task score: pass@1 (code run in the sandbox) or accuracy; judge-rated tasks show their Q above."

    def __init__(self, settings: QualityParams) -> None:
        super().__init__(settings)
        self.sandbox = isolation(settings.sandbox)  # refuses before any work

    def per_text(self, texts: Texts) -> dict[str, list]:
        settings = self.settings
        verdicts = task_verdicts(texts.table, SandboxLimits(settings.sandbox_timeout_s, settings.sandbox_memory_mb,
                                                            mode=settings.sandbox))
        return {"task_score": [v.score if v else None for v in verdicts],
                "task_status": [v.status if v else None for v in verdicts]}

    def header(self) -> dict[str, str]:
        return {"sandbox": self.sandbox.describe()}

    @classmethod
    def group(cls, rows: pl.DataFrame, measure: str | None, source: str) -> dict[str, float | None]:
        scores = rows["task_score"].drop_nulls()
        return {f"task_score_{source}": number(scores.mean()) if measure not in (None, JUDGE) and scores.len()
                else None}

    @classmethod
    def group_change(cls, numbers: dict) -> dict[str, float | None]:
        base, wm = numbers["task_score_baseline"], numbers["task_score_watermarked"]
        return {"task_score_delta": None if base is None or wm is None else wm - base}
