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

from conftest import free_port, spawn_server

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


#: The snippets' limiters get this timeout here instead of the default 0.1 s: a test machine
#: running other suites at once can take longer than that, and a timed-out call fails open.
PATIENT = 5


def patient(code: str) -> str:
    """The snippet with `timeout=PATIENT` given to the limiters' `from_url`."""
    patched, n = re.subn(r'(Limiter\.from_url\(os\.environ\.get\("REDIS_URL", "redis://localhost:6379"\))',
                         rf"\1, timeout={PATIENT}", code)
    assert n <= 1
    return patched


def fastapi_app(url: str) -> str:
    code = block("RateLimitMiddleware")[0]
    assert 'from_url("redis://localhost:6379")' in code
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 10, f"the README's app is {len(lines)} lines"
    return code.replace('from_url("redis://localhost:6379")', f'from_url("{url}", timeout={PATIENT})')


def drive_the_fastapi_app(server, tmp_path: Path, key: str) -> None:
    """101 requests of `key`: 100 admitted counting down, the 101st refused; requests without a
    key are limited on the client's address (uvicorn trusts X-Forwarded-For from loopback)."""
    app = Uvicorn(fastapi_app(server.url), tmp_path)
    try:
        away_from_a_minute_edge(server.client())
        with httpx.Client(base_url=f"http://127.0.0.1:{app.port}", timeout=10) as client:
            for headers, stored in (({"X-API-Key": key}, key), ({}, "ip:127.0.0.1")):
                answers = [client.get("/", headers=headers) for _ in range(101)]
                for i, response in enumerate(answers[:100]):
                    assert response.status_code == 200 and response.json() == {"ok": True}
                    assert response.headers["ratelimit-policy"] == '"default";q=100;w=60'
                    [(name, r, t)] = ratelimit(response.headers["ratelimit"])
                    assert (name, r) == ("default", 99 - i) and 1 <= t <= 120, (headers, i, response.headers)
                    assert "retry-after" not in response.headers
                refused = answers[100]
                assert refused.status_code == 429, headers
                body = refused.json()
                assert body["error"] == "rate limited" and body["policy"] == "default"
                retry = int(refused.headers["retry-after"])
                assert retry == -(-body["retry_after_ms"] // 1000) and 1 <= retry <= 120
                assert ratelimit(refused.headers["ratelimit"]) == [("default", 0, retry)]
                prefix = "fn:" if server.module is None else ""
                assert server.client().exists(prefix + stored) == 1
            other = client.get("/", headers={"X-API-Key": key + "-other"})
            assert ratelimit(other.headers["ratelimit"])[0][1] == 99
            # Another address, as a trusted proxy (loopback) forwards it: a key of its own.
            forwarded = client.get("/", headers={"X-Forwarded-For": "203.0.113.7"})
            assert ratelimit(forwarded.headers["ratelimit"])[0][1] == 99
    finally:
        app.stop()


def test_the_fastapi_app_through_the_library(library_server, tmp_path):
    drive_the_fastapi_app(library_server, tmp_path, f"readme-{time.time_ns()}")


def test_the_fastapi_app_fails_open(tmp_path):
    app = Uvicorn(fastapi_app(f"redis://127.0.0.1:{free_port()}"), tmp_path)
    try:
        response = httpx.get(f"http://127.0.0.1:{app.port}/", headers={"X-API-Key": "k"}, timeout=10)
        assert response.status_code == 200 and "ratelimit" not in response.headers
    finally:
        app.stop()


def run_the_flask_app(server, tmp_path, monkeypatch, key: str) -> None:
    monkeypatch.setenv("REDIS_URL", server.url)
    app = load(patient(block("from flask import")[0]), "readme_flask", tmp_path).app
    client = app.test_client()
    away_from_a_minute_edge(server.client())
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
    # Without a key: limited on the address (the test client's is 127.0.0.1).
    keyless = [client.get("/") for _ in range(101)]
    assert [ratelimit(a.headers["RateLimit"])[0][1] for a in keyless[:100]] == list(range(99, -1, -1))
    assert keyless[100].status_code == 429
    assert server.client().exists("flask:ip:127.0.0.1") == 1


def run_the_program(server, tmp_path, code: str, output: str) -> None:
    (tmp_path / "program.py").write_text(patient(code))
    env = dict(os.environ, REDIS_URL=server.url)
    done = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == output


def test_the_client_side_decisions_through_the_library(library_server, tmp_path):
    code, output = block("denial_cache=")
    library_server.client().delete("fn:jobs:acme", "fn:search:all")
    run_the_program(library_server, tmp_path, code, output.replace("module cache", "library cache"))


def run_the_fastapi_dependencies(server, monkeypatch, tmp_path, key: str) -> None:
    monkeypatch.setenv("REDIS_URL", server.url)
    app = load(patient(block("Depends(per_second)")[0]), "readme_depends", tmp_path).app

    async def main():
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        runs = []
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            for headers in ({"X-API-Key": key}, {}):
                started = time.monotonic()
                # One after the other: one connection (30 at once would open 30 under the timeout).
                answers = [await client.get("/search", headers=headers) for _ in range(12)]
                runs.append((answers, time.monotonic() - started))
        return runs

    for (answers, elapsed), user in zip(asyncio.run(main()), (key, "ip:127.0.0.1")):
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
        hour = server.client().execute_command("RATELIMIT.PEEK", f"{{{user}}}:hour", "token-bucket", 1000, "1h", "COST", 0)
        assert hour[2] == 1000 - len(admitted)


def test_the_readme_in_order_on_one_server(tmp_path, monkeypatch):
    """As a reader runs it: every snippet in the page's order against one server with the
    module, nothing flushed between them, one API key (`alice`) wherever one is sent; each
    prints or answers what the page shows."""
    server = spawn_server(True)
    try:
        ran = []
        for code, output in blocks():
            if "RateLimitMiddleware" in code:
                drive_the_fastapi_app(server, tmp_path, "alice")
            elif "from flask import" in code:
                run_the_flask_app(server, tmp_path, monkeypatch, "alice")
            elif "Depends(per_second)" in code:
                run_the_fastapi_dependencies(server, monkeypatch, tmp_path, "alice")
            elif output is not None:
                run_the_program(server, tmp_path, code, output)
            else:
                assert code.startswith("from redis_ratelimit import RateLimiter, AsyncRateLimiter"), code
                continue  # the API's import list (test_api.py runs it)
            ran.append(code.split("\n")[0])
        assert len(ran) == 5, ran
    finally:
        server.kill()
