// What the tests share: redis-servers of their own on free loopback ports (killed with the test
// process, also when it dies: setpriv --pdeathsig), the clients of every flavour, and skips.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { createClient, createCluster } from 'redis';
import { createClient as createClient4, createCluster as createCluster4 } from 'redis4';
import { createClient as createClient5 } from 'redis5';
import Redis, { Cluster } from 'ioredis';
import Redis5 from 'ioredis5';

export const MODULE = process.env.RATELIMIT_MODULE || '';
const started = new Set();

/** A free port on 127.0.0.1 (never 6379). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => (port === 6379 ? freePort().then(resolve, reject) : resolve(port)));
    });
  });
}

function hasSetpriv() {
  try {
    execFileSync('setpriv', ['--help'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
const SETPRIV = hasSetpriv();

/** A redis-server of this test's own: `{ port, url, pid, stop(), pause(), resume() }`. With
 * `module: true`, RATELIMIT_MODULE loaded (the test must skip without it). */
export async function startServer({ module = false, args = [] } = {}) {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'rl-node-'));
  const serverArgs = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, ...args];
  if (module) serverArgs.push('--loadmodule', MODULE);
  const command = SETPRIV ? ['setpriv', '--pdeathsig', 'KILL', 'redis-server', ...serverArgs] : ['redis-server', ...serverArgs];
  const child = spawn(command[0], command.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const server = {
    port,
    url: `redis://127.0.0.1:${port}`,
    pid: child.pid,
    paused: false,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return cleanup();
      try {
        process.kill(child.pid, 'SIGCONT');
      } catch {}
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      await exited;
      cleanup();
    },
    pause() {
      process.kill(child.pid, 'SIGSTOP');
      server.paused = true;
    },
    resume() {
      process.kill(child.pid, 'SIGCONT');
      server.paused = false;
    },
  };
  function cleanup() {
    started.delete(server);
    rmSync(dir, { recursive: true, force: true });
  }
  started.add(server);
  child.on('exit', () => started.has(server) && cleanup());
  for (let i = 0; ; i += 1) {
    try {
      const probe = new Redis5({ port, host: '127.0.0.1', lazyConnect: true, retryStrategy: null, maxRetriesPerRequest: 0 });
      probe.on('error', () => {});
      await probe.connect();
      await probe.ping();
      probe.disconnect();
      return server;
    } catch {
      if (child.exitCode !== null || i > 200) {
        await server.stop();
        throw new Error(`redis-server on ${port} did not start:\n${output}`);
      }
      await sleep(25);
    }
  }
}

// Whatever happens, no server outlives the tests (SIGCONT first: a stopped process keeps a
// SIGKILL pending until it runs... it does not, but a SIGCONT costs nothing).
process.on('exit', () => {
  for (const server of started) {
    try {
      process.kill(server.pid, 'SIGCONT');
      process.kill(server.pid, 'SIGKILL');
    } catch {}
  }
});

/** A raw connection for checks: ioredis 5, RESP2. */
export function raw(server) {
  const client = new Redis5({ port: server.port, host: '127.0.0.1', maxRetriesPerRequest: 1 });
  client.on('error', () => {});
  return client;
}

/** The clients the limiter serves, by name: each `{ name, make(server), close(client) }`. */
export const CLIENTS = [
  { name: 'node-redis 6 RESP3', make: (s) => createClient({ url: s.url, RESP: 3 }).on('error', () => {}).connect() },
  { name: 'node-redis 6 RESP2', make: (s) => createClient({ url: s.url, RESP: 2 }).on('error', () => {}).connect() },
  { name: 'node-redis 5 RESP3', make: (s) => createClient5({ url: s.url, RESP: 3 }).on('error', () => {}).connect() },
  { name: 'node-redis 4', make: (s) => createClient4({ url: s.url }).on('error', () => {}).connect() },
  { name: 'ioredis 6', make: (s) => ready(new Redis({ port: s.port, host: '127.0.0.1' })) },
  { name: 'ioredis 6 RESP2', make: (s) => ready(new Redis({ port: s.port, host: '127.0.0.1', protocol: 2 })) },
  { name: 'ioredis 5', make: (s) => ready(new Redis5({ port: s.port, host: '127.0.0.1' })) },
];

async function ready(client) {
  client.on('error', () => {});
  if (client.status !== 'ready') await new Promise((resolve, reject) => { client.once('ready', resolve); client.once('end', reject); });
  return client;
}

export async function closeClient(client) {
  try {
    if (typeof client.disconnect === 'function' && typeof client.call === 'function') return client.disconnect();
    if (typeof client.destroy === 'function') return client.destroy();
    return await client.disconnect();
  } catch {}
}

/** A node-redis or ioredis cluster client for `nodes` (servers of one cluster). */
export const CLUSTER_CLIENTS = [
  { name: 'node-redis 6 cluster RESP3', make: (nodes) => createCluster({ rootNodes: nodes.map((n) => ({ url: n.url })), RESP: 3 }).on('error', () => {}).connect() },
  { name: 'node-redis 4 cluster', make: async (nodes) => {
      const cluster = createCluster4({ rootNodes: nodes.map((n) => ({ url: n.url })) }).on('error', () => {});
      await cluster.connect(); // 4 resolves to nothing
      return cluster;
    },
  },
  {
    name: 'ioredis 6 cluster',
    make: async (nodes) => {
      const cluster = new Cluster(nodes.map((n) => ({ host: '127.0.0.1', port: n.port })));
      cluster.on('error', () => {});
      await new Promise((resolve, reject) => { cluster.once('ready', resolve); cluster.once('end', reject); });
      return cluster;
    },
  },
];

/** Three masters of a Redis Cluster (with the module or without), slots spread over them. */
export async function startCluster({ module = false } = {}) {
  const nodes = [];
  for (let i = 0; i < 3; i += 1) {
    nodes.push(await startServer({ module, args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '5000'] }));
  }
  const clients = nodes.map(raw);
  const third = Math.ceil(16384 / 3);
  await Promise.all(clients.map((c, i) => c.call('CLUSTER', 'ADDSLOTSRANGE', String(i * third), String(Math.min(16383, (i + 1) * third - 1)))));
  await Promise.all(clients.slice(1).map((c) => c.call('CLUSTER', 'MEET', '127.0.0.1', String(nodes[0].port))));
  for (let i = 0; ; i += 1) {
    const states = await Promise.all(clients.map((c) => c.call('CLUSTER', 'INFO')));
    if (states.every((s) => s.includes('cluster_state:ok') && s.includes('cluster_known_nodes:3'))) break;
    if (i > 400) throw new Error(`the cluster did not form: ${states.join('\n')}`);
    await sleep(25);
  }
  clients.forEach((c) => c.disconnect());
  return { nodes, stop: () => Promise.all(nodes.map((n) => n.stop())) };
}

/** Why tests of the module skip here, or '' (RATELIMIT_MODULE names the module to load). */
export const NO_MODULE = MODULE && existsSync(MODULE) ? '' : 'RATELIMIT_MODULE does not name the module (make test-node sets it)';

/** A logger that keeps what it was told. */
export function memoryLogger() {
  const lines = [];
  return { lines, info: (m) => lines.push(`info ${m}`), warn: (m) => lines.push(`warn ${m}`) };
}

/** A seeded random generator (mulberry32): the same sequences on every run. */
export function random(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  next.int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  next.pick = (items) => items[Math.floor(next() * items.length)];
  return next;
}

export { sleep };
