"""Real redis-servers for the tests, each on a free loopback port, stopped at the end (also on
failure): one with the module (RATELIMIT_MODULE, the .so), one without it (the Functions
library's), and `spawn_server()` for tests that kill or stop their own."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest
import redis

REPO = Path(__file__).resolve().parents[3]
MODULE = os.environ.get("RATELIMIT_MODULE") or str(REPO / "target/release/libredis_ratelimit.so")
LIBRARY = REPO / "lua-reference/functions/ratelimit.lua"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A redis-server of the test's own (never 6379)."""

    def __init__(self, module: Optional[str]):
        self.module = module
        if not shutil.which("redis-server"):
            pytest.skip("no redis-server on PATH (make deps installs it)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="rl-py-")
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--enable-debug-command", "local"]
        if module:
            args += ["--loadmodule", module]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.stopped = False
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server {' '.join(args)} did not start")
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, protocol: int = 2, **kwargs) -> redis.Redis:
        """A client whose replies may take up to 10 s (a loaded machine): a limiter on it waits
        that long (its default timeout is the client's socket_timeout)."""
        kwargs.setdefault("socket_timeout", 10)
        return redis.Redis(port=self.port, protocol=protocol, **kwargs)

    def stop(self) -> None:
        """SIGSTOP: the server holds its connections and answers nothing."""
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            if self.stopped:
                self.resume()
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_started: List[Server] = []


def spawn_server(module: bool) -> Server:
    if module and not os.path.isfile(MODULE):
        pytest.skip(f"no module at {MODULE} (make build, or RATELIMIT_MODULE=...)")
    server = Server(MODULE if module else None)
    _started.append(server)
    return server


@pytest.fixture(scope="session")
def module_server() -> Iterator[Server]:
    server = spawn_server(True)
    yield server
    server.kill()


@pytest.fixture(scope="session")
def library_server() -> Iterator[Server]:
    server = spawn_server(False)
    yield server
    server.kill()


@pytest.fixture(params=["module", "library"])
def server(request) -> Server:
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def fresh_server(request) -> Iterator[Server]:
    """A server of the test's own without the module (killed after the test)."""
    server = spawn_server(False)
    yield server
    server.kill()


def pytest_sessionfinish(session, exitstatus):
    for server in _started:
        server.kill()


_counter = [0]


@pytest.fixture
def key(request) -> str:
    """A key no other test uses."""
    _counter[0] += 1
    return f"t{_counter[0]}:{request.node.name[:40]}"
