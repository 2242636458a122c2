// Decisions without a round trip, measured: the Node package's batches on one hot key and its
// denial cache under a flood of refused requests, each side by side with per-request CHECKs in
// the same run (`make bench-clients`; `make bench` runs it after the module's comparison).
//
//   node benches/clients/decisions.mjs [--seconds S] [--procs N] [--out DIR]
//
// Starts its own redis-server (RATELIMIT_SERVER, else the one on PATH) with the module
// (RATELIMIT_MODULE) on a free loopback port, runs N client processes per phase, counts the
// commands Redis executed (INFO commandstats), writes every admission of the bound phase to
// DIR/admissions-<i>.f64 and checks them with windows.mjs. Prints two markdown tables and writes
// DIR/decisions.json. Exits 1 when a stated property fails (a window over the bound, an admission
// the flood must refuse).
import { fork, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, writeFileSync, rmSync, mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { worstWindows } from './windows.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../..');
const nodeDir = join(root, 'clients/node');
const requireFromPackage = createRequire(join(nodeDir, 'package.json'));

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at > 0 ? process.argv[at + 1] : fallback;
}

// ---------------------------------------------------------------------------------------------
// A worker: one process, one connection, `concurrency` calls in flight for `seconds`.
// ---------------------------------------------------------------------------------------------
async function worker(job) {
  const { createClient } = requireFromPackage('redis');
  const { RateLimiter, limit } = await import(join(nodeDir, 'dist/esm/index.js'));
  const redis = await createClient({ url: `redis://127.0.0.1:${job.port}` }).connect();
  const quiet = { info() {}, warn: (...a) => console.warn(...a), error: (...a) => console.error(...a) };
  const rl = new RateLimiter(redis, { timeoutMs: 2000, logger: quiet, ...(job.denialCache ? { denialCache: job.denialCache } : {}) });
  const spec = limit(job.algorithm, job.limit, job.period, job.options ?? {});
  const keys = job.keys;
  let admitted = 0;
  let decisions = 0;
  const sources = {};
  let log = job.log ? new Float64Array(1 << 16) : null;
  process.send({ ready: true });
  const [{ go }] = await once(process, 'message');
  const end = go + job.seconds * 1000;
  while (Date.now() < go) await new Promise((r) => setTimeout(r, 1));
  let k = job.index;
  async function loop() {
    while (Date.now() < end) {
      k = (k * 1103515245 + 12345) % 2147483648;
      const d = await rl.check(keys[k % keys.length], spec);
      decisions += 1;
      sources[d.source] = (sources[d.source] ?? 0) + 1;
      if (d.allowed) {
        admitted += 1;
        if (log) {
          if (admitted > log.length) {
            const grown = new Float64Array(log.length * 2);
            grown.set(log);
            log = grown;
          }
          log[admitted - 1] = performance.timeOrigin + performance.now();
        }
      }
    }
  }
  await Promise.all(Array.from({ length: job.concurrency }, loop));
  const seconds = (Date.now() - go) / 1000;
  await rl.close?.();
  await redis.quit();
  if (log) writeFileSync(job.log, Buffer.from(log.buffer, 0, admitted * 8));
  process.send({ decisions, admitted, sources, seconds });
}

// ---------------------------------------------------------------------------------------------
// The driver.
// ---------------------------------------------------------------------------------------------
async function freePort() {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port;
}

async function startServer() {
  const binary = process.env.RATELIMIT_SERVER || 'redis-server';
  const module = process.env.RATELIMIT_MODULE || join(root, 'target/release/libredis_ratelimit.so');
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const dir = mkdtempSync(join(tmpdir(), 'ratelimit-bench-'));
    const child = spawn(binary, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
      '--dir', dir, '--loadmodule', module], { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (b) => { output += b; });
    const ready = await new Promise((res) => {
      const timer = setTimeout(() => res(false), 10000);
      child.stdout.on('data', () => { if (/Ready to accept connections/.test(output)) { clearTimeout(timer); res(true); } });
      child.on('exit', () => { clearTimeout(timer); res(false); });
    });
    if (ready) return { port, child, dir };
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
    if (attempt === 4) throw new Error(`redis-server did not start:\n${output}`);
  }
}

