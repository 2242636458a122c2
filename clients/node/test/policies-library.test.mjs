// Policies (the module), and the Functions library: loaded when missing, replaced when older,
// kept when complete, loaded again after a FUNCTION FLUSH; identical to its one source.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

import { LIBRARY, RateLimitError, RateLimiter, limit, policy } from 'redis-ratelimit-client';

import { CLIENTS, NO_MODULE, closeClient, memoryLogger, raw, startServer } from './helpers.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const SOURCE = readFileSync(resolve(root, pkg.ratelimit.library), 'utf8');
const LIMIT = limit('sliding-window', 3, '1m');

async function loadedCode(server) {
  const client = raw(server);
  try {
    const [library] = await client.call('FUNCTION', 'LIST', 'LIBRARYNAME', 'ratelimit', 'WITHCODE');
    if (!library) return null;
    return library[library.indexOf('library_code') + 1];
  } finally {
    client.disconnect();
  }
}

test('the shipped library is its source, byte for byte (package.json names the source)', () => {
  assert.equal(LIBRARY, SOURCE);
  assert.equal(readFileSync(join(root, 'dist/ratelimit.lua'), 'utf8'), SOURCE);
  assert.match(LIBRARY, /^#!lua name=ratelimit\n/);
});

for (const flavour of CLIENTS.filter((c) => ['node-redis 6 RESP3', 'ioredis 5'].includes(c.name))) {
  test(`${flavour.name}: the library is loaded when missing, replaced when older, kept when complete, reloaded after a flush`, async () => {
    const server = await startServer();
    const client = await flavour.make(server);
    const admin = raw(server);
    try {
      const first = memoryLogger();
      const rl = new RateLimiter(client, { logger: first, timeoutMs: 30000 });
      assert.equal((await rl.check('a', LIMIT)).remaining, 2);
      assert.equal(await loadedCode(server), LIBRARY);
      assert.ok(first.lines.includes("info ratelimit: loaded the Functions library 'ratelimit'"), first.lines.join('\n'));
      assert.equal(await admin.exists('fn:a'), 1);
      // A second limiter finds it loaded: nothing loaded again.
      const second = memoryLogger();
      assert.equal((await new RateLimiter(client, { logger: second, timeoutMs: 30000 }).check('a', LIMIT)).remaining, 1);
      assert.ok(!second.lines.some((l) => l.includes('loaded the Functions library')), second.lines.join('\n'));
      // An older library (fewer functions) is replaced.
      await admin.call('FUNCTION', 'LOAD', 'REPLACE', "#!lua name=ratelimit\nredis.register_function('ratelimit_check', function() return {1, 1, 1, 0, 0, 0} end)");
      const third = memoryLogger();
      assert.equal((await new RateLimiter(client, { logger: third, timeoutMs: 30000 }).check('a', LIMIT)).remaining, 0);
      assert.equal(await loadedCode(server), LIBRARY);
      assert.ok(third.lines.some((l) => l.includes('replaced an older Functions library')), third.lines.join('\n'));
      // Another complete library (another version, say) is used as is, with a warning.
      const other = `${LIBRARY}\n-- another build\n`;
      await admin.call('FUNCTION', 'LOAD', 'REPLACE', other);
      const fourth = memoryLogger();
      assert.equal((await new RateLimiter(client, { logger: fourth, timeoutMs: 30000 }).peek('a', LIMIT, { cost: 0 })).remaining, 0);
      assert.equal(await loadedCode(server), other);
      assert.ok(fourth.lines.some((l) => l.startsWith('warn') && l.includes('differs')), fourth.lines.join('\n'));
      // Flushed under a running limiter: loaded again, the call answered.
      await admin.call('FUNCTION', 'FLUSH');
      assert.equal((await rl.check('b', LIMIT)).source, 'library');
      assert.equal(await loadedCode(server), LIBRARY);
      // loadLibrary: false leaves it to the operator: the server's error as is.
      await admin.call('FUNCTION', 'FLUSH');
      const manual = new RateLimiter(client, { loadLibrary: false, engine: 'library', logger: memoryLogger(), timeoutMs: 30000 });
      await assert.rejects(manual.check('c', LIMIT), (e) => /Function not found/.test(e.message));
      // engine: 'module' on a server without it: the server's error as is, not a fallback.
      const moduleOnly = new RateLimiter(client, { engine: 'module', logger: memoryLogger(), timeoutMs: 30000 });
      await assert.rejects(moduleOnly.check('c', LIMIT), (e) => /unknown command/i.test(e.message));
      // Policies: the library has none; a fallback applies, else a clear error.
      const d = await rl.check('p', policy('api', { fallback: limit('fixed-window', 7, '10s') }));
      assert.deepEqual([d.source, d.limit, d.remaining, d.periodMs], ['library', 7, 6, 10000]);
      await assert.rejects(rl.check('p', policy('api')), (e) => e instanceof RateLimitError && /no fallback/.test(e.message));
      await assert.rejects(rl.policies.list(), (e) => e instanceof RateLimitError && /need the redis-ratelimit module/.test(e.message));
    } finally {
      admin.disconnect();
      await closeClient(client);
      await server.stop();
    }
  });
}

for (const flavour of CLIENTS.filter((c) => ['node-redis 6 RESP3', 'node-redis 6 RESP2', 'ioredis 6'].includes(c.name))) {
  test(`${flavour.name}: policies set, get, list, delete; checks through them, shadow rejections seen`, async (t) => {
    if (NO_MODULE) return t.skip(NO_MODULE);
    const server = await startServer({ module: true });
    const client = await flavour.make(server);
    const admin = raw(server);
    try {
      const logger = memoryLogger();
      const rl = new RateLimiter(client, { logger, policyRefreshMs: 0, timeoutMs: 30000 });
      assert.equal(await rl.policies.get('api'), null);
      await rl.policies.set('api', limit('token-bucket', 2, '1s', { burst: 4 }), { shadow: true });
      await rl.policies.set('login', limit('fixed-window', 3, '15m', { block: '1h' }));
      assert.deepEqual(await rl.policies.list(), ['api', 'login']);
      const api = await rl.policies.get('api');
      assert.deepEqual(
        { algorithm: api.algorithm, limit: api.limit, periodMs: api.periodMs, burst: api.burst, mode: api.mode, blockMs: api.blockMs },
        { algorithm: 'token-bucket', limit: 2, periodMs: 1000, burst: 4, mode: 'shadow', blockMs: 0 },
      );
      assert.equal((await rl.policies.get('login')).blockMs, 3600000);
      // Shadow mode: every call admitted; the ones enforcement would refuse say so.
      const at = Date.now() + 86400000;
      const seen = [];
      for (let i = 0; i < 6; i += 1) {
        const d = await rl.check('u', policy('api'), { at });
        assert.equal(d.allowed, true);
        assert.equal(d.periodMs, 1000);
        seen.push(d.shadowRejected);
      }
      assert.deepEqual(seen, [false, false, false, false, true, true]);
      const info = await admin.info('ratelimit');
      assert.match(info, /ratelimit_policy_api:.*shadow_rejected=2/);
      // take through the shadow policy: MAX granted; short of what enforcement grants, it says so.
      const full = await rl.take('w', policy('api'), 3, { at });
      assert.deepEqual([full.granted, full.allowed, full.shadowRejected], [3, true, false]);
      const short = await rl.take('w', policy('api'), 3, { at });
      assert.deepEqual([short.granted, short.allowed, short.shadowRejected], [3, true, true]);
      assert.match(await admin.info('ratelimit'), /ratelimit_policy_api:.*shadow_rejected=3/);
      // checkAll: the shadow limit that would refuse says so; the enforced one admits.
      const both = await rl.checkAll([['{v}a', policy('api')], ['{v}b', limit('fixed-window', 5, '1m')]], { cost: 3, at });
      assert.deepEqual([both.allowed, both.shadowRejected, both.limits[0].shadowRejected, both.limits[1].shadowRejected], [true, false, false, false]);
      const again = await rl.checkAll([['{v}a', policy('api')], ['{v}b', limit('fixed-window', 5, '1m')]], { cost: 2, at });
      assert.deepEqual([again.allowed, again.shadowRejected, again.limits[0].shadowRejected, again.limits[1].shadowRejected], [true, true, true, false]);
      // Enforced again: refused for real, not a shadow rejection.
      await rl.policies.set('api', limit('token-bucket', 2, '1s', { burst: 4 }));
      const enforced = await rl.check('u', policy('api'), { at });
      assert.deepEqual([enforced.allowed, enforced.shadowRejected], [false, false]);
      const taken = await rl.take('w', policy('api'), 3, { at });
      assert.deepEqual([taken.granted, taken.allowed, taken.shadowRejected], [0, false, false]);
      // A policy the server lacks: its fallback, warned once; without one, the module's error.
      const fallback = policy('missing', { fallback: limit('fixed-window', 9, '1m') });
      assert.equal((await rl.check('m', fallback)).remaining, 8);
      assert.equal((await rl.check('m', fallback)).remaining, 7);
      assert.equal(logger.lines.filter((l) => l.includes("no policy 'missing'")).length, 1, logger.lines.join('\n'));
      await assert.rejects(rl.check('m', policy('nothere')), (e) => e.message === "ERR no such policy 'nothere'");
      assert.equal(await rl.policies.delete('login'), true);
      assert.equal(await rl.policies.delete('login'), false);
      assert.deepEqual(await rl.policies.list(), ['api']);
      assert.throws(() => policy('bad:name'), TypeError);
      // The module's own errors come through as they are.
      await assert.rejects(rl.policies.set('x', limit('fixed-window', 1, '1s', { block: '1s' }), { shadow: true }).then(() => rl.check('c', policy('x'), { cost: 2 })).then(() => admin.set('c2', 'v')).then(() => rl.check('c2', policy('x'))), (e) => /^WRONGTYPE/.test(e.message));
    } finally {
      admin.disconnect();
      await closeClient(client);
      await server.stop();
    }
  });
}
