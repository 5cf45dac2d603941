"""A sweep on a real two-node Ray cluster on 127.0.0.1 (heavy): GPU placement, a node killed mid-config, results
equal to a local run, secrets absent from Ray's records, a restarted driver recomputing nothing.

The cluster: a head with 1 CPU and a second node with 1 CPU and one (declared, not real) GPU, so a GPU task can
only land on the second node and fails there at its first CUDA use, like a CUDA config on a broken GPU node.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from pipeline_repo import BIN, TWO_CONFIG_GRIDS, make_pipeline_repo, plain_shell_env, run, tiny_board

from mmw.keys import key_fingerprint, resolve_key
from mmw.sweep import load_sweep, pool_jobs
from mmw.sweep.runner import Job, Outcome, finished_experiments

pytestmark = pytest.mark.heavy

#: The repository's key, known to the workers through their own environment (`ray start` inherits it).
NODE_KEY = "ray-node-key-" + hashlib.sha256(b"test_ray node key").hexdigest()[:20]
#: A re-evaluation's fresh key: only the job's env holds it.
JOB_KEY = "ray-job-key-" + hashlib.sha256(b"test_ray job key").hexdigest()[:20]
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}

#: Two CPU configs at the tiny board's scale (the same pair as tests/test_sweep.py's good configs).
SWEEP = {"description": "ray test", "temperatures": [0.7], "reevaluate": {"k": 1, "first_seed": 1000},
         "grids": TWO_CONFIG_GRIDS}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ray(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run([str(BIN / "ray"), *args], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr


def _board() -> dict[str, Any]:
    board = tiny_board()
    board["rate"]["judge"] = "embedded:smollm2-135m"
    board["model"]["device"] = "cpu"  # pool configs are CPU tasks: either node may run them
    board["attacks"]["specs"] = [{"name": "swap", "p": 0.1}, {"name": "lowercase"}]
    return board


def _repo(path: Path, grids: list[dict[str, Any]] = TWO_CONFIG_GRIDS) -> Path:
    repo = make_pipeline_repo(path, _board())
    (repo / "sweeps").mkdir(exist_ok=True)
    (repo / "sweeps/t.yaml").write_text(yaml.safe_dump({**SWEEP, "grids": grids}, sort_keys=False))
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "pipeline")
    return repo


@pytest.fixture
def cluster() -> Iterator[dict[str, Any]]:
    """Head (1 CPU) + node 2 (1 CPU, 1 declared GPU, resource `node2`), both with MMW_KEY = NODE_KEY in their
    environment; `ray stop` always, or earlier through ``stop`` (its daemons then take no CPU from a local run)."""
    env = plain_shell_env({**THREADS, "MMW_KEY": NODE_KEY, "RAY_USAGE_STATS_ENABLED": "0"})
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    port = _free_port()
    common = ["--num-cpus", "1", "--object-store-memory", "100000000", "--disable-usage-stats"]
    try:
        _ray("start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-gpus", "0",
             "--include-dashboard", "true", "--dashboard-port", str(_free_port()), *common, env=env)
        _ray("start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.1", "--num-gpus", "1",
             "--resources", '{"node2": 1}', "--dashboard-agent-listen-port", str(_free_port()),
             "--dashboard-agent-grpc-port", str(_free_port()), "--metrics-export-port", str(_free_port()),
             "--runtime-env-agent-port", str(_free_port()), *common, env=env)
        yield {"address": f"127.0.0.1:{port}", "env": env,
               "stop": lambda: subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True,
                                              timeout=120)}
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)


def _node2_raylet() -> psutil.Process:
    """The raylet process of the node holding the `node2` resource (its static resource list names it)."""
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "raylet" and any(arg.startswith("--static_resource_list=node2,")
                                                 for arg in proc.info["cmdline"] or []):
            return proc
    raise AssertionError("no raylet with the node2 resource")


def _cmdline(proc: psutil.Process) -> str:
    """The command line of ``proc``, or "" when it has ended since it was listed (Ray's workers come and go
    between ``children()`` and ``cmdline()``: a race that failed a CI run with NoSuchProcess)."""
    try:
        return " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def _metrics(repo: Path) -> dict[str, Any]:
    return {name: json.loads(run(repo, "git", "show", f"{sha}:reports/metrics.json").stdout)
            for name, sha in finished_experiments(repo).items()}


def _outcomes(repo: Path) -> list[dict[str, Any]]:
    path = repo / ".dvc/tmp/sweeps/t/runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_a_ray_sweep_survives_a_dead_node_and_equals_the_local_run(cluster: dict[str, Any], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     request: pytest.FixtureRequest) -> None:
    from mmw.sweep.ray_executor import TASK_NAME, RayExecutor

    repo = _repo(tmp_path / "ray")
    for name, value in {**THREADS, "MMW_KEY": NODE_KEY}.items():
        monkeypatch.setenv(name, value)

    # 1. A CUDA config is placed on the GPU node only, and fails there for a real reason (no CUDA behind the
    # declared GPU): recorded once as failed with the stage's error, not retried. Its key (the job's env, the
    # way re-evaluations carry theirs) reached the worker: the key stage's fingerprint of it is in the shared
    # cache (DVC stores an output under the md5 of its content).
    gpu_job = Job(name="gpu-job", config_id="gpu", env={"MMW_KEY": JOB_KEY},
                  overrides={**pool_jobs(load_sweep(repo, "t"))[0].overrides, "model.device": "cuda"})
    outcomes: list[Outcome] = []
    executor = RayExecutor(repo, address=cluster["address"], echo=lambda _line: None)
    executor.run([gpu_job], outcomes.append)
    assert [o.status for o in outcomes] == ["failed"], outcomes
    assert "generate_baseline" in (outcomes[0].error or ""), outcomes
    assert list(executor.nodes) and all(c.failed == 1 for c in executor.nodes.values())
    monkeypatch.setenv("MMW_KEY", JOB_KEY)
    tag = (key_fingerprint(resolve_key(None)) + "\n").encode()
    monkeypatch.setenv("MMW_KEY", NODE_KEY)
    digest = hashlib.md5(tag).hexdigest()
    assert (repo / ".dvc/cache/files/md5" / digest[:2] / digest[2:]).is_file()

    # 2. The sweep through the command, from a plain shell; node 2 is killed (raylet and its workers, as when a
    # machine dies) while both configs run, one on each node, once a stage of its config runs.
    log_path = tmp_path / "driver.log"
    command = [str(BIN / "mmw"), "sweep", "run", "t", "--no-reevaluate", "--ray", cluster["address"]]
    with log_path.open("w") as log:
        driver = subprocess.Popen(command, cwd=repo, env=cluster["env"], stdout=log, stderr=subprocess.STDOUT)
        request.addfinalizer(lambda: driver.poll() is None and driver.kill())
        raylet = _node2_raylet()
        deadline = time.monotonic() + 600
        killed = ""  # the experiment name of node 2's config (`dvc exp run -n NAME`)
        while time.monotonic() < deadline and driver.poll() is None:
            lines = [_cmdline(p) for p in raylet.children(recursive=True)]
            runs = [line.split(" -n ", 1)[1].split()[0] for line in lines if "exp run" in line and " -n " in line]
            killed = killed or (runs[0] if runs else "")
            if killed and any("bin/mmw " in line for line in lines):  # a stage of it is running: mid-config
                break
            time.sleep(1)
        assert driver.poll() is None and killed, log_path.read_text()
        time.sleep(3)  # into the stage
        for proc in [*raylet.children(recursive=True), raylet]:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        driver.wait(timeout=1500)
    output = log_path.read_text()
    assert driver.returncode == 0, output
    names = {job.name for job in pool_jobs(load_sweep(repo, "t"))}
    assert set(finished_experiments(repo)) == names
    assert sorted(o["name"] for o in _outcomes(repo)) == sorted(names), _outcomes(repo)  # each once, done
    assert all(o["status"] == "done" for o in _outcomes(repo))
    assert "[ray]" in output and "done" in output

    # 3. Ray retried the killed config; no key appears in Ray's task records or its session logs.
    import ray

    ray.init(address=cluster["address"], logging_level="ERROR", log_to_driver=False)
    try:
        from ray.util.state import list_tasks

        tasks = list_tasks(filters=[("name", "=", TASK_NAME)], detail=True, limit=1000,
                           raise_on_missing_output=False)
    finally:
        ray.shutdown()
    assert max(t.attempt_number for t in tasks) >= 1, [(t.name, t.attempt_number, t.state) for t in tasks]
    records = repr([t.__dict__ if hasattr(t, "__dict__") else t for t in tasks])
    assert JOB_KEY not in records and NODE_KEY not in records
    logs = [p for p in Path("/tmp/ray/session_latest/logs").rglob("*") if p.is_file()]
    assert logs
    for path in logs:
        text = path.read_bytes()
        assert JOB_KEY.encode() not in text and NODE_KEY.encode() not in text, path

    # 4. A restarted driver finds both done and runs nothing.
    again = run(repo, "mmw", "sweep", "run", "t", "--no-reevaluate", "--ray", cluster["address"],
                env={**THREADS, "MMW_KEY": NODE_KEY})
    assert "done 2/2" in again.stdout and len(_outcomes(repo)) == 2, again.stdout

    # 5. The local run of the config Ray retried after the kill (its own repository and cache, the same key, the
    # cluster stopped): identical metrics. (The other config ran on the head like the retry, without a kill.)
    cluster["stop"]()
    job = next(job for job in pool_jobs(load_sweep(repo, "t")) if job.name == killed)
    local = _repo(tmp_path / "local", [grid for grid in TWO_CONFIG_GRIDS
                                       if grid["scheme.sampler"] == job.overrides["scheme.sampler"]])
    run(local, "mmw", "sweep", "run", "t", "--no-reevaluate", env={**THREADS, "MMW_KEY": NODE_KEY})
    assert set(_metrics(local)) == {killed}
    assert _metrics(local)[killed] == _metrics(repo)[killed]


# ---------------------------------------------------------------------------------------------- keys and timeouts
#: A stage that finishes at once for x = 1 and hangs for x = 2 (a config that would block a sweep forever).
_WORK = """import re, sys, time
x = int(re.search(r"^x: *(\\d+)", open("params.yaml").read(), re.M).group(1))
if x == 2:
    open(STARTED, "a").write("started\\n")
    time.sleep(3600)
