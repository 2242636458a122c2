// What the Node package costs per call: sequential calls on loopback from one process, the
// package's `limiter.check` beside the raw client sending the same RATELIMIT.CHECK, in one run,
// for node-redis and ioredis, RESP2 and RESP3, with the package's timeout and breaker on (its
// defaults). `make bench-clients` runs it.
//
//   node benches/clients/overhead.mjs [--calls N] [--rounds R] [--out DIR]
//
// Starts its own redis-server (RATELIMIT_SERVER, else the one on PATH) with the module
// (RATELIMIT_MODULE, else target/release/libredis_ratelimit.so) on a free loopback port. Each
// round runs N calls of every variant, in chunks of 10 (--chunk) taken in turn (so that a busy machine
// slows them alike); the table gives the median round's µs per call and the package's ratio to its raw
// client. Prints the table and writes it to DIR/overhead-node.md (default target/bench/clients).
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../..');
const nodeDir = join(root, 'clients/node');
const requireFromPackage = createRequire(join(nodeDir, 'package.json'));

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at > 0 ? process.argv[at + 1] : fallback;
}
const CALLS = Number(option('calls', process.env.BENCH_QUICK ? 5000 : 20000));
// Another build of the package to time (its folder, holding dist/): a before and after.
const PACKAGE = resolve(option('package', nodeDir));
const ROUNDS = Number(option('rounds', 5));
const OUT = resolve(option('out', join(root, 'target/bench/clients')));

async function freePort() {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port === 6379 ? freePort() : port;
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
    const ready = await new Promise((res) => {
      const timer = setTimeout(() => res(false), 10000);
      child.stdout.on('data', (b) => {
        output += b;
        if (/Ready to accept connections/.test(output)) { clearTimeout(timer); res(true); }
      });
      child.on('exit', () => { clearTimeout(timer); res(false); });
    });
    if (ready) return { port, child, dir };
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
    if (attempt === 4) throw new Error(`redis-server did not start:\n${output}`);
  }
}

