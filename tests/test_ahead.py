"""A later stage's set-up run beside a decode (mmw.engines.ahead): when it runs, what the stage then takes, what
happens where it cannot run or fails, and where the decode loop lets it start."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmw import provenance
from mmw.engines import ahead, graph_decode
from mmw.engines.models import shared_loads, weight_bytes

CPU = torch.device("cpu")


@pytest.fixture
def room(monkeypatch):
    """Jobs may run on the CPU with ``room.free`` bytes free (off CUDA none runs otherwise); no job outlives a test."""
    state = SimpleNamespace(free=10 << 30)
    monkeypatch.setattr(ahead, "_free_bytes", lambda device: state.free)
    yield state
    ahead.forget()


class Build:
    """A job's build: records the thread it ran on, notes a model as a loader does, fails its first ``fails``
    calls."""

    def __init__(self, fails: int = 0):
        self.threads: list[str] = []
        self.fails = fails

    def __call__(self) -> object:
        self.threads.append(threading.current_thread().name)
        provenance.note("judge-model", "bfloat16", "cuda:0")
        if len(self.threads) <= self.fails:
            raise RuntimeError("out of memory on the side")
        return object()


def test_a_scheduled_job_runs_beside_and_its_stage_takes_the_same_object(room):
    provenance.reset_models()
    build = Build()
    ahead.schedule("judge", build, 1 << 30)
    assert ahead.pending() == ["judge"]
    assert ahead.device_busy(CPU)
    ahead.settle()
    assert build.threads == ["mmw-ahead"]
    assert provenance._MODELS == {}  # not the running stage's model
    first = ahead.take("judge", Build())
    assert ahead.take("judge", Build()) is first  # the next rate stage takes the judge the first one took
    assert build.threads == ["mmw-ahead"]


def test_a_job_without_room_waits_and_runs_in_its_stage(room):
    room.free = (1 << 30) + ahead.DEVICE_MARGIN_BYTES - 1
    build = Build()
    ahead.schedule("judge", build, 1 << 30)
    assert not ahead.device_busy(CPU)
    assert ahead.pending() == ["judge"]
    ahead.take("judge", build)
    assert build.threads == [threading.current_thread().name]


def test_a_job_of_unknown_size_never_runs_ahead(room):
    build = Build()
    ahead.schedule("judge", build, None)
    assert ahead.pending() == [] and not ahead.device_busy(CPU)
    ahead.take("judge", build)
    assert build.threads == [threading.current_thread().name]


def test_a_job_that_failed_beside_is_built_again_in_its_stage(room, caplog):
    build = Build(fails=1)
    ahead.schedule("judge", build, 1 << 30)
    assert ahead.device_busy(CPU)
    value = ahead.take("judge", build)  # waits for the side thread, then builds here
    assert value is not None and build.threads == ["mmw-ahead", threading.current_thread().name]
    assert "preparing judge ahead failed (RuntimeError: out of memory on the side)" in caplog.text


def test_jobs_that_fit_run_and_the_rest_wait(room):
    room.free = (3 << 30) + ahead.DEVICE_MARGIN_BYTES
    small, large = Build(), Build()
    ahead.schedule("small", small, 2 << 30)
    ahead.schedule("large", large, 2 << 30)  # 1 GiB short once the first has its 2
    assert ahead.device_busy(CPU)
    ahead.settle()
    assert small.threads == ["mmw-ahead"] and large.threads == [] and ahead.pending() == ["large"]


def test_a_job_beside_a_stage_waits_for_that_stage_and_then_any_decode(room):
    early, late = Build(), Build()
    ahead.schedule("early", early, 1)
    with ahead.beside(ahead.host("generate", "watermarked")):
        ahead.schedule("late", late, 1)
    assert ahead.pending() == ["early"]
    assert ahead.device_busy(CPU)  # the baseline's decode: the early job only
    ahead.settle()
    assert early.threads == ["mmw-ahead"] and late.threads == []
    ahead.stage_decodes(ahead.host("generate", "baseline"))
    assert ahead.pending() == []
    ahead.stage_decodes(ahead.host("generate", "watermarked"))  # its rows may all be written: a later decode hosts
    assert ahead.pending() == ["late"] and ahead.device_busy(CPU)
    ahead.settle()
    assert late.threads == ["mmw-ahead"]
    ahead.forget()
    assert ahead._DECODED == set()


def test_a_job_whose_stage_never_decodes_is_built_where_it_is_taken(room):
    build = Build()
    with ahead.beside(ahead.host("generate", "watermarked")):
        ahead.schedule("judge", build, 1)
    assert not ahead.device_busy(CPU)
    ahead.take("judge", build)
    assert build.threads == [threading.current_thread().name]


def test_each_stage_set_up_waits_for_the_last_decoding_stage_before_it_or_the_first(monkeypatch, room):
    """Through the pipeline's plan (dvc.yaml's stage order): the watermark step beside the baseline's decode, the
    judge beside the watermarked one, which the generate stage announces when it runs; the detector's kernels, whose
    module asks for the first decode (``AHEAD_BESIDE_FIRST``), beside the baseline's."""
    from mmw.sweep import pipeline
    from mmw.sweep.pipeline import Stage

    hosts = {}
    detect_first = importlib.import_module("mmw.stages.detect").AHEAD_BESIDE_FIRST  # the stage's own choice

    def hook(name):
        return lambda *args: hosts.__setitem__(name, ahead._BESIDE)

    modules = {"generate": SimpleNamespace(DECODES=True, schedule_ahead=hook("generate")),
               "detect": SimpleNamespace(AHEAD_BESIDE_FIRST=detect_first, schedule_ahead=hook("detect")),
               "rate": SimpleNamespace(schedule_ahead=hook("rate")), "prompts": SimpleNamespace()}
    plan = [Stage("prompts", "prompts", (), (), True), Stage("generate_baseline", "generate", ("baseline",), (), True),
            Stage("generate_watermarked", "generate", ("watermarked",), (), False),
            Stage("detect_baseline", "detect", ("baseline",), (), False),
            Stage("rate_baseline", "rate", ("baseline",), (), True)]
    def imported(name):
        return modules[name.rsplit(".", 1)[1]]

    monkeypatch.setattr(pipeline.importlib, "import_module", imported)
    pipeline.schedule_ahead(plan)
    assert hosts == {"generate": ("generate", "baseline"), "detect": ("generate", "baseline"),
                     "rate": ("generate", "watermarked")}
    hosts.clear()
    pipeline.schedule_ahead([s for s in plan if s.shared])  # a pack's shared stages: the baseline's decode hosts
    assert hosts == {"generate": None, "rate": ("generate", "baseline")}
    assert ahead._BESIDE is None


