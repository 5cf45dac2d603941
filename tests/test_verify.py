"""``mmw verify`` and the numeric-path records, on synthetic committed / re-run files (no pipeline run)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mmw import provenance
from mmw.cli import app
from mmw.verify import (
    CHANGED,
    DIFFERS,
    EXACT,
    MISSING,
    WITHIN,
    compare_metrics,
    dir_reader,
    tolerance,
    verify,
)

METRICS = {
    "all": {"generations": 24, "quality_baseline": 80.0, "quality_watermarked": 68.0, "relative_quality": 0.85,
            "relative_quality_ci_low": 0.75, "relative_quality_ci_high": 0.95, "relative_quality_n": 24,
            "ratings_missing": 0, "size": 8.0, "detection_rate": 1.0, "tamper_resistance": 0.97,
            "fpr": 0.0, "fpr_ci_low": 0.0, "fpr_ci_high": 0.14, "fpr_n": 24, "mean_tokens": 196.0},
    "attacks": {"typo_p0.1": {"watermarked": 8 / 9, "quality_retained": 0.9, "size": 29.0, "n": 9, "n_failed": 0}},
    "judge": {"mode": "expected", "discriminates": True},
}
QUALITY = {"scorer": "embedded:smollm2-135m", "mauve": {"value": 0.99, "n_baseline": 24, "n_watermarked": 24},
           "groups": {"all": {"n_baseline": 24, "perplexity_baseline": 4.4, "repetition_2_baseline": 0.19}}}
LOCK = {"schema": "2.0", "stages": {
    "generate_baseline": {"cmd": "x", "outs": [{"path": "data/generations/baseline.parquet", "md5": "a" * 32}]},
    "aggregate": {"cmd": "y", "outs": [{"path": "reports/metrics.json", "md5": "b" * 32}]}}}


def record(flags: list[str], dtype: str = "float32", torch_version: str = "2.13.0") -> dict:
    return {"stage": "rate_baseline", "cpu": {"model": "Some CPU", "vendor": "GenuineIntel", "flags": flags},
            "gpus": [],
            "models": {"embedded:qwen2.5-coder-1.5b": {"dtype": dtype, "device": "cpu"}},
            "threads": {"torch_intra_op": 2}, "libraries": {"torch": torch_version, "numpy": "2.3.0"}}


def write_run(root: Path, metrics: dict, quality: dict = QUALITY, lock: dict = LOCK,
              records: dict[str, dict] | None = None) -> Path:
    (root / "reports").mkdir(parents=True, exist_ok=True)
    (root / "reports/metrics.json").write_text(json.dumps(metrics))
    (root / "reports/quality.json").write_text(json.dumps(quality))
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))
    for stage, rec in (records or {}).items():
        (root / "reports/provenance").mkdir(exist_ok=True)
        (root / f"reports/provenance/{stage}.json").write_text(json.dumps(rec))
    return root


def verdicts(rows) -> dict[str, str]:
    return {row.name: row.verdict for row in rows}


def test_identical_files_are_exact_everywhere(tmp_path):
    ref = write_run(tmp_path / "ref", METRICS)
    run = write_run(tmp_path / "run", copy.deepcopy(METRICS))
    report = verify(dir_reader(ref), dir_reader(run))
    assert {row.verdict for row in report.rows} == {EXACT}
    assert not report.failed and not report.path_known


def test_relative_quality_is_judged_against_the_committed_interval():
    inside = copy.deepcopy(METRICS)
    inside["all"]["relative_quality"] = 0.9499
    outside = copy.deepcopy(METRICS)
    outside["all"]["relative_quality"] = 0.9501
    assert verdicts(compare_metrics(METRICS, inside))["all/relative_quality"] == WITHIN
    assert verdicts(compare_metrics(METRICS, outside))["all/relative_quality"] == DIFFERS


def test_share_tolerance_admits_one_flip_of_nine_but_not_three():
    tol, rule = tolerance(METRICS, ("attacks", "typo_p0.1", "watermarked"))
    p = (8 + 1) / (9 + 2)
    assert rule == "share" and tol == pytest.approx(2 * math.sqrt(p * (1 - p) / 9))
    one_flip, three_flips = copy.deepcopy(METRICS), copy.deepcopy(METRICS)
    one_flip["attacks"]["typo_p0.1"]["watermarked"] = 1.0
    three_flips["attacks"]["typo_p0.1"]["watermarked"] = 5 / 9
    assert verdicts(compare_metrics(METRICS, one_flip))["attacks/typo_p0.1/watermarked"] == WITHIN
    assert verdicts(compare_metrics(METRICS, three_flips))["attacks/typo_p0.1/watermarked"] == DIFFERS


def test_ratings_move_with_the_relative_quality_uncertainty():
    tol, rule = tolerance(METRICS, ("all", "quality_baseline"))
    assert rule == "rating" and tol == pytest.approx(0.1 / 0.85 * 80.0)
    attack_tol, _ = tolerance(METRICS, ("attacks", "typo_p0.1", "quality_retained"))
    assert attack_tol == pytest.approx(0.1 / 0.85 * math.sqrt(24 / 9) * 0.9)


def test_design_counts_and_names_must_be_equal():
    changed = copy.deepcopy(METRICS)
    changed["all"]["generations"] = 23
    changed["judge"]["mode"] = "greedy"
    changed["all"]["fpr_n"] = 25
    found = verdicts(compare_metrics(METRICS, changed))
    assert found["all/generations"] == found["judge/mode"] == found["all/fpr_n"] == DIFFERS


def test_a_metric_missing_from_the_run_fails_and_a_new_one_is_listed(tmp_path):
    run_metrics = copy.deepcopy(METRICS)
    del run_metrics["all"]["size"]
    run_metrics["all"]["size_new"] = 3.0
    found = verdicts(compare_metrics(METRICS, run_metrics))
    assert found["all/size"] == MISSING and found["all/size_new"] == CHANGED
    ref = write_run(tmp_path / "ref", METRICS)
    run = write_run(tmp_path / "run", run_metrics)
    assert verify(dir_reader(ref), dir_reader(run)).failed


def test_a_null_that_becomes_a_number_differs():
    ref = copy.deepcopy(METRICS)
    ref["all"]["size"] = None
    assert verdicts(compare_metrics(ref, METRICS))["all/size"] == DIFFERS


def test_quality_file_rows_are_prefixed_and_judged(tmp_path):
    quality = copy.deepcopy(QUALITY)
    quality["groups"]["all"]["perplexity_baseline"] = 4.4 + 2 * 4.4 / math.sqrt(24) * 0.99
    quality["mauve"]["value"] = 0.5
    ref = write_run(tmp_path / "ref", METRICS)
    run = write_run(tmp_path / "run", METRICS, quality=quality)
    found = verdicts(verify(dir_reader(ref), dir_reader(run)).rows)
    assert found["quality/groups/all/perplexity_baseline"] == WITHIN
    assert found["quality/mauve/value"] == DIFFERS


def test_output_md5_changes_are_expected_on_another_path_and_a_finding_on_the_same(tmp_path):
    lock = copy.deepcopy(LOCK)
    lock["stages"]["generate_baseline"]["outs"][0]["md5"] = "c" * 32
    intel, amd = record(["avx2", "avx512f"]), record(["avx2", "avx512f", "avx512_bf16"])
    ref = write_run(tmp_path / "ref", METRICS, records={"rate_baseline": intel})
    other = write_run(tmp_path / "other", METRICS, lock=lock, records={"rate_baseline": amd})
    same = write_run(tmp_path / "same", METRICS, lock=lock, records={"rate_baseline": intel})
    across = verify(dir_reader(ref), dir_reader(other))
    assert across.path_known and not across.same_path and not across.failed
    assert verdicts(across.rows)["dvc.lock: data/generations/baseline.parquet"] == CHANGED
    assert ("rate_baseline", "cpu.flags", "avx2 avx512f", "avx2 avx512f avx512_bf16") in across.path_differences
    on_same = verify(dir_reader(ref), dir_reader(same))
    assert on_same.same_path and on_same.failed
    assert verdicts(on_same.rows)["dvc.lock: data/generations/baseline.parquet"] == DIFFERS


def test_on_the_same_path_a_move_within_tolerance_is_a_finding(tmp_path):
    moved = copy.deepcopy(METRICS)
    moved["all"]["quality_baseline"] = 80.5
    rec = {"rate_baseline": record(["avx2"])}
    report = verify(dir_reader(write_run(tmp_path / "ref", METRICS, records=rec)),
                    dir_reader(write_run(tmp_path / "run", moved, records=rec)))
    assert verdicts(report.rows)["all/quality_baseline"] == DIFFERS and report.failed


def test_provenance_differences_name_dtype_library_and_missing_records():
    ref = {"rate_baseline": record(["avx2"]), "quality": record(["avx2"])}
    run = {"rate_baseline": record(["avx2"], dtype="bfloat16", torch_version="2.11.0")}
    found = provenance.differences(ref, run)
    assert ("rate_baseline", "models.embedded:qwen2.5-coder-1.5b", "float32 on cpu", "bfloat16 on cpu") in found
    assert ("rate_baseline", "libraries.torch", "2.13.0", "2.11.0") in found
    assert ("quality", "record", "present", None) in found
    renamed = copy.deepcopy(ref["rate_baseline"])
    renamed["cpu"]["model"] = "Another CPU, same instruction sets"
    assert provenance.differences({"rate_baseline": ref["rate_baseline"]}, {"rate_baseline": renamed}) == []


def test_a_clone_without_the_dvc_cache_reads_the_committed_records(tmp_path):
    """The per-stage records are DVC-cached (absent from a clone); reports/provenance.json, committed with the
    metrics, holds them all: verify reads it where the per-stage files are missing, so a clone knows the committed
    run's numeric path."""
    intel = record(["avx2", "avx512f"])
    ref = write_run(tmp_path / "ref", METRICS)  # a clone: no reports/provenance/<stage>.json
    (ref / "reports/provenance.json").write_text(json.dumps({"rate_baseline": intel}))
    same = write_run(tmp_path / "same", METRICS, records={"rate_baseline": intel})
    report = verify(dir_reader(ref), dir_reader(same))
    assert report.path_known and report.same_path and not report.failed
    other = write_run(tmp_path / "other", METRICS, records={"rate_baseline": record(["avx2"])})
    assert ("rate_baseline", "cpu.flags", "avx2 avx512f", "avx2") in verify(dir_reader(ref), dir_reader(other)
                                                                              ).path_differences