/** Calls Redis executed, by command, from INFO commandstats. */
async function commandCalls(redis) {
  const text = await redis.sendCommand(['INFO', 'commandstats']);
  const calls = {};
  for (const line of text.split('\n')) {
    const m = /^cmdstat_([^:]+):calls=(\d+)/.exec(line.trim());
    if (m) calls[m[1]] = Number(m[2]);
  }
  return calls;
}

/** The rate limiting commands executed between two readings (INFO, CONFIG... left out). */
function limiterCommands(before, after) {
  let sum = 0;
  for (const [name, calls] of Object.entries(after)) {
    if (name.startsWith('ratelimit') || name === 'fcall') sum += calls - (before[name] ?? 0);
  }
  return sum;
}

async function phase(server, redis, job, procs) {
  const before = await commandCalls(redis);
  const children = [];
  for (let i = 0; i < procs; i++) {
    const log = job.logDir ? join(job.logDir, `admissions-${i}.f64`) : undefined;
    const child = fork(fileURLToPath(import.meta.url), ['--worker', JSON.stringify({ ...job, index: i + 1, port: server.port, log })]);
    children.push(child);
  }
  await Promise.all(children.map((c) => once(c, 'message')));
  const go = Date.now() + 200;
  const results = children.map((c) => once(c, 'message').then(([m]) => m));
  for (const c of children) c.send({ go });
  const done = await Promise.all(results);
  await Promise.all(children.map((c) => (c.exitCode === null ? once(c, 'exit') : null)));
  const after = await commandCalls(redis);
  const decisions = done.reduce((s, r) => s + r.decisions, 0);
  const admitted = done.reduce((s, r) => s + r.admitted, 0);
  const seconds = Math.max(...done.map((r) => r.seconds));
  const sources = {};
  for (const r of done) for (const [s, n] of Object.entries(r.sources)) sources[s] = (sources[s] ?? 0) + n;
  const commands = limiterCommands(before, after);
  return {
    decisions, admitted, seconds, sources, commands,
    perSecond: decisions / seconds,
    commandsPer1000: (commands / decisions) * 1000,
    logs: job.logDir ? children.map((_, i) => join(job.logDir, `admissions-${i}.f64`)) : [],
  };
}

