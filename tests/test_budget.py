"""The suite's time budget (tests/budget.json): a file that collects more tests than its budget fails the run until
the budget is refreshed with `.venv/bin/python tests/budget.py --update` (docs/TESTING.md)."""

from __future__ import annotations

from budget import load, over_budget
from conftest import MACHINE_WIDE, file_order


def test_every_collected_file_is_within_its_budget(collected_per_file: dict[str, int]) -> None:
    problems = over_budget(collected_per_file, load())
    assert not problems, ("tests grew past tests/budget.json; time them and refresh the budget with "
                          "`.venv/bin/python tests/budget.py --update`:\n" + "\n".join(problems))


def test_growth_and_new_files_are_caught_and_shrinking_is_not() -> None:
    budget = {"files": {"test_a.py": {"tests": 3, "seconds": 10.0}, "test_b.py": {"tests": 2, "seconds": 1.0}}}
    assert over_budget({"test_a.py": 3, "test_b.py": 1}, budget) == []
    assert over_budget({"test_a.py": 4, "test_c.py": 1}, budget) == ["test_a.py: 4 tests > budget 3",
                                                                     "test_c.py: 1 tests, no budget"]


def test_files_go_slowest_first_and_lock_partners_apart() -> None:
    (first, second), *_ = [pair for pair in _lock_pairs()]
    seconds = {first: 500.0, second: 300.0, "test_x": 400.0, "test_y": 200.0, "test_z": 200.0, "test_w": 10.0}
    order = file_order(seconds)
    assert order[:2] == [first, "test_x"]
    # The other process works through test_x, test_y (600 s >= 500 s) before the second lock holder comes up.
    assert order.index(second) == order.index("test_y") + 1
    assert sorted(order) == sorted(seconds)


def _lock_pairs() -> list[tuple[str, str]]:
    by_lock: dict[str, list[str]] = {}
    for stem, lock in MACHINE_WIDE.items():
        by_lock.setdefault(lock, []).append(stem)
    return [(stems[0], stems[1]) for stems in by_lock.values() if len(stems) >= 2]


def test_junit_times_are_summed_per_file(tmp_path) -> None:
    from budget import junit_seconds

    report = tmp_path / "run.xml"
    report.write_text('<testsuites><testsuite name="pytest">'
                      '<testcase classname="tests.test_budget" name="a" time="1.5"/>'
                      '<testcase classname="tests.test_budget" name="b" time="2.0"/>'
                      '<testcase classname="tests.test_budget.Group" name="c" time="0.25"/>'
                      '</testsuite></testsuites>')
    assert junit_seconds(report) == {"test_budget.py": 3.75}