def test_the_engine_section_is_recorded_and_decides_the_path_only_on_a_gpu(tmp_path):
    """A stage that reads params ``engine`` records it; two GPU runs under other engine switches are on other
    numeric paths, two CPU runs are not (no switch acts on a CPU)."""
    from mmw.params import EngineParams

    provenance.reset_models()
    provenance.note_engine(EngineParams(decode_attention="sdpa"))
    provenance.write("generate_baseline", tmp_path)
    written = json.loads((tmp_path / "generate_baseline.json").read_text())
    assert written["engine"] == EngineParams(decode_attention="sdpa").model_dump()
    assert written["engine"]["decode_attention"] == "sdpa" and written["engine"]["static_decode"] is True
    provenance.reset_models()
    provenance.write("generate_baseline", tmp_path)
    assert "engine" not in json.loads((tmp_path / "generate_baseline.json").read_text())  # forgotten per stage
    cpu_a, cpu_b = record(["avx2"]), record(["avx2"])
    cpu_a["engine"], cpu_b["engine"] = EngineParams().model_dump(), EngineParams(compile_step=False).model_dump()
    assert provenance.differences({"rate_baseline": cpu_a}, {"rate_baseline": cpu_b}) == []
    gpu = [{"name": "NVIDIA H200", "capability": "9.0"}]
    gpu_a, gpu_b = dict(cpu_a, gpus=gpu), dict(cpu_b, gpus=gpu)
    assert provenance.differences({"rate_baseline": gpu_a}, {"rate_baseline": gpu_b}) == [
        ("rate_baseline", "engine.compile_step", "True", "False")]