async function main() {
  const seconds = Number(option('seconds', process.env.BENCH_QUICK ? '3' : '10'));
  const procs = Number(option('procs', '3'));
  const out = resolve(option('out', join(root, 'target/bench/clients')));
  mkdirSync(out, { recursive: true });
  const { createClient } = requireFromPackage('redis');
  const server = await startServer();
  const redis = await createClient({ url: `redis://127.0.0.1:${server.port}` }).connect();
  const failures = [];
  try {
    const version = (await redis.sendCommand(['INFO', 'server'])).match(/redis_version:(\S+)/)[1];
    const concurrency = 32;
    // Hot key: a limit far above what one Redis core decides, so nothing is refused.
    const huge = { algorithm: 'token-bucket', limit: 1_000_000_000, period: '1s', concurrency, seconds, keys: ['hot'] };
    const batch = { batch: '50ms', batchMax: 10_000 };
    const perRequest = await phase(server, redis, huge, procs);
    await redis.sendCommand(['DEL', 'hot']);
    const batched = await phase(server, redis, { ...huge, options: batch }, procs);
    await redis.sendCommand(['DEL', 'hot']);
    // The bound: a limit the batched clients exceed, every admission logged and checked.
    const rate = 200_000;
    const burst = 20_000;
    const logDir = join(out, 'admissions');
    rmSync(logDir, { recursive: true, force: true });
    mkdirSync(logDir, { recursive: true });
    const bound = await phase(server, redis, {
      algorithm: 'token-bucket', limit: rate, period: '1s', options: { burst, ...batch }, concurrency, seconds, keys: ['bound'], logDir,
    }, procs);
    const held = procs * batch.batchMax;
    const windows = worstWindows(bound.logs, [100, 1000], (w) => burst + Math.floor((rate * w) / 1000));
    for (const w of windows) {
      if (w.excess > held) failures.push(`a ${w.ms} ms window admitted ${w.excess} over what per-request checks could (bound ${held})`);
    }

    // Flood: 1,000 keys with nothing left for an hour, hammered; without and with the cache.
    const keys = Array.from({ length: 1000 }, (_, i) => `flood:${i}`);
    const flood = { algorithm: 'token-bucket', limit: 10, period: '1h', concurrency, seconds, keys };
    for (const key of keys) await redis.sendCommand(['RATELIMIT.CHECK', key, 'token-bucket', '10', '1h', 'COST', '10']);
    const uncached = await phase(server, redis, flood, procs);
    const cached = await phase(server, redis, { ...flood, denialCache: 2000 }, procs);
    for (const [name, r] of [['without the cache', uncached], ['with the cache', cached]]) {
      if (r.admitted !== 0) failures.push(`the flood ${name} admitted ${r.admitted} requests per-request checks refuse`);
    }

    const f = (x, digits = 0) => x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
    const lines = [
      `Redis ${version}, ${procs} client processes of ${concurrency} calls in flight, ${seconds} s per phase (node-redis, the Node package).`,
      '',
      '| one hot key | decisions/s | Redis commands per 1,000 decisions | answered locally |',
      '|---|---:|---:|---:|',
      `| per-request \`CHECK\` | ${f(perRequest.perSecond)} | ${f(perRequest.commandsPer1000, 1)} | ${f(((perRequest.sources.local ?? 0) / perRequest.decisions) * 100, 1)}% |`,
      `| batched (\`batch: '50ms'\`, \`batchMax: 10000\`) | ${f(batched.perSecond)} | ${f(batched.commandsPer1000, 1)} | ${f(((batched.sources.local ?? 0) / batched.decisions) * 100, 1)}% |`,
      `| ratio | ${f(batched.perSecond / perRequest.perSecond, 1)}x | ${f(perRequest.commandsPer1000 / Math.max(batched.commandsPer1000, 1e-9), 0)}x fewer | |`,
      '',
      `Bound phase (token bucket ${f(rate)}/s, burst ${f(burst)}, batched): ${f(bound.admitted)} admitted of ${f(bound.decisions)} in ${f(bound.seconds, 1)} s; ` +
        `the bound: ${procs} x ${f(batch.batchMax)} = ${f(held)} units held at most.`,
      '',
      '| window | most admitted | per-request checks at most | excess | bound |',
      '|---|---:|---:|---:|---:|',
      ...windows.map((w) => `| ${w.ms} ms | ${f(w.count)} | ${f(w.capacity)} | ${f(w.excess)} | ${f(held)} |`),
      '',
      '| flood: 1,000 keys over their limit | refused decisions/s | Redis commands per 1,000 refused | admitted |',
      '|---|---:|---:|---:|',
      `| per-request \`CHECK\` | ${f(uncached.perSecond)} | ${f(uncached.commandsPer1000, 1)} | ${uncached.admitted} |`,
      `| denial cache (\`denialCache: 2000\`) | ${f(cached.perSecond)} | ${f(cached.commandsPer1000, 2)} | ${cached.admitted} |`,
      `| ratio | ${f(cached.perSecond / uncached.perSecond, 1)}x | ${f(uncached.commandsPer1000 / Math.max(cached.commandsPer1000, 1e-9), 0)}x fewer | |`,
    ];
    console.log(lines.join('\n'));
    writeFileSync(join(out, 'decisions.json'), JSON.stringify({ version, procs, concurrency, seconds, perRequest, batched, bound, windows, held, uncached, cached }, null, 2));
    writeFileSync(join(out, 'decisions.md'), lines.join('\n') + '\n');
  } finally {
    await redis.quit().catch(() => {});
    server.child.kill('SIGTERM');
    await once(server.child, 'exit');
    rmSync(server.dir, { recursive: true, force: true });
  }
  if (failures.length) {
    for (const f of failures) console.error(`bench-clients: FAIL ${f}`);
    process.exit(1);
  }
}

if (process.argv[2] === '--worker') {
  worker(JSON.parse(process.argv[3])).catch((e) => { console.error(e); process.exit(1); });
} else {
  main().catch((e) => { console.error(e); process.exit(1); });
}