def test_no_job_runs_off_cuda():
    build = Build()
    ahead.schedule("judge", build, 1)
    try:
        assert not ahead.device_busy(CPU)
    finally:
        ahead.forget()


def test_shared_loads_forget_their_jobs(room):
    with shared_loads():
        ahead.schedule("judge", Build(), 1)
        assert ahead.device_busy(CPU)
    assert ahead.pending() == [] and ahead._JOBS == {}


def test_weight_bytes_of_a_folder_and_of_what_is_not_on_this_machine(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 300)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 200)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 400)  # the same weights again: not read where safetensors are
    assert weight_bytes(str(tmp_path)) == 500
    assert weight_bytes("embedded:smollm2-135m") is None
    assert weight_bytes("nobody-has/this-model-locally") is None


class _Graph:
    def __init__(self, log):
        self.log = log

    def replay(self):
        self.log.append("replay")

    def pool(self):
        return None


class _Decoder:
    """The state ``graph_decode._loop`` reads: its steps logged, a row unfinished until ``steps`` tokens."""

    def __init__(self, log, steps):
        self.log, self.steps = log, steps
        self.out = torch.zeros(1, steps, dtype=torch.int64)
        self.window = SimpleNamespace(key_limit=None)
        self.prompt_len, self.cache_len = 4, 4 + steps

    def any_unfinished(self):
        return True

    def step(self):
        self.log.append("step")


@pytest.mark.parametrize("flex", [True, False])
def test_the_decode_loop_frees_the_host_after_its_one_graph_first_replays(monkeypatch, flex):
    log: list[str] = []
    monkeypatch.setattr(graph_decode, "_capture", lambda dec, pool=None: log.append("capture") or _Graph(log))
    monkeypatch.setattr(ahead, "device_busy", lambda device: log.append("busy"))
    monkeypatch.setattr(graph_decode, "KEY_BUCKET", 4)
    done = graph_decode._loop(_Decoder(log, 20), graph=True, flex=flex, bounded=not flex, max_new_tokens=20)
    assert done == 20
    if flex:  # after the first replay only replays follow
        assert log[:log.index("busy")] == ["step", "step", "capture", "replay"] and log.count("busy") == 1
        assert set(log[log.index("busy") + 1:]) == {"replay"}
    else:  # a capture per key bound until the end: the host never is free
        assert "busy" not in log and log.count("capture") > 1


SMOLLM2 = "embedded:smollm2-135m"
PROMPTS = ["Write a story about a cat.", "Write a news article about the president's visit to Paris."]
TEXTS = ["The cat sat on the mat. It was a sunny day and the cat was happy. Then it slept by the fire.",
         "visit the a president news the capital city yesterday was on met ministers and Paris"]