async function main() {
  const { createClient } = requireFromPackage('redis');
  const Redis = requireFromPackage('ioredis').default ?? requireFromPackage('ioredis');
  const { RateLimiter, limit } = await import(join(PACKAGE, 'dist/esm/index.js'));
  const server = await startServer();
  const url = `redis://127.0.0.1:${server.port}`;
  const quiet = { info() {}, warn: (m) => console.warn(m) };
  // A limit that admits every call of the run: each one a consuming CHECK, as in the issue.
  const spec = limit('sliding-window', 1e12, '1h');
  const args = (key) => ['RATELIMIT.CHECK', key, 'sliding-window', '1000000000000', '1h', 'COST', '1'];

  const clients = [];
  const variants = [];
  for (const resp of [2, 3]) {
    const nr = await createClient({ url, RESP: resp }).on('error', () => {}).connect();
    const io = new Redis({ port: server.port, host: '127.0.0.1', protocol: resp, lazyConnect: true });
    io.on('error', () => {});
    await io.connect();
    clients.push(nr, io);
    const rlNr = new RateLimiter(nr, { logger: quiet });
    const rlIo = new RateLimiter(io, { logger: quiet });
    const rawNr = args(`raw:nr:${resp}`);
    const rawIo = args(`raw:io:${resp}`);
    const [cmd, ...rest] = rawIo;
    variants.push(
      { client: 'node-redis', resp, side: 'raw', what: 'sendCommand', run: () => nr.sendCommand(rawNr) },
      { client: 'node-redis', resp, side: 'package', what: 'limiter.check', run: () => rlNr.check(`pkg:nr:${resp}`, spec) },
      { client: 'ioredis', resp, side: 'raw', what: 'call', run: () => io.call(cmd, ...rest) },
      { client: 'ioredis', resp, side: 'package', what: 'limiter.check', run: () => rlIo.check(`pkg:io:${resp}`, spec) },
    );
  }

  // Each round: CALLS calls of every variant, in chunks of CHUNK taken in turn, so that the load
  // of a shared machine falls on the package and its raw client alike.
  const CHUNK = Math.min(CALLS, Number(option('chunk', 10)));
  // Wall time and this process's CPU time (user + system), µs.
  const sequential = async (run, n) => {
    const cpu = process.cpuUsage();
    const start = process.hrtime.bigint();
    for (let i = 0; i < n; i += 1) await run();
    const wall = Number(process.hrtime.bigint() - start) / 1000;
    const used = process.cpuUsage(cpu);
    return [wall, used.user + used.system];
  };
  for (const v of variants) await sequential(v.run, Math.min(CALLS, 2000)); // warm-up: the JIT, the engine found
  const times = variants.map(() => []);
  const cpus_ = variants.map(() => []);
  for (let round = 0; round < ROUNDS; round += 1) {
    const spent = variants.map(() => [0, 0]);
    for (let done = 0; done < CALLS; done += CHUNK) {
      const n = Math.min(CHUNK, CALLS - done);
      for (let i = 0; i < variants.length; i += 1) {
        const [wall, cpu] = await sequential(variants[i].run, n);
        spent[i][0] += wall;
        spent[i][1] += cpu;
      }
    }
    spent.forEach(([wall, cpu], i) => {
      times[i].push(wall / CALLS);
      cpus_[i].push(cpu / CALLS);
    });
    process.stderr.write(`round ${round + 1}/${ROUNDS}\n`);
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

  const lines = [
    `Per call, sequential on loopback, one process: median of ${ROUNDS} rounds of ${CALLS.toLocaleString('en-US')} calls each`,
    `(Node ${process.version}, ${cpus().length} cores, load average ${loadavg()[0].toFixed(1)}; a consuming RATELIMIT.CHECK of sliding-window;`,
    'the package with its default timeout and breaker). Wall time per call, and the CPU time this process spent per call',
    '(user + system), which a machine busy with other work disturbs less.',
    '',
    '| client | RESP | raw client µs/call | package µs/call | package / raw | raw CPU µs/call | package CPU µs/call | package / raw CPU |',
    '|---|---|---:|---:|---:|---:|---:|---:|',
  ];
  for (let i = 0; i < variants.length; i += 2) {
    const raw = median(times[i]);
    const pkg = median(times[i + 1]);
    const rawCpu = median(cpus_[i]);
    const pkgCpu = median(cpus_[i + 1]);
    lines.push(`| ${variants[i].client} (\`${variants[i].what}\`) | ${variants[i].resp} | ${raw.toFixed(1)} | ${pkg.toFixed(1)} | ${(pkg / raw).toFixed(3)}x | ${rawCpu.toFixed(1)} | ${pkgCpu.toFixed(1)} | ${(pkgCpu / rawCpu).toFixed(3)}x |`);
  }
  // The package's own work, without I/O: a client whose command answers at once (the reply
  // each protocol gives), the package's check against that client's call alone.
  const REPLIES = {
    2: [1, 1e12, 1e12 - 1, 0, 3600000, 0],
    3: { allowed: 1, limit: 1e12, remaining: 1e12 - 1, retry_after_ms: 0, reset_after_ms: 3600000, delay_ms: 0 },
  };
  lines.push('', `The package's own work per call (median of ${ROUNDS} rounds of 200,000 calls through a client whose command answers at once):`, '',
    "| reply | the client's call µs | package µs | the package's own µs |", '|---|---:|---:|---:|');
  for (const resp of [2, 3]) {
    const instant = { sendCommand: () => Promise.resolve(REPLIES[resp]) };
    const rl = new RateLimiter(instant, { logger: quiet });
    const own = [[], []];
    const bare = () => instant.sendCommand(args('k'));
    const pkg = () => rl.check('k', spec);
    for (let round = 0; round < ROUNDS; round += 1) {
      own[0].push((await sequential(bare, 200000))[0] / 200000);
      own[1].push((await sequential(pkg, 200000))[0] / 200000);
    }
    const [b, p] = own.map(median);
    lines.push(`| RESP${resp} | ${b.toFixed(2)} | ${p.toFixed(2)} | ${(p - b).toFixed(2)} |`);
  }
  const table = `${lines.join('\n')}\n`;
  process.stdout.write(`\n${table}`);
  mkdirSync(OUT, { recursive: true });
  writeFileSync(join(OUT, 'overhead-node.md'), table);

  for (const c of clients) {
    if (typeof c.call === 'function') c.disconnect();
    else await c.close?.().catch?.(() => {});
  }
  server.child.kill('SIGKILL');
  rmSync(server.dir, { recursive: true, force: true });
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