def test_cpu_record_reads_model_and_relevant_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"
                    "flags\t\t: fpu sse avx2 avx512f avx512_bf16 fma\n")
    assert provenance.cpu(info) == {"model": "AMD EPYC", "vendor": "AuthenticAMD",
                                    "flags": ["avx2", "fma", "avx512f", "avx512_bf16"]}
    assert provenance.cpu(tmp_path / "absent") == {"model": "unknown", "vendor": "unknown", "flags": []}


def test_record_is_written_atomically_only_for_numeric_stages(tmp_path):
    provenance.reset_models()
    provenance.write("rate_baseline", tmp_path)
    provenance.write("prompts", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rate_baseline.json"]
    written = json.loads((tmp_path / "rate_baseline.json").read_text())
    assert set(written) == {"stage", "cpu", "gpus", "models", "threads", "libraries"}
    assert written["libraries"]["numpy"]  # installed, so versioned


def test_cli_exit_codes(tmp_path):
    ref = write_run(tmp_path / "ref", METRICS)
    same = write_run(tmp_path / "same", METRICS)
    far = copy.deepcopy(METRICS)
    far["all"]["relative_quality"] = 0.5
    worse = write_run(tmp_path / "worse", far)
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", "--reference", str(ref), "--run", str(same), "--json", str(tmp_path / "v.json")])
    assert ok.exit_code == 0, ok.output
    assert "result: reproduced" in ok.output
    assert json.loads((tmp_path / "v.json").read_text())["failed"] is False
    bad = runner.invoke(app, ["verify", "--reference", str(ref), "--run", str(worse)])
    assert bad.exit_code == 1 and "all/relative_quality" in bad.output and "DIFFERS" in bad.output
    none = runner.invoke(app, ["verify", "--reference", str(tmp_path / "nowhere"), "--run", str(same)])
    assert none.exit_code == 2


def test_summary_and_page_show_the_numeric_path(tmp_path):
    from test_html_report import make_single_run

    from mmw.reporting import data
    from mmw.reporting.page import render_single

    make_single_run(tmp_path)
    amd = record(["avx2", "avx512f", "avx512_bf16"], dtype="bfloat16")
    (tmp_path / "reports/provenance").mkdir()
    (tmp_path / "reports/provenance/rate_baseline.json").write_text(json.dumps(amd))
    records = provenance.read_all(tmp_path / "reports/provenance")
    summary = provenance.markdown(records)
    assert "avx512_bf16" in summary and "embedded:qwen2.5-coder-1.5b: bfloat16 on cpu" in summary
    run = data.load_single_run(tmp_path / "reports", tmp_path / "params.yaml")
    html = render_single(run, None, "now")
    assert "Some CPU (avx2 avx512f avx512_bf16)" in html and "bfloat16 on cpu" in html and "torch 2.13.0" in html


def test_dvc_yaml_declares_each_record_and_aggregate_reads_them():
    stages = yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text())["stages"]
    for stage in provenance.STAGES:
        # cached like every output: an uncached output keeps DVC's run-cache from restoring the stage
        record_outs = [out for out in stages[stage]["outs"] if out == f"reports/provenance/{stage}.json"]
        assert record_outs == [f"reports/provenance/{stage}.json"], stage
        assert f"reports/provenance/{stage}.json" in stages["aggregate"]["deps"]
    data_stages = set(stages) - {"aggregate"}  # only the summary reads the records, never a data stage
    assert not any("reports/provenance" in str(dep) for name in data_stages for dep in stages[name].get("deps", []))
