"""What the Python package costs per call, beside the raw client in the same run: sequential
`RateLimiter.check` (sync) and `AsyncRateLimiter.check` (asyncio) against redis-py's own
`execute_command("RATELIMIT.CHECK", ...)` of the same limit, RESP2 and RESP3, on loopback, one
process. The limiter is `from_url`'s with its timeout and breaker on (a timeout of 2 s, so that a
loaded machine never fires it: what is measured is the mechanism's cost); the raw client gets the
same `socket_timeout`. A package call that does not reach Redis (fails open) fails the run.

    python benches/clients/overhead.py [--calls 20000] [--rounds 5] [--out target/bench/clients]

(`make bench-clients` runs it; BENCH_QUICK=1: 5,000 calls a round.)

Run it with a Python that has the package installed (`make test-python` builds one:
target/python/venv/bin/python), or with RATELIMIT_PY_SRC=1 to import clients/python/src.
Starts its own redis-server (RATELIMIT_SERVER, else the one on PATH) with the module
(RATELIMIT_MODULE, default target/release's) on a free loopback port and stops it (on SIGTERM
too). Each round runs both sides of each case; the table gives the
median of the rounds in µs per call and the ratio package / raw. Within a round the two sides
alternate in chunks of 1,000 calls, so that a machine shared with other work loads both alike;
each row says the 1-minute load average when its case started and ended. Prints a markdown
table and writes it to OUT/overhead-python.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if os.environ.get("RATELIMIT_PY_SRC"):
    sys.path.insert(0, str(ROOT / "clients/python/src"))

import redis  # noqa: E402
import redis.asyncio  # noqa: E402

from redis_ratelimit import AsyncRateLimiter, Limit, RateLimiter  # noqa: E402

TIMEOUT = 2.0

#: Admits every call (a consuming CHECK each time), as a gateway's common case.
LIMIT = Limit("token-bucket", 10**9, "1s")
RAW = ("RATELIMIT.CHECK", "token-bucket", str(LIMIT.limit), "1s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, module: str):
        binary = os.environ.get("RATELIMIT_SERVER") or shutil.which("redis-server")
        if not binary:
            raise SystemExit("overhead.py: no redis-server (make deps installs it)")
        if not os.path.isfile(module):
            raise SystemExit(f"overhead.py: no module at {module} (make build, or RATELIMIT_MODULE=...)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="rl-overhead-")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--loadmodule", module]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit(f"overhead.py: {' '.join(args)} did not start")
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


CHUNK = 1_000


def one_round(package, plain, calls: int, package_first: bool):
    """(package, raw): (wall µs, this process's CPU µs) per call over `calls` each, the sides
    alternating in chunks."""
    totals = {package: [0.0, 0.0], plain: [0.0, 0.0]}
    done = 0
    while done < calls:
        n = min(CHUNK, calls - done)
        for side in ((package, plain) if package_first else (plain, package)):
            wall, cpu = side(n)
            totals[side][0] += wall
            totals[side][1] += cpu
        package_first = not package_first
        done += n
    return tuple((w / calls * 1e6, c / calls * 1e6) for w, c in (totals[package], totals[plain]))


def served(limiter) -> None:
    """Every package call was Redis's decision (none failed open on a timeout)."""
    stats = limiter.stats
    if stats.get("error") or stats.get("module", 0) != stats.get("commands"):
        raise SystemExit(f"overhead.py: some calls did not reach Redis: {stats}")


def sync_sides(url: str, protocol: int):
    limiter = RateLimiter.from_url(url, protocol=protocol, timeout=TIMEOUT)
    raw = redis.Redis.from_url(url, protocol=protocol, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)

    def package(calls: int):
        check = limiter.check
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            check("overhead:package", LIMIT)
        return time.perf_counter() - started, time.process_time() - cpu

    def plain(calls: int):
        execute = raw.execute_command
        args = (RAW[0], "overhead:raw", *RAW[1:])
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            execute(*args)
        return time.perf_counter() - started, time.process_time() - cpu

    assert limiter.check("overhead:package", LIMIT).source == "module"
    return package, plain, lambda: (served(limiter), limiter.close(), raw.close())


def async_sides(url: str, protocol: int, loop: asyncio.AbstractEventLoop):
    limiter = AsyncRateLimiter.from_url(url, protocol=protocol, timeout=TIMEOUT)
    raw = redis.asyncio.Redis.from_url(url, protocol=protocol, socket_timeout=TIMEOUT,
                                       socket_connect_timeout=TIMEOUT)

    async def package(calls: int):
        check = limiter.check
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await check("overhead:package", LIMIT)
        return time.perf_counter() - started, time.process_time() - cpu

    async def plain(calls: int):
        execute = raw.execute_command
        args = (RAW[0], "overhead:raw", *RAW[1:])
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await execute(*args)
        return time.perf_counter() - started, time.process_time() - cpu

    async def close():
        served(limiter)
        await limiter.aclose()
        await raw.aclose()

    assert loop.run_until_complete(limiter.check("overhead:package", LIMIT)).source == "module"
    return (lambda n: loop.run_until_complete(package(n)), lambda n: loop.run_until_complete(plain(n)),
            lambda: loop.run_until_complete(close()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000 if os.environ.get("BENCH_QUICK") else 20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "target/bench/clients"))
    options = parser.parse_args()
    module = os.environ.get("RATELIMIT_MODULE") or str(ROOT / "target/release/libredis_ratelimit.so")
    server = Server(module)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the server is stopped below
    loop = asyncio.new_event_loop()
    rows = []
    try:
        for mode in ("sync", "asyncio"):
            for protocol in (2, 3):
                if mode == "sync":
                    package, plain, close = sync_sides(server.url, protocol)
                else:
                    package, plain, close = async_sides(server.url, protocol, loop)
                ours, theirs = [], []
                load_start = os.getloadavg()[0]
                for round_ in range(options.rounds):
                    a, b = one_round(package, plain, options.calls, round_ % 2 == 0)
                    ours.append(a)
                    theirs.append(b)
                close()
                p, r = (statistics.median(w for w, _ in ours), statistics.median(w for w, _ in theirs))
                pc, rc = (statistics.median(c for _, c in ours), statistics.median(c for _, c in theirs))
                load = (load_start, os.getloadavg()[0])
                rows.append((mode, protocol, p, r, pc, rc, load))
                print(f"{mode} RESP{protocol}: package {p:.1f} µs, raw {r:.1f} µs, {p / r:.3f}x; "
                      f"CPU {pc:.1f} vs {rc:.1f} µs, {pc / rc:.3f}x; load {load[0]:.2f} to {load[1]:.2f}",
                      file=sys.stderr)
    finally:
        loop.close()
        server.stop()
    lines = [
        f"Python package vs redis-py {redis.__version__} per sequential call (µs, median of {options.rounds} "
        f"rounds of {options.calls:,} calls, the two sides alternating in chunks of {CHUNK:,}; Python {sys.version.split()[0]}, "
        f"hiredis {'on' if redis.utils.HIREDIS_AVAILABLE else 'off'}, timeout {TIMEOUT} s, breaker on):",
        "",
        "| client | protocol | `check` | raw `execute_command` | ratio | `check` CPU | raw CPU | CPU ratio | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, protocol, p, r, pc, rc, load in rows:
        name = "RateLimiter" if mode == "sync" else "AsyncRateLimiter"
        lines.append(f"| {name} ({mode}) | RESP{protocol} | {p:.1f} | {r:.1f} | {p / r:.3f}x "
                     f"| {pc:.1f} | {rc:.1f} | {pc / rc:.3f}x | {load[0]:.1f} to {load[1]:.1f} |")
    lines += [
        "",
        "Wall time per call, and this process's CPU time per call (the client's own work and its",
        "system calls, without the wait for Redis: on a machine shared with other work it varies",
        "less, and its ratio is the stricter one). Load: the 1-minute load average when the case",
        f"started and when it ended (the machine has {os.cpu_count()} CPUs).",
    ]
    table = "\n".join(lines) + "\n"
    print(table, end="")
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead-python.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
