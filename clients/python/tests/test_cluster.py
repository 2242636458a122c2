"""A Redis Cluster of three primaries, with the module and without it: `redis.RedisCluster`
clients route every call by its keys, `check_all` takes one hash tag, and the Functions library
is loaded on every primary."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import time

import pytest
import redis
import redis.asyncio

from conftest import MODULE, Server, _started
from redis_ratelimit import AsyncRateLimiter, Limit, RateLimiter
from redis_ratelimit._engine import CommandInfo
from redis_ratelimit._wire import command_arity

LIMIT = Limit("token-bucket", 5, "1h")  # long: nothing expires while the test runs


def port_pair() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free port pair")


class ClusterNode(Server):
    def __init__(self, module):
        self.port = port_pair()
        self.dir = tempfile.mkdtemp(prefix="rl-py-cluster-")
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        if module:
            args += ["--loadmodule", module]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.stopped = False
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("a cluster node did not start")
                time.sleep(0.02)


def make_cluster(module: bool):
    if not shutil.which("redis-cli"):
        pytest.skip("no redis-cli on PATH (make deps installs redis-tools)")
    if module and not MODULE or module and not __import__("os").path.isfile(MODULE):
        pytest.skip(f"no module at {MODULE}")
    nodes = [ClusterNode(MODULE if module else None) for _ in range(3)]
    _started.extend(nodes)
    subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes], "--cluster-yes"],
                   check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + 30
    while not all(b"cluster_state:ok" in n.client().execute_command("CLUSTER", "INFO") for n in nodes):
        assert time.monotonic() < deadline, "the cluster never became ok"
        time.sleep(0.1)
    return nodes


@pytest.fixture(scope="module", params=["module", "library"])
def cluster(request):
    nodes = make_cluster(request.param == "module")
    yield request.param, nodes
    for node in nodes:
        node.kill()


def test_a_cluster_client_is_served_by_either_engine(cluster):
    engine, nodes = cluster
    rl = RateLimiter(redis.RedisCluster(host="127.0.0.1", port=nodes[0].port, protocol=3, socket_timeout=10))
    keys = [f"user:{i}" for i in range(12)]  # spread over the three primaries
    for key in keys:
        d = rl.check(key, LIMIT)
        assert d.allowed and d.remaining == 4 and d.source == engine
    both = rl.check_all([("{alice}:sec", LIMIT), ("{alice}:hour", Limit("fixed-window", 100, "1h"))], cost=2)
    assert both.allowed and [d.remaining for d in both.limits] == [3, 98]
    with rl.lease("{alice}:jobs", 1, "10s") as held:
        assert held.allowed
    assert rl.reset("user:0") == 1
    if engine == "library":  # loaded on every primary
        for node in nodes:
            assert node.client().execute_command("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit")
    # How the module takes a spec, asked of any node: what a node answers itself.
    arity = command_arity(nodes[0].client().execute_command("COMMAND INFO", "RATELIMIT.CHECK"))
    assert (arity is None) == (engine == "library")
    assert command_arity(rl._perform(CommandInfo("RATELIMIT.CHECK"))) == arity
    assert rl._core.one_arg is (None if engine == "library" else arity == -3)
    rl.client.close()


def test_an_async_cluster_client(cluster):
    engine, nodes = cluster

    async def main():
        arl = AsyncRateLimiter(redis.asyncio.RedisCluster(host="127.0.0.1", port=nodes[0].port, socket_timeout=10))
        for i in range(6):
            assert (await arl.check(f"async:{i}", LIMIT)).source == engine
        multi = await arl.check_all([("{bob}:a", LIMIT), ("{bob}:b", LIMIT)])
        assert multi.allowed
        arity = command_arity(nodes[0].client().execute_command("COMMAND INFO", "RATELIMIT.CHECK"))
        assert command_arity(await arl._perform(CommandInfo("RATELIMIT.CHECK"))) == arity
        assert arl._core.one_arg is (None if engine == "library" else arity == -3)
        await arl.aclose()

    asyncio.run(main())