open("out.txt", "w").write(str(x))
"""


def _tiny_dvc_repo(path: Path, started: Path) -> Path:
    """A git + DVC repository with one stage (`work.py`, param x) and a params key: no model, seconds a run. The
    hanging stage appends a line to ``started`` first."""
    path.mkdir(parents=True)
    (path / "params.yaml").write_text("key: ray-params-key-0123456789\nx: 1\n")
    (path / "dvc.yaml").write_text("stages:\n  work:\n    cmd: python3 work.py\n    deps: [work.py]\n"
                                   "    params: [x]\n    outs: [out.txt]\n")
    (path / "work.py").write_text(f"STARTED = {str(started)!r}\n" + _WORK)
    run(path, "git", "init", "-q")
    run(path, "dvc", "init", "-q")
    run(path, "dvc", "config", "core.analytics", "false")
    run(path, "git", "add", "-A")
    run(path, "git", "commit", "-qm", "tiny")
    return path


@pytest.fixture
def keyless_cluster() -> Iterator[dict[str, Any]]:
    """One head node (2 CPUs) started without MMW_KEY in its environment."""
    env = plain_shell_env({**THREADS, "RAY_USAGE_STATS_ENABLED": "0", "DVC_NO_ANALYTICS": "1"})
    env.pop("MMW_KEY", None)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    port = _free_port()
    try:
        _ray("start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
             "--num-gpus", "0", "--include-dashboard", "false", "--object-store-memory", "100000000",
             "--disable-usage-stats", env=env)
        yield {"address": f"127.0.0.1:{port}", "env": env}
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)


def _work_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if "work.py" in " ".join(p.info["cmdline"] or [])]


#: The hung config's limit. The quick config runs in a call of its own, without a limit to race (a tiny `dvc exp
#: run` took over 20 s on a loaded 2-core machine), so this bounds only the hung stage: each of its two attempts
#: costs this much, and each must reach its stage first (the test checks), which took ~8 s on a quiet machine.
TASK_TIMEOUT_S = 25


def test_nodes_must_hold_the_drivers_key_and_a_hung_config_times_out(keyless_cluster: dict[str, Any],
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from mmw.errors import SpecError
    from mmw.sweep.ray_executor import RayExecutor

    started_log = tmp_path / "hang.started"
    repo = _tiny_dvc_repo(tmp_path / "repo", started_log)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    quick = Job(name="quick", config_id="q", overrides={"x": 1})
    hang = Job(name="hang", config_id="h", overrides={"x": 2})

    # 1. The driver has MMW_KEY, the node has none: refused before any job is submitted, naming the node.
    monkeypatch.setenv("MMW_KEY", "driver-key-0123456789abcdef")
    outcomes: list[Outcome] = []
    executor = RayExecutor(repo, address=keyless_cluster["address"], echo=lambda _line: None,
                           task_timeout_s=TASK_TIMEOUT_S)
    with pytest.raises(SpecError, match=r"^MMW_KEY: node \S+ \w{8} has no MMW_KEY but the driver has one"):
        executor.run([quick], outcomes.append)
    assert outcomes == [] and not finished_experiments(repo)

    # 2. Neither has MMW_KEY (both use the params key of the commit): the quick config is done.
    monkeypatch.delenv("MMW_KEY")
    lines: list[str] = []
    RayExecutor(repo, address=keyless_cluster["address"], echo=lines.append).run([quick], outcomes.append)
    assert [o.status for o in outcomes] == ["done"], outcomes
    assert any("key checked on 1 nodes" in line for line in lines)

    # 3. The hung one is killed at the timeout with its stage process, recorded as failed, submitted once more,
    # failed again.
    executor = RayExecutor(repo, address=keyless_cluster["address"], echo=lines.append,
                           task_timeout_s=TASK_TIMEOUT_S, timeout_retries=1)
    started = time.monotonic()
    executor.run([hang], outcomes.append)
    took = time.monotonic() - started
    by_name = {name: [o for o in outcomes if o.name == name] for name in ("quick", "hang")}
    assert [o.status for o in by_name["quick"]] == ["done"], outcomes
    assert [o.status for o in by_name["hang"]] == ["failed", "failed"], outcomes
    assert all(f"timed out after {TASK_TIMEOUT_S} s" in (o.error or "") for o in by_name["hang"])
    assert all(TASK_TIMEOUT_S <= o.wall_s < TASK_TIMEOUT_S + 30 for o in by_name["hang"]), by_name["hang"]
    assert set(finished_experiments(repo)) == {"quick"}
    assert any("hang timed out" in line for line in lines)
    assert took < 300
    assert started_log.read_text().splitlines() == ["started"] * 2  # each attempt reached its stage ...
    assert _work_processes() == []  # ... and the hung stage died with its job


def test_key_problem_names_a_missing_or_different_key() -> None:
    """The per-job check on a worker (``key_problem``), without a cluster."""
    from mmw.keys import key_fingerprint, resolve_key
    from mmw.sweep.ray_executor import key_problem

    driver = "driver-key-0123456789abcdef"
    expected = key_fingerprint(resolve_key(driver, {}))
    assert key_problem(expected, True, {"MMW_KEY": driver}, None, "node a") is None
    assert key_problem(expected, False, {}, driver, "node a") is None  # params key, no MMW_KEY anywhere
    missing = key_problem(expected, True, {}, driver, "node a")  # the params key would match: still refused
    assert missing is not None and missing.startswith("MMW_KEY: not set on node a, but the driver has one")
    other = key_problem(expected, False, {"MMW_KEY": "another-key-0123456789ab"}, driver, "node a")
    assert other is not None and "holds another key" in other and "another-key" not in other
    short = key_problem(expected, True, {"MMW_KEY": "short"}, None, "node a")
    assert short is not None and short.startswith("MMW_KEY: the key has 5 characters")
