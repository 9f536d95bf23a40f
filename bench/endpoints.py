"""HTTP endpoints for the dispatch benchmark, each in a process of its own.

* :func:`fast_endpoint` answers every request with 200 "ok" as fast as the machine allows:
  Debian's nginx when it is installed, otherwise an aiohttp server. It stands for a worker
  that costs nothing, so what is measured is the dispatcher.
* :class:`Recorder` (``python bench/endpoints.py record PORT``) also answers 200, and notes
  when each request arrived (``time.time()``) with its ``pgmb-message-id``; ``GET /dump``
  returns what it noted as JSON. nginx cannot timestamp arrivals precisely enough, so
  latency is measured against this one.

Each runs in a separate process so that the benchmark's own work never delays an answer.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

NGINX = "/usr/sbin/nginx"

NGINX_CONF = """
daemon off;
# One process: the machine has 2 cores and the dispatcher and PostgreSQL need them more.
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # Keep-alive connections live for the whole run, as a pooled client expects.
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "ok"; }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"endpoint exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"endpoint not listening on port {port} after {seconds:g}s")


class Endpoint:
    """A server process on 127.0.0.1; stopped (and its files removed) by :meth:`stop`."""

    def __init__(self, kind: str, argv: list[str], port: int, tmp: str | None = None) -> None:
        self.kind = kind
        self.port = port
        self._tmp = tmp
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        try:
            _wait_listening(port, self._proc)
        except BaseException:
            self.stop()
            raise

    def describe(self) -> str:
        if self.kind != "nginx":
            return self.kind
        version = subprocess.run([NGINX, "-v"], capture_output=True, text=True, check=False)
        return version.stderr.strip().replace("nginx version: ", "")

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def pid(self) -> int:
        """The server's process (nginx runs as one process, without a master)."""
        return self._proc.pid

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fast_endpoint() -> Endpoint:
    """nginx answering 200 "ok" when installed, else the aiohttp stand-in."""
    port = free_port()
    if Path(NGINX).exists():
        tmp = tempfile.mkdtemp(prefix="pgmb-bench-nginx.")
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=tmp, port=port))
        # -e: nginx 1.19.5+ otherwise opens the default error log before reading the config.
        argv = [NGINX, "-c", str(conf), "-p", tmp, "-e", f"{tmp}/error.log"]
        return Endpoint("nginx", argv, port, tmp)
    return Endpoint("aiohttp", [sys.executable, __file__, "ok", str(port)], port)


def recorder() -> Recorder:
    port = free_port()
    return Recorder("recorder", [sys.executable, __file__, "record", str(port)], port)


class Recorder(Endpoint):
    def arrivals(self) -> dict[str, float]:
        """Message id -> first arrival time (``time.time()``) of everything received."""
        with urllib.request.urlopen(self.url("/dump"), timeout=30) as response:
            pairs = json.load(response)
        first: dict[str, float] = {}
        for message_id, at in pairs:
            first.setdefault(message_id, at)
        return first

    def count(self) -> int:
        with urllib.request.urlopen(self.url("/count"), timeout=30) as response:
            return int(response.read())


# --- The server processes. ---


def _serve(port: int, record: bool) -> None:
    import asyncio
    import signal

    from aiohttp import web

    arrivals: list[tuple[str, float]] = []
    ok = web.Response  # bound once: this is the whole per-request cost we add

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        now = time.time()
        if request.method == "GET" and request.path == "/dump":
            return ok(body=json.dumps(arrivals).encode(), content_type="application/json")
        if request.method == "GET" and request.path == "/count":
            return ok(text=str(len(arrivals)))
        await request.read()
        if record:
            arrivals.append((request.headers.get("pgmb-message-id", ""), now))
        return ok(text="ok")

    async def main() -> None:
        server = web.Server(handler, access_log=None)
        runner = web.ServerRunner(server)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


if __name__ == "__main__":
    _serve(int(sys.argv[2]), record=sys.argv[1] == "record")
