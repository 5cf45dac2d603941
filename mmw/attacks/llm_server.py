"""Serve a GGUF chat model over an OpenAI-compatible HTTP API on this machine, for the paraphrase attack.

The server is llama.cpp's own C++ server, reached through the prebuilt ``xllamacpp`` wheel (no compiler needed):
``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``, ``GET /slots``. It serves the model under
the name it was given (``embedded:smollm2-135m`` by default), so ``paraphrase`` with ``backend: openai`` and the
same ``model`` reaches it. Prompt caching is off: a cached prefix changes llama.cpp's numerics, so the same
greedy request could otherwise get a different reply the second time.

Run it in the foreground with ``python -m mmw.attacks.llm_server --model embedded:smollm2-135m --port 8000``, or
from Python as a child process with :class:`LocalLLMServer` (``with LocalLLMServer() as server: server.base_url``).

It listens on loopback by default. Any other ``--host`` needs an API key, read from the environment variable named
by ``--api-key-env`` (``MMW_LLM_SERVER_API_KEY``; never from the command line, where other users could read it):
without one the server refuses to start (one line, exit code 2). Clients send the key as a bearer token (the
``openai`` backends read it from their ``api_key_env``).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

import typer

from mmw.engines.models import EMBEDDED_PREFIX, embedded_gguf_path
from mmw.errors import SpecError

DEFAULT_MODEL = "embedded:smollm2-135m"
READY_PREFIX = "listening on "
KEY_ENV = "MMW_LLM_SERVER_API_KEY"


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address or ``localhost`` (names are not resolved: any other name is public)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_for(host: str, key_env: str) -> str | None:
    """The API key the server requires (from ``key_env``), or None on loopback without one; a
    :class:`SpecError` naming ``host`` for a non-loopback host without a key."""
    key = os.environ.get(key_env) or None
    if key is None and not is_loopback(host):
        raise SpecError("host", f"{host!r} is reachable from other machines and {key_env} is not set; refusing to "
                                f"serve without an API key (set {key_env}, or listen on loopback)",
                        "127.0.0.1, ::1, localhost, or any host with an API key")
    return key


def gguf_path(model: str) -> Path:
    """The GGUF file behind ``model``: ``embedded:<name>`` (a model shipped in a PyPI package) or a .gguf path."""
    if model.startswith(EMBEDDED_PREFIX):
        return embedded_gguf_path(model[len(EMBEDDED_PREFIX):])
    path = Path(model).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise SpecError("model", f"{model!r} is not an existing .gguf file", "embedded:smollm2-135m or a .gguf path")
    return path


def serve(
    model: str = typer.Option(DEFAULT_MODEL, help="embedded:<name> or a .gguf file"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, help="port; 0 picks a free one"),
    parallel: int = typer.Option(2, help="requests decoded concurrently (llama.cpp slots)"),
    ctx: int = typer.Option(8192, help="context tokens, shared by the slots"),
    threads: int = typer.Option(0, help="CPU threads; 0 = all cores"),
    exit_with_parent: bool = typer.Option(False, help="exit when stdin closes (the parent process ended)"),
    api_key_env: str = typer.Option(KEY_ENV, help="environment variable holding the API key clients must send; "
                                                  "required for a non-loopback host"),
) -> None:
    """Serve ``model`` until killed; prints ``listening on <url>`` once requests are accepted."""
    try:
        api_key = api_key_for(host, api_key_env)
    except SpecError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf_path(model))
    params.model_alias = {model}
    params.hostnames = [host]
    if api_key:
        params.api_keys = [api_key]
    params.port = port
    params.n_parallel = parallel
    params.n_ctx = ctx
    params.cache_prompt = False
    params.cpuparams.n_threads = threads or (os.cpu_count() or 1)
    params.cpuparams_batch.n_threads = params.cpuparams.n_threads
    server = xllamacpp.Server(params)
    print(f"{READY_PREFIX}{server.listening_address}", flush=True)
    if exit_with_parent:
        # A parent killed without cleanup cannot stop us, but its end closes our stdin: no orphaned servers.
        sys.stdin.read()
        os._exit(0)
    threading.Event().wait()  # the C++ server runs on its own threads; SIGTERM/SIGINT end the process


class LocalLLMServer:
    """Run :func:`serve` in a child process for the duration of a ``with`` block.

    ``base_url`` (``http://127.0.0.1:<port>/v1``) is set once the server answers ``/health``. The child's log goes
    to a temporary file, quoted when the server fails to start.
    """

    def __init__(self, model: str = DEFAULT_MODEL, parallel: int = 2, ctx: int = 8192, threads: int = 0,
                 startup_timeout_s: float = 120.0) -> None:
        self.model = model
        self.args = ["--model", model, "--host", "127.0.0.1", "--port", "0", "--parallel", str(parallel),
                     "--ctx", str(ctx), "--threads", str(threads), "--exit-with-parent"]
        self.startup_timeout_s = startup_timeout_s
        self.base_url = ""
        self._process: subprocess.Popen[str] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="mmw-llm-server-", suffix=".log", delete=False)

    @property
    def pid(self) -> int | None:
        """Process id of the server (None before start)."""
        return self._process.pid if self._process is not None else None

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:<port>`` (for llama.cpp's own endpoints such as ``/slots``)."""
        return self.base_url.removesuffix("/v1")

    def _fail(self, problem: str) -> RuntimeError:
        self.stop()
        log_tail = Path(self._log.name).read_text(errors="replace")[-2000:]
        return RuntimeError(f"LLM server for {self.model!r} {problem}; its log ends:\n{log_tail}")

    def start(self) -> LocalLLMServer:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mmw.attacks.llm_server", *self.args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
        )
        ready: list[str] = []
        # readline blocks; a reader thread lets the startup timeout apply even if the child hangs silently.
        reader = threading.Thread(target=lambda: ready.append(self._process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.startup_timeout_s)
        if not ready or not ready[0].startswith(READY_PREFIX):
            raise self._fail(f"did not start within {self.startup_timeout_s:.0f} s (exit code "
                             f"{self._process.poll()})")
        root = ready[0][len(READY_PREFIX):].strip()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{root}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline or self._process.poll() is not None:
                raise self._fail("never reported healthy")
            time.sleep(0.2)
        self.base_url = f"{root}/v1"
        return self

    def stop(self) -> None:
        """Terminate the child (kill it if it ignores SIGTERM for 10 s)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process is not None:
            for stream in (self._process.stdin, self._process.stdout):
                if stream is not None:
                    stream.close()
        self._log.close()

    def __enter__(self) -> LocalLLMServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
        Path(self._log.name).unlink(missing_ok=True)


if __name__ == "__main__":
    typer.run(serve)
