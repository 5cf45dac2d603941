"""A bad plugin stops ``dvc exp run`` in its first stage (``key``), before anything heavy, and changes nothing but
what DVC itself writes, which the error says how to restore.

One copy of this checkout (``tests/pipeline_repo.py``) with test_plugins.py's fake plugins on its path, the key
stage run and committed once. One case goes through ``dvc exp run`` (a detector whose p-values exceed 1, caught
by the contract check on a synthetic batch, the latest point a plugin can fail); the others fail in the same
stage the same way and are checked through the ``key`` command in this process, as DVC runs it (``DVC_EXP_NAME``
set): a ``dvc exp run`` costs ~30 s here, mostly the stage process loading torch. bench/plugins.py ``--exp-run``
runs all eight through ``dvc exp run``.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline_repo import copy_checkout, run
from test_plugins import ENTRY_POINTS, FAKE, fake_dist  # noqa: F401  (a fixture)

pytestmark = pytest.mark.heavy

NULLED = [f"scheme.{k}=null" for k in ("randomness", "window", "delta", "gamma", "score")]
RESTORE = "`git checkout -- params.yaml` restores the committed file"


def install_fake_plugins(repo: Path) -> Path:
    """test_plugins.py's in-test plugins as an installed distribution on the path of ``repo``'s .venv."""
    site = repo.parent / f"{repo.name}-plugins"
    site.mkdir(exist_ok=True)
    (site / "mmw_fake_watermarks.py").write_text(FAKE)
    (site / "mmw_fake_watermarks_broken.py").write_text("raise ImportError('libfoo.so: cannot open shared object')\n")
    info = site / "mmw_fake_watermarks-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mmw-fake-watermarks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    purelib = subprocess.run([str(repo / ".venv/bin/python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_mmw_fake_plugins.pth").write_text(f"{site}\n")
    return site


def disk_state(repo: Path) -> dict[str, str]:
    """What a run may change: params.yaml, dvc.lock and every file under data/ (by content), the DVC cache's files
    (by name: content-addressed) and the git refs."""
    state = {f"file {p.relative_to(repo)}": hashlib.md5(p.read_bytes()).hexdigest()
             for p in [repo / "params.yaml", repo / "dvc.lock", *sorted((repo / "data").rglob("*"))] if p.is_file()}
    state |= {f"cache {p.relative_to(repo / '.dvc/cache')}": "" for p in (repo / ".dvc/cache").rglob("*") if p.is_file()}
    refs = run(repo, "git", "for-each-ref", "--format=%(refname) %(objectname)").stdout.split("\n")
    state |= {f"ref {line.split()[0]}": line.split()[1] for line in refs if line}
    return state


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = copy_checkout(tmp_path_factory.mktemp("plugin-exp-run") / "repo")
    install_fake_plugins(repo)
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "checkout")
    run(repo, "dvc", "repro", "key")
    run(repo, "git", "add", "-A")
    # --allow-empty: with a current dvc.lock the key stage changes no tracked file (its output is git-ignored).
    run(repo, "git", "commit", "-qm", "key stage", "--allow-empty")
    return repo


def test_a_bad_plugin_stops_dvc_exp_run_in_the_key_stage_and_changes_only_params_yaml(repo):
    """A detector whose p-values exceed 1, caught by the contract check on a synthetic batch."""
    overrides = ["scheme.plugin=badp"]
    message = "error: scheme.plugin (badp): the detector returned a p-value outside [0, 1] (1.5 at prefix 1)"
    before = disk_state(repo)
    args = [a for o in ["scheme.sampler=plugin", *overrides, *NULLED] for a in ("-S", o)]
    done = run(repo, "dvc", "exp", "run", *args, check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(message) and errors[0].endswith(RESTORE), output[-3000:]
    assert "Running stage 'key'" in output and output.count("Running stage") == 1  # nothing after the key stage
    after = disk_state(repo)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    # DVC's own bookkeeping ref (refs/exps/exec/EXEC_HEAD) is left by every workspace dvc exp run, failed or not.
    assert changed <= {"file params.yaml", "ref refs/exps/exec/EXEC_HEAD"} and "file params.yaml" in changed
    run(repo, "git", "checkout", "--", "params.yaml")  # what the error says
    restored = disk_state(repo)
    assert {k for k in before.keys() | restored.keys() if before.get(k) != restored.get(k)} <= {
        "ref refs/exps/exec/EXEC_HEAD"}


@pytest.mark.parametrize(("plugin", "message"), [
    ("toy delta=-1.0", "scheme.plugin_params.delta: -1.0 is out of range (plugin 'toy': Toy green list); allowed: a "
                     "number > 0"),
    ("nosuch", "scheme.plugin: no watermark plugin 'nosuch' is installed"),
    ("broken", "scheme.plugin: plugin 'broken' (mmw_fake_watermarks_broken:Anything) failed to load: ImportError"),
    ("notplugin", "scheme.plugin: plugin 'notplugin' (mmw_fake_watermarks:not_a_plugin) is not a"),
    ("shape", "scheme.plugin (shape): the processor changed the batch's shape from (2, 49152) to (2, 49151)"),
    ("nan", "scheme.plugin (nan): the processor returned NaN or +inf scores"),
    ("nonull", "scheme.plugin (nonull): the detector returned per-token pivots without a declared null"),
])
def test_every_bad_plugin_fails_the_key_stage_with_one_line_and_the_restore_hint(repo, fake_dist, plugin, message,
                                                                                 tmp_path, monkeypatch):
    """The key stage in this process as ``dvc exp run`` starts it (DVC_EXP_NAME set), in the copy, on a board with
    the plugin: exit 2, one line naming the plugin and how to restore params.yaml, the fingerprint untouched."""
    from typer.testing import CliRunner

    from mmw.cli import app

    board = yaml.safe_load((repo / "params.yaml").read_text())
    name, _, setting = plugin.partition(" ")
    board["scheme"] = {"sampler": "plugin", "plugin": name, "alpha": 0.02,
                       "plugin_params": setting.replace("=", ": ").join("{}") if setting else None}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(board))
    fingerprint = (repo / "data/key.fingerprint").read_bytes()
    monkeypatch.chdir(repo)
    monkeypatch.setenv("DVC_EXP_NAME", "test")
    result = CliRunner().invoke(app, ["key", "--params", str(params)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output[-3000:]
    assert lines[0].startswith(f"error: {message}") and lines[0].endswith(RESTORE)
    assert (repo / "data/key.fingerprint").read_bytes() == fingerprint
