// What users get is what is tested: the tarball `npm pack` makes, installed into a fresh folder,
// imported as ESM and as CommonJS, type-checked from a TypeScript user file, and the README's
// Express app run from it (at most 10 lines of the user's own code).
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { cpSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';

import { NO_MODULE, freePort, raw, sleep, startServer } from './helpers.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const SOURCE = readFileSync(resolve(root, pkg.ratelimit.library), 'utf8');

/** The README's Express app: the js block after `<!-- test: express-app ... -->`. */
export function readmeApp() {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const match = /<!-- test: express-app[^>]*-->\n```js\n([\s\S]*?)```/.exec(readme);
  assert.ok(match, 'README.md has the express-app block');
  return match[1];
}

/** The README's round-trips example and the output it shows. */
function readmeRoundTrips() {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const match = /<!-- test: round-trips[^>]*-->\n```js\n([\s\S]*?)```\n\n<!-- output -->\n```text\n([\s\S]*?)```/.exec(readme);
  assert.ok(match, 'README.md has the round-trips block and its output');
  return { code: match[1], output: match[2] };
}

describe('the packed tarball', () => {
  let dir;
  let project;
  before(() => {
    assert.ok(existsSync(join(root, 'dist/esm/index.js')), 'built first (npm run build)');
    dir = mkdtempSync(join(tmpdir(), 'rl-pack-'));
    // The tarball make test-node packed, or one packed here from the build.
    let tarball = process.env.RATELIMIT_NODE_TARBALL;
    if (!tarball) {
      const name = execFileSync('npm', ['pack', '--ignore-scripts', '--silent', '--pack-destination', dir], { cwd: root, encoding: 'utf8' }).trim().split('\n').pop();
      tarball = join(dir, name);
    }
    project = join(dir, 'app');
    mkdirSync(project);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'user-app', version: '1.0.0', private: true }));
    execFileSync('npm', ['install', '--offline', '--no-audit', '--no-fund', '--loglevel=error', tarball], { cwd: project, stdio: 'pipe' });
    // What the app itself would install (from this package's dev dependencies: no registry).
    for (const name of ['express', 'redis', 'ioredis', 'typescript', '@types/node', '@types/express', 'fastify', 'hono']) {
      const target = join(project, 'node_modules', name);
      mkdirSync(dirname(target), { recursive: true });
      if (!existsSync(target)) symlinkSync(join(root, 'node_modules', name), target);
    }
  });
  after(() => dir && rmSync(dir, { recursive: true, force: true }));

  test('holds the build, the library as its source, and no tests or sources', () => {
    const installed = join(project, 'node_modules/redis-ratelimit-client');
    assert.equal(readFileSync(join(installed, 'dist/ratelimit.lua'), 'utf8'), SOURCE);
    assert.deepEqual(readdirSync(installed).sort(), ['README.md', 'dist', 'package.json']);
    assert.ok(!existsSync(join(installed, 'node_modules')), 'no dependencies');
  });

  test('imports as ESM and as CommonJS, every entry point', () => {
    const entries = {
      'redis-ratelimit-client': ['RateLimiter', 'limit', 'policy', 'RateLimited', 'RateLimitUnavailable', 'RateLimitError', 'rateLimitHeaders'],
      'redis-ratelimit-client/express': ['rateLimit'],
      'redis-ratelimit-client/fastify': ['rateLimit'],
      'redis-ratelimit-client/hono': ['rateLimit', 'limitFetch'],
      'redis-ratelimit-client/express-rate-limit': ['RateLimitStore'],
    };
    const esm = Object.entries(entries).map(([m, names], i) => `import * as m${i} from '${m}';\nfor (const n of ${JSON.stringify(names)}) if (typeof m${i}[n] !== 'function') throw new Error('${m}: ' + n);`).join('\n')
      + `\nimport { LIBRARY } from 'redis-ratelimit-client';\nprocess.stdout.write(String(LIBRARY.length) + ' ' + import.meta.resolve('redis-ratelimit-client'));\n`;
    const cjs = Object.entries(entries).map(([m, names]) => `{ const x = require('${m}'); for (const n of ${JSON.stringify(names)}) if (typeof x[n] !== 'function') throw new Error('${m}: ' + n); }`).join('\n')
      + `\nprocess.stdout.write(String(require('redis-ratelimit-client').LIBRARY.length) + ' ' + require.resolve('redis-ratelimit-client'));\n`;
    writeFileSync(join(project, 'esm.mjs'), esm);
    writeFileSync(join(project, 'cjs.cjs'), cjs);
    const [esmLength, esmPath] = execFileSync(process.execPath, ['esm.mjs'], { cwd: project, encoding: 'utf8' }).split(' ');
    const [cjsLength, cjsPath] = execFileSync(process.execPath, ['cjs.cjs'], { cwd: project, encoding: 'utf8' }).split(' ');
    assert.equal(Number(esmLength), SOURCE.length);
    assert.equal(Number(cjsLength), SOURCE.length);
    assert.match(esmPath, /dist\/esm\/index\.js$/);
    assert.match(cjsPath, /dist\/cjs\/index\.js$/);
  });

  test('tsc --noEmit on a TypeScript user file, as ESM and as CommonJS', () => {
    const user = `
import Fastify from 'fastify';
import { Hono } from 'hono';
import express from 'express';
import { Redis } from 'ioredis';
import { RateLimiter, limit, policy, RateLimited, RateLimitUnavailable } from 'redis-ratelimit-client';
import type { Decision, MultiDecision, Limit } from 'redis-ratelimit-client';
import { rateLimit } from 'redis-ratelimit-client/express';
import { rateLimit as fastifyRateLimit } from 'redis-ratelimit-client/fastify';
import { rateLimit as honoRateLimit, limitFetch } from 'redis-ratelimit-client/hono';
import { RateLimitStore } from 'redis-ratelimit-client/express-rate-limit';

export async function main(): Promise<number> {
  const rl = new RateLimiter(new Redis({ lazyConnect: true }), { onError: 'open', timeoutMs: 100 });
  const l: Limit = limit('token-bucket', 10, '1s', { burst: 20, block: '15m' });
  const d: Decision = await rl.check('api:alice', l, { cost: 3 });
  const all: MultiDecision = await rl.checkAll([['{a}1', l], ['{a}2', policy('api', { fallback: l })]]);
  const n: number = await rl.reset('a', 'b');
  const near = new RateLimiter(new Redis({ lazyConnect: true }), { onError: 'local', localShare: 0.5, denialCache: 1000, now: () => performance.now() });
  const taken: Decision = await near.take('jobs', limit('fixed-window', 5, '1h'), 3, { at: 0 });
  const hot: Decision = await near.check('hot', limit('gcra', 1000, '1s', { batch: '50ms', batchMax: 100 }));
  const counted: number = near.stats.commands + near.stats.decisions.cache + near.stats.held + taken.granted + hot.granted;
  await near.close();
  const leased: string = await rl.withLease('jobs', 2, '30s', async (acquired: Decision) => acquired.source);
  const app = express();
  app.use(rateLimit({ limiter: rl, limit: l, key: (req) => req.get('X-API-Key') }));
  app.get('/', (req, res) => { res.send(String(req.rateLimit?.remaining)); });
  const f = Fastify();
  await f.register(fastifyRateLimit, { limiter: rl, limit: l, key: (request) => request.ip });
  f.get('/', async (request) => request.rateLimit?.remaining);
  const h = new Hono();
  h.use(honoRateLimit({ limiter: rl, limit: l, key: (c) => c.req.header('X-API-Key') }));
  h.get('/', (c) => c.text(String(c.get('rateLimit').remaining)));
  limitFetch(async (request: Request) => new Response('ok'), { limiter: rl, limit: l, key: (request) => request.headers.get('X-API-Key') ?? undefined });
  new RateLimitStore({ limiter: rl });
  try { await rl.policies.set('api', l, { shadow: true }); } catch (e) {
    if (e instanceof RateLimited) return e.decision.retryAfterMs;
    if (e instanceof RateLimitUnavailable) return -1;
  }
  return d.remaining + all.limits[0].remaining + n + leased.length + counted;
}
`;
    const bad = `import { limit } from 'redis-ratelimit-client';\nlimit('token-bucket', '10', '1s');\n`;
    writeFileSync(join(project, 'user.mts'), user);
    writeFileSync(join(project, 'user.cts'), user);
    writeFileSync(join(project, 'bad.mts'), bad);
    // Every entry point's declarations, from ESM and from CommonJS.
    const entries = Object.keys(pkg.exports).filter((e) => !/\.(lua|json)$/.test(e)).map((e, i) => `import * as m${i} from '${join('redis-ratelimit-client', e)}';\nexport { m${i} };`).join('\n');
    writeFileSync(join(project, 'entries.mts'), entries);
    writeFileSync(join(project, 'entries.cts'), entries);
    const compilerOptions = { target: 'ES2022', lib: ['ES2022'], module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, skipLibCheck: true, types: ['node'] };
    writeFileSync(join(project, 'tsconfig.json'), JSON.stringify({ compilerOptions, files: ['user.mts', 'user.cts', 'entries.mts', 'entries.cts', 'bad.mts'] }));
    let output = '';
    try {
      output = execFileSync(process.execPath, [join(project, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], { cwd: project, encoding: 'utf8' });
    } catch (error) {
      output = `${error.stdout}${error.stderr}`;
    }
    // The user's files pass; the one mistake (a string for a number) is the only error.
    const errors = output.trim().split('\n').filter((l) => /error TS/.test(l));
    assert.equal(errors.length, 1, output);
    assert.match(errors[0], /^bad\.mts\(2,\d+\): error TS2345/);
  });

  test("the README's round-trips example prints what the README shows", async (t) => {
    if (NO_MODULE) return t.skip(NO_MODULE);
    const { code, output } = readmeRoundTrips();
    writeFileSync(join(project, 'round-trips.mjs'), code);
    const server = await startServer({ module: true });
    try {
      const printed = await new Promise((resolve, reject) => {
        const child = spawn(process.execPath, ['round-trips.mjs'], { cwd: project, env: { ...process.env, REDIS_URL: server.url }, stdio: ['ignore', 'pipe', 'pipe'] });
        let out = '';
        let err = '';
        child.stdout.on('data', (d) => (out += d));
        child.stderr.on('data', (d) => (err += d));
        child.on('error', reject);
        child.on('exit', (status) => (status === 0 ? resolve(out) : reject(new Error(`exit ${status}: ${out}${err}`))));
      });
      assert.equal(printed, output);
    } finally {
      await server.stop();
    }
  });

  test("the README's snippets one after another on one server (the module), as a reader runs them: what the README shows", async (t) => {
    if (NO_MODULE) return t.skip(NO_MODULE);
    const server = await startServer({ module: true });
    const run = (file, env = {}) => spawn(process.execPath, [file], { cwd: project, env: { ...process.env, REDIS_URL: server.url, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      // 1. The Express app: a few requests with a key and without.
      writeFileSync(join(project, 'seq-app.mjs'), readmeApp().replace('timeoutMs: 100 ', 'timeoutMs: 2000 '));
      const port = await freePort();
      const app = run('seq-app.mjs', { PORT: String(port) });
      try {
        let first;
        for (let i = 0; i < 1200 && !first; i += 1) {
          first = await fetch(`http://127.0.0.1:${port}/`, { headers: { 'X-API-Key': 'k1' } }).catch(() => sleep(25).then(() => undefined));
        }
        assert.match(first.headers.get('ratelimit'), /^"default";r=99;t=\d+$/);
        assert.match((await fetch(`http://127.0.0.1:${port}/`)).headers.get('ratelimit'), /^"default";r=99;/);
      } finally {
        app.kill('SIGKILL');
      }
      // 2. The round-trips example, on the same server, not flushed: the output the README shows.
      const { code, output } = readmeRoundTrips();
      writeFileSync(join(project, 'seq-round-trips.mjs'), code);
      const child = run('seq-round-trips.mjs');
      let out = '';
      child.stdout.on('data', (d) => (out += d));
      child.stderr.on('data', (d) => (out += d));
      const status = await new Promise((resolve) => child.on('exit', resolve));
      assert.equal(status, 0, out);
      assert.equal(out, output);
    } finally {
      await server.stop();
    }
  });

  test("the README's Express app: at most 10 lines, limited per key with headers, the library, failing open", async () => {
    const code = readmeApp();
    const lines = code.split('\n').filter((l) => l.trim() !== '');
    assert.ok(lines.length <= 10, `${lines.length} lines`);
    // The machine running the tests may be busy (2 cores shared): the README's 100 ms could then
    // fail a call open by chance. The same app with 2 s.
    assert.match(code, /timeoutMs: 100 /);
    writeFileSync(join(project, 'app.mjs'), code.replace('timeoutMs: 100 ', 'timeoutMs: 2000 '));
    const server = await startServer(); // no module: the library, loaded by the package
    const port = await freePort();
    const app = spawn(process.execPath, ['app.mjs'], { cwd: project, env: { ...process.env, REDIS_URL: server.url, PORT: String(port) }, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    app.stdout.on('data', (d) => (output += d));
    app.stderr.on('data', (d) => (output += d));
    try {
      let response;
      for (let i = 0; i < 1200 && !response; i += 1) {
        response = await fetch(`http://127.0.0.1:${port}/`, { headers: { 'X-API-Key': 'k1' } }).catch(() => sleep(25).then(() => undefined));
      }
      assert.ok(response, output);
      assert.equal(response.status, 200);
      assert.equal(response.headers.get('ratelimit-policy'), '"default";q=100;w=60');
      assert.match(response.headers.get('ratelimit'), /^"default";r=99;t=\d+$/);
      assert.match(output, /loaded the Functions library/);
      const admin = raw(server);
      assert.equal(await admin.exists('fn:api:k1'), 1);
      const second = await fetch(`http://127.0.0.1:${port}/`, { headers: { 'X-API-Key': 'k1' } });
      assert.match(second.headers.get('ratelimit'), /^"default";r=98;/);
      // Without the header: limited by the client address, as any caller, 429 past 100.
      for (let i = 1; i <= 100; i += 1) {
        const keyless = await fetch(`http://127.0.0.1:${port}/`);
        assert.equal(keyless.status, 200);
        assert.equal(keyless.headers.get('ratelimit'), `"default";r=${100 - i};t=${keyless.headers.get('ratelimit').split('t=')[1]}`);
      }
      const refused = await fetch(`http://127.0.0.1:${port}/`);
      assert.equal(refused.status, 429);
      assert.ok(Number(refused.headers.get('retry-after')) >= 1);
      assert.equal(await admin.exists('fn:ip:127.0.0.1'), 1);
      admin.disconnect();
      // Redis gone: admitted, without headers, within the timeout.
      await server.stop();
      const started = performance.now();
      const open = await fetch(`http://127.0.0.1:${port}/`, { headers: { 'X-API-Key': 'k1' } });
      assert.equal(open.status, 200);
      assert.equal(open.headers.get('ratelimit'), null);
      assert.ok(performance.now() - started < 2000 + 4000);
    } finally {
      app.kill('SIGKILL');
      await server.stop();
    }
  });
});

describe('installed from a checkout, as the README says', () => {
  test('the commands of the README, in a copy of the checkout and a fresh app folder: imports as ESM and CommonJS', () => {
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    const match = /<!-- test: install-from-checkout[^>]*-->\n```sh\n([\s\S]*?)```/.exec(readme);
    assert.ok(match, 'README.md has the install-from-checkout block');
    const [inCheckout, inApp, ...more] = match[1].split('\n').filter((l) => l.trim() !== '' && !l.startsWith('#'));
    assert.equal(more.length, 0, match[1]);
    assert.ok(inApp.includes(`${pkg.name}-${pkg.version}.tgz`), `the README names this version's tarball: ${inApp}`);
    const dir = mkdtempSync(join(tmpdir(), 'rl-checkout-'));
    try {
      // The checkout as git has it: the package's sources (not its node_modules or build) and
      // what its build reads from the repository (the library, the licence).
      const repo = resolve(root, '../..');
      const checkout = join(dir, 'checkout');
      const skip = new Set(['node_modules', 'dist', 'generated']);
      cpSync(root, join(checkout, 'clients/node'), {
        recursive: true,
        filter: (source) => !relative(root, source).split('/').some((part) => skip.has(part) || part.endsWith('.tgz') || part.endsWith('.tap')),
      });
      for (const file of [pkg.ratelimit.library.replace(/^(\.\.\/)+/, ''), 'LICENSE']) cpSync(join(repo, file), join(checkout, file));
      const app = join(dir, 'app');
      mkdirSync(app);
      writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'user-app', version: '1.0.0', private: true }));
      const env = { ...process.env, CHECKOUT: checkout, npm_config_audit: 'false', npm_config_fund: 'false', npm_config_loglevel: 'error', npm_config_prefer_offline: 'true' };
      execFileSync('bash', ['-c', inCheckout], { cwd: checkout, env, stdio: 'pipe' });
      execFileSync('bash', ['-c', inApp], { cwd: app, env, stdio: 'pipe' });
      const installed = join(app, 'node_modules', pkg.name);
      assert.ok(lstatSync(installed).isDirectory() && !lstatSync(installed).isSymbolicLink(), 'a copy, not a link to the checkout');
      writeFileSync(join(app, 'esm.mjs'), "import { RateLimiter, limit } from 'redis-ratelimit-client';\nimport { rateLimit } from 'redis-ratelimit-client/express';\n"
        + "process.stdout.write([typeof RateLimiter, typeof rateLimit, limit('gcra', 5, '1s').periodMs].join(' '));\n");
      writeFileSync(join(app, 'cjs.cjs'), "const { RateLimiter, limit } = require('redis-ratelimit-client');\nconst { rateLimit } = require('redis-ratelimit-client/express');\n"
        + "process.stdout.write([typeof RateLimiter, typeof rateLimit, limit('gcra', 5, '1s').periodMs].join(' '));\n");
      for (const file of ['esm.mjs', 'cjs.cjs']) {
        assert.equal(execFileSync(process.execPath, [file], { cwd: app, encoding: 'utf8' }), 'function function 1000', file);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