def _rate_dir(root, monkeypatch):
    """A rate stage's workspace: the board (an in-process judge that is not the generator) and baseline texts."""
    import polars as pl
    import yaml

    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("MMW_JUDGE_CACHE", str(root / "judgements"))
    generator = {"name": "embedded:qwen2.5-coder-1.5b", "device": "cpu", "dtype": "float32", "batch_size": 2,
                 "max_new_tokens": 8, "temperature": 0.7, "engine": "transformers"}
    board = {"seed": 0, "model": generator,
             "rate": {"judge": SMOLLM2, "device": "cpu", "dtype": "float32", "batch_size": 2, "mode": "expected",
                      "max_new_tokens": 8}}
    (root / "params.yaml").write_text(yaml.safe_dump(board))
    (root / "data" / "generations").mkdir(parents=True)
    pl.DataFrame({"prompt_id": ["p0", "p1"], "task": ["story", "fake_news"], "prompt": PROMPTS, "text": TEXTS}
                 ).write_parquet(root / "data" / "generations" / "baseline.parquet")


@pytest.mark.heavy
def test_the_rate_stage_takes_the_judge_built_beside_and_rates_as_it_would_alone(tmp_path, monkeypatch, room):
    """The packed unit's path: the baseline's judge scheduled, built on the side thread, taken by the stage; the
    same ratings and the same provenance as the stage building its own judge."""
    import json

    import polars as pl

    from mmw.stages import rate
    from mmw.sweep.pipeline import Stage, schedule_ahead

    monkeypatch.setattr("mmw.engines.models.weight_bytes", lambda spec: 1 << 20)  # the embedded judge: a GGUF
    built_on, build = [], rate._in_process_backend

    def recorded(*args):
        built_on.append(threading.current_thread().name)
        return build(*args)

    monkeypatch.setattr(rate, "_in_process_backend", recorded)
    outputs = {}
    for name in ("alone", "ahead"):
        _rate_dir(tmp_path / name, monkeypatch)
        with shared_loads():
            if name == "ahead":
                schedule_ahead([Stage("rate_baseline", "rate", ("baseline",), (), True)])
                assert ahead.pending() and ahead.device_busy(CPU)
            rate.run("baseline", Path("params.yaml"))
        outputs[name] = (pl.read_parquet("data/ratings/baseline.parquet"),
                         json.loads(Path("reports/provenance/rate_baseline.json").read_text())["models"])
    assert built_on == [threading.current_thread().name, "mmw-ahead"]
    assert outputs["ahead"][0].equals(outputs["alone"][0])
    assert outputs["ahead"][1] == outputs["alone"][1] == {SMOLLM2: {"dtype": "float32", "device": "cpu"}}


def test_the_switch_interval_is_short_while_a_job_runs_and_put_back_after(room):
    before = sys.getswitchinterval()
    seen = []
    ahead.schedule("judge", lambda: seen.append(sys.getswitchinterval()), 1)
    assert ahead.device_busy(CPU)
    ahead.settle()
    assert seen == [min(before, ahead.SWITCH_INTERVAL_S)] and sys.getswitchinterval() == before


def test_the_aggregate_stage_imports_its_drawing_modules_ahead(room):
    from mmw.stages import aggregate

    aggregate.schedule_ahead(Path("params.yaml"))
    assert ahead.device_busy(CPU)
    ahead.settle()
    assert [job.state for job in ahead._JOBS.values()] == ["done"]  # every module found and imported
    assert all(name in sys.modules for name in aggregate.DRAWING_MODULES)


def test_a_value_built_ahead_with_a_problem_is_built_again_in_its_stage(room, caplog):
    build = Build()
    ahead.schedule("judge", build, 1)
    assert ahead.device_busy(CPU)
    ahead.take("judge", build, problem=lambda value: "compiling the judge failed (ValueError: signal)")
    assert build.threads == ["mmw-ahead", threading.current_thread().name]
    assert "compiling the judge failed (ValueError: signal)" in caplog.text


class _Base:
    def forward(self):
        return "base"


class _Child(_Base):
    pass


def test_swapped_sets_and_puts_back_attributes_inherited_ones_and_dict_items():
    table = {"kept": 1}
    with ahead.swapped(_Child, "forward", lambda self: "swapped"), ahead.swapped(table, "sdpa", "mine"), \
            ahead.swapped(table, "kept", 2):
        assert _Child().forward() == "swapped" and table == {"kept": 2, "sdpa": "mine"}
    assert "forward" not in vars(_Child) and _Child().forward() == "base"  # inherited again
    assert table == {"kept": 1}


