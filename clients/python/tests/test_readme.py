"""README.md's code, run: the FastAPI app under uvicorn driven by httpx (with the module, with
only the library, and with Redis unreachable), the Flask app through Flask's test client, the
"From code" program against its printed output, the client-side decisions' program likewise,
and the FastAPI dependencies."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import free_port

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks():
    """(python blocks, the text block after each, or None)."""
    text = README.read_text()
    found = re.findall(r"```python\n(.*?)```(\n\n<!-- output -->\n```text\n(.*?)```)?", text, re.S)
    found = [(code, output or None) for code, _, output in found]
    # Each block either runs here or is the API's import list (run by test_api.py).
    assert len(found) == 6, [code[:40] for code, _ in found]
    return found


def block(needle: str):
    """The python block containing `needle`, and its output block."""
    return next(b for b in blocks() if needle in b[0])


def load(code: str, name: str, tmp_path: Path):
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ratelimit(value: str):
    """`"name";r=R;t=T` items as [(name, r, t)]."""
    items = []
    for item in value.split(", "):
        name, r, t = re.fullmatch(r'"([^"]+)";r=(\d+);t=(\d+)', item).groups()
        items.append((name, int(r), int(t)))
    return items


class Uvicorn:
    def __init__(self, code: str, tmp_path: Path):
        (tmp_path / "readme_app.py").write_text(code)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "readme_app:app", "--port", str(self.port), "--log-level", "warning"],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"uvicorn did not start: {self.proc.stderr.read().decode()}")
                time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def away_from_a_minute_edge(client) -> None:
    """Waits (at most 15 s) until the server's clock is not in the last 15 s of a minute: the
    README's sliding window of a minute weighs the previous minute in, so a sequence crossing
    an edge would not count down one by one."""
    seconds, micros = client.time()
    into = seconds % 60 + micros / 1e6
    if into > 45:
        time.sleep(60 - into + 0.05)


def fastapi_app(url: str) -> str:
    code = block("RateLimitMiddleware")[0]
    assert 'from_url("redis://localhost:6379")' in code
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 10, f"the README's app is {len(lines)} lines"
    return code.replace("redis://localhost:6379", url)


@pytest.mark.parametrize("engine", ["module", "library"])
def test_the_fastapi_app_limits_each_api_key_with_headers(engine, request, tmp_path):
    server = request.getfixturevalue(f"{engine}_server")
    app = Uvicorn(fastapi_app(server.url), tmp_path)
    try:
        away_from_a_minute_edge(server.client())
        with httpx.Client(base_url=f"http://127.0.0.1:{app.port}", timeout=10) as client:
            key = f"readme-{engine}-{time.time_ns()}"
            answers = [client.get("/", headers={"X-API-Key": key}) for _ in range(101)]
            for i, response in enumerate(answers[:100]):
                assert response.status_code == 200 and response.json() == {"ok": True}
                assert response.headers["ratelimit-policy"] == '"default";q=100;w=60'
                [(name, r, t)] = ratelimit(response.headers["ratelimit"])
                assert (name, r) == ("default", 99 - i) and 1 <= t <= 120
                assert "retry-after" not in response.headers
            refused = answers[100]
            assert refused.status_code == 429
            body = refused.json()
            assert body["error"] == "rate limited" and body["policy"] == "default"
            retry = int(refused.headers["retry-after"])
            assert retry == -(-body["retry_after_ms"] // 1000) and 1 <= retry <= 120
            assert ratelimit(refused.headers["ratelimit"]) == [("default", 0, retry)]
            other = client.get("/", headers={"X-API-Key": key + "-other"})
            assert ratelimit(other.headers["ratelimit"])[0][1] == 99
            anonymous = client.get("/")
            assert anonymous.status_code == 200 and "ratelimit" not in anonymous.headers
        prefix = "fn:" if engine == "library" else ""
        assert server.client().exists(prefix + key) == 1
    finally:
        app.stop()


def test_the_fastapi_app_fails_open(tmp_path):
    app = Uvicorn(fastapi_app(f"redis://127.0.0.1:{free_port()}"), tmp_path)
    try:
        response = httpx.get(f"http://127.0.0.1:{app.port}/", headers={"X-API-Key": "k"}, timeout=10)
        assert response.status_code == 200 and "ratelimit" not in response.headers
    finally:
        app.stop()


def test_the_flask_app(module_server, tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", module_server.url)
    app = load(block("from flask import")[0], "readme_flask", tmp_path).app
    client = app.test_client()
    key = f"flask-{time.time_ns()}"
    away_from_a_minute_edge(module_server.client())
    first = client.get("/", headers={"X-API-Key": key})
    assert first.status_code == 200
    assert first.headers["RateLimit-Policy"] == '"default";q=100;w=60'
    assert ratelimit(first.headers["RateLimit"])[0][:2] == ("default", 99)
    upload = client.post("/upload", headers={"X-API-Key": key})
    assert upload.status_code == 200
    assert upload.headers["RateLimit-Policy"] == '"default";q=100;w=60, "upload";q=1;w=10'
    assert [item[:2] for item in ratelimit(upload.headers["RateLimit"])] == [("default", 98), ("upload", 0)]
    again = client.post("/upload", headers={"X-API-Key": key})
    assert again.status_code == 429 and again.json["policy"] == "upload"
    assert 1 <= int(again.headers["Retry-After"]) <= 10
    assert client.get("/").status_code == 200  # no key: not limited


def test_the_code_prints_what_the_readme_shows(module_server, tmp_path):
    code, output = block("limiter.lease(")
    (tmp_path / "program.py").write_text(code)
    env = dict(os.environ, REDIS_URL=module_server.url)
    module_server.client().delete("api:alice", "api:bob", "{alice}:sec", "{alice}:hour", "reports:acme")
    done = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == output


@pytest.mark.parametrize("engine", ["module", "library"])
def test_the_client_side_decisions_print_what_the_readme_shows(engine, request, tmp_path):
    server = request.getfixturevalue(f"{engine}_server")
    code, output = block("denial_cache=")
    (tmp_path / "program.py").write_text(code)
    env = dict(os.environ, REDIS_URL=server.url)
    prefix = "fn:" if engine == "library" else ""
    server.client().delete(prefix + "jobs:acme", prefix + "search:all")
    done = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == output.replace("module cache", f"{engine} cache")


def test_the_fastapi_dependencies_combine_through_check_all(module_server, tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", module_server.url)
    app = load(block("Depends(per_second)")[0], "readme_depends", tmp_path).app
    key = f"dep{time.time_ns()}"

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            started = time.monotonic()
            # One after the other: one connection (30 at once would open 30 under the 0.5 s timeout).
            answers = [await client.get("/search", headers={"X-API-Key": key}) for _ in range(12)]
            return answers, time.monotonic() - started

    answers, elapsed = asyncio.run(main())
    admitted = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(admitted) + len(refused) == 12 and len(admitted) >= 5
    if elapsed < 1:  # 5 a second: 12 within 1 s cannot all pass
        assert refused
    for a in admitted:
        assert a.headers["ratelimit-policy"] == '"per-second";q=5;w=1, "per-hour";q=1000;w=3600'
        assert [n for n, _, _ in ratelimit(a.headers["ratelimit"])] == ["per-second", "per-hour"]
    for a in refused:
        assert a.json()["detail"]["policy"] == "per-second" and int(a.headers["retry-after"]) == 1
    # All or nothing: the hour's limit took exactly the admitted requests.
    hour = module_server.client().execute_command("RATELIMIT.PEEK", f"{{{key}}}:hour", "token-bucket", 1000, "1h", "COST", 0)
    assert hour[2] == 1000 - len(admitted)