def test_a_job_sees_shared_code_as_before_the_decodes_patches_and_they_return(room):
    seen = []
    ahead.schedule("judge", lambda: seen.append((_Child().forward(), ahead._get(_Child, "forward"))), 1)
    with ahead.swapped(_Child, "forward", lambda self: "fused"):
        assert ahead.device_busy(CPU)
        ahead.settle()
        assert _Child().forward() == "fused"  # back for the rest of the decoding stage
    assert seen == [("base", ahead._ABSENT)]


def test_the_fused_layer_classes_are_lifted_for_a_job_beside_the_decode(room):
    """The judge of the generator's architecture, built beside its decode, runs the classes' own forwards (fused
    ones would compile for its shapes and give other last bits than its stage's judge)."""
    from transformers.models.llama import modeling_llama

    from mmw.engines.fused_layers import fused_layers

    config = modeling_llama.LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1)
    model = modeling_llama.LlamaForCausalLM(config)
    own = (modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaMLP.forward, modeling_llama.apply_rotary_pos_emb)
    seen = []
    ahead.schedule("judge", lambda: seen.append((modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaMLP.forward,
                                                 modeling_llama.apply_rotary_pos_emb)), 1)
    with fused_layers(model) as replaced:
        assert len(replaced) == 3 and modeling_llama.LlamaRMSNorm.forward is not own[0]
        assert ahead.device_busy(CPU)
        ahead.settle()
        assert modeling_llama.LlamaRMSNorm.forward is not own[0]
    assert seen == [own]
    assert (modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaMLP.forward,
            modeling_llama.apply_rotary_pos_emb) == own


def _board(tmp_path: Path, **sections: dict) -> Path:
    """The repository's params.yaml with ``sections``' keys replaced (a section whose new keys name a ``sampler``:
    replaced whole), written under ``tmp_path``."""
    import yaml

    board = yaml.safe_load((Path(__file__).resolve().parent.parent / "params.yaml").read_text())
    for section, values in sections.items():
        board[section] = values if "sampler" in values else {**board[section], **values}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(board))
    return path


@pytest.mark.parametrize(("which", "sections", "scheduled"), [
    ("baseline", {}, True),
    ("baseline", {"detect": {"device": "cuda"}}, True),
    ("watermarked", {}, False),  # one job serves both stages
    ("baseline", {"detect": {"device": "cpu"}}, False),  # the CPU twin's parallel kernels: on the stage's thread
    ("baseline", {"detect": {"device": "reference"}}, False),
    ("baseline", {"scheme": {"sampler": "plugin", "plugin": "hf_synthid"}}, False),  # its own scoring code
])
def test_the_detect_stage_compiles_its_cuda_kernels_ahead_where_they_run(tmp_path, which, sections, scheduled, room):
    from mmw.stages import detect

    detect.schedule_ahead(which, _board(tmp_path, **sections))
    assert bool(ahead.pending()) == scheduled


def test_the_kernel_job_runs_the_stages_detector_on_random_ids_under_key_zero(tmp_path, monkeypatch, room):
    """The job builds the detector the stage builds (its scheme, vocabulary and device; key 0: a kernel's
    signature holds the key's type only) and scores a few texts of valid ids on the side thread; where the device
    resolves to the CPU it runs nothing there."""
    import numpy as np

    from mmw.kernels import backend
    from mmw.stages import detect

    built: list[tuple] = []

    class Spy:
        def __init__(self, scheme, key, vocab_size, device):
            built.append((scheme.sampler, key, vocab_size, device, threading.current_thread().name))
            self.vocab_size = vocab_size

        def score(self, texts):
            built.append([(t.dtype, len(t), int(t.min()) >= 0 and int(t.max()) < self.vocab_size) for t in texts])

    monkeypatch.setattr(detect, "build_detector", Spy)
    path = _board(tmp_path, detect={"device": "auto"})
    detect.schedule_ahead("baseline", path)
    assert ahead.device_busy(CPU)
    ahead.settle()
    assert built == [] and [job.value for job in ahead._JOBS.values()] == [False]  # no GPU here: nothing ran
    ahead.forget()
    monkeypatch.setattr(backend, "resolve_device", lambda device: "cuda")
    detect.schedule_ahead("baseline", path)
    assert ahead.device_busy(CPU)
    ahead.settle()
    _, vocab_size = detect.load_generator_vocabulary(detect.load_params(path, ("model",)).model)
    assert built[0] == ("distribution_shift", 0, vocab_size, "auto", "mmw-ahead")
    assert built[1] == [(np.dtype(np.int64), 48 - i, True) for i in range(3)]
