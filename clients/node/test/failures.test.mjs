// onError 'open' and 'closed' with the server killed and SIGSTOPped; the bound on every call
// (timeoutMs, asserted loosely); the breaker, counted in the calls that reach the server.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { RateLimitUnavailable, RateLimiter, limit } from 'redis-ratelimit-client';

import { CLIENTS, closeClient, memoryLogger, raw, startServer } from './helpers.mjs';

const LIMIT = limit('fixed-window', 100, '1m');
const FLAVOURS = CLIENTS.filter((c) => ['node-redis 6 RESP3', 'node-redis 4', 'ioredis 6'].includes(c.name));
// Loose: a call bounded by timeoutMs ends within it plus this, however busy the machine is.
const SLACK_MS = 4000;

/** How many times the server ran FCALL (the library's calls) so far. */
async function fcalls(server) {
  const client = raw(server);
  try {
    const stats = await client.info('commandstats');
    return Number(/cmdstat_fcall:calls=(\d+)/.exec(stats)?.[1] ?? 0);
  } finally {
    client.disconnect();
  }
}

async function timed(work) {
  const started = performance.now();
  const result = await work();
  return [result, performance.now() - started];
}

for (const flavour of FLAVOURS) {
  test(`${flavour.name}: a killed server fails open, or closed, within timeoutMs`, async () => {
    const server = await startServer();
    const client = await flavour.make(server);
    try {
      // The library loaded first, by a patient limiter (the machine may be busy).
      assert.equal((await new RateLimiter(client, { timeoutMs: 30000, logger: memoryLogger() }).check('k', LIMIT)).source, 'library');
      const logger = memoryLogger();
      const open = new RateLimiter(client, { onError: 'open', timeoutMs: 200, logger });
      const closed = new RateLimiter(client, { onError: 'closed', timeoutMs: 200, logger: memoryLogger() });
      await server.stop();
      const [d, ms] = await timed(() => open.check('k', LIMIT));
      assert.deepEqual(
        { allowed: d.allowed, source: d.source, remaining: d.remaining, limit: d.limit },
        { allowed: true, source: 'error', remaining: 0, limit: 0 },
      );
      assert.ok(ms < 200 + SLACK_MS, `${ms} ms`);
      const [error, closedMs] = await timed(() => closed.check('k', LIMIT).then(() => null, (e) => e));
      assert.ok(error instanceof RateLimitUnavailable, String(error));
      assert.ok(closedMs < 200 + SLACK_MS, `${closedMs} ms`);
      // Calls without a decision to fall back to reject in both modes.
      await assert.rejects(open.reset('k'), RateLimitUnavailable);
      await assert.rejects(open.policies.list(), RateLimitUnavailable);
      // withLease runs the work without a lease when failing open; refuses when closed.
      assert.equal(await open.withLease('w', 1, '1s', async (acquired) => acquired.source), 'error');
      await assert.rejects(closed.withLease('w', 1, '1s', async () => 'ran'), RateLimitUnavailable);
      assert.ok(logger.lines.some((l) => l.startsWith('warn ratelimit: Redis unavailable')), logger.lines.join('\n'));
    } finally {
      await closeClient(client);
      await server.stop();
    }
  });

  test(`${flavour.name}: a stalled server costs timeoutMs for the first calls, then the breaker answers at once`, async (t) => {
    const server = await startServer();
    const client = await flavour.make(server);
    let clock = 1_000_000;
    // Long enough that a call to a running server never takes it, however busy the machine.
    const timeoutMs = 1000;
    const rl = new RateLimiter(client, { onError: 'open', timeoutMs, breaker: { failures: 3, cooldownMs: 5000 }, now: () => clock, logger: memoryLogger() });
    const closed = new RateLimiter(client, { onError: 'closed', timeoutMs, logger: memoryLogger() });
    try {
      assert.equal((await new RateLimiter(client, { timeoutMs: 30000, logger: memoryLogger() }).check('s', LIMIT)).source, 'library');
      assert.equal((await rl.check('s', LIMIT)).source, 'library');
      const before = await fcalls(server);
      server.pause();
      const costs = [];
      for (let i = 0; i < 10; i += 1) {
        const [d, ms] = await timed(() => rl.check('s', LIMIT));
        assert.equal(d.source, 'error');
        assert.equal(d.allowed, true);
        costs.push(ms);
      }
      const [error, closedMs] = await timed(() => closed.check('s', LIMIT).then(() => null, (e) => e));
      assert.ok(error instanceof RateLimitUnavailable, String(error));
      assert.ok(rl.breakerOpen);
      // Every call ends within about timeoutMs.
      assert.ok(Math.max(...costs, closedMs) < timeoutMs + SLACK_MS, costs.join(', '));
      t.diagnostic(`stalled server, timeoutMs ${timeoutMs}: ms per request ${costs.map((c) => c.toFixed(0)).join(', ')}; closed: ${closedMs.toFixed(0)}`);
      // While open, one probe per cool-down: the clock moves past it, one call goes out.
      clock += 5001;
      assert.equal((await rl.check('s', LIMIT)).source, 'error'); // the probe, timing out
      for (let i = 0; i < 5; i += 1) assert.equal((await rl.check('s', LIMIT)).source, 'error');
      server.resume();
      // What reached the server: 3 calls before the breaker opened, the probe, the closed
      // limiter's; each answered after its timeout, admitted, and so given back (a REFUND each):
      // close() waits for the late answers and their refunds.
      await rl.close();
      await closed.close();
      assert.deepEqual([rl.stats.lateReplies, closed.stats.lateReplies], [4, 1]);
      assert.equal((await fcalls(server)) - before, (3 + 1 + 1) * 2);
      // Within the cool-down nothing goes out, even with the server back.
      assert.equal((await rl.check('s', LIMIT)).source, 'error');
      // After it, the probe succeeds and the breaker closes.
      clock += 5001;
      assert.equal((await rl.check('s', LIMIT)).source, 'library');
      assert.equal(rl.breakerOpen, false);
      assert.equal((await rl.check('s', LIMIT)).source, 'library');
      assert.equal((await fcalls(server)) - before, 10 + 1 + 1);
    } finally {
      server.resume();
      await closeClient(client);
      await server.stop();
    }
  });
}

test('error replies that are the caller\'s mistake reject with the server\'s text, open or not, and do not trip the breaker', async () => {
  const server = await startServer();
  const client = await FLAVOURS[0].make(server);
  try {
    const rl = new RateLimiter(client, { onError: 'open', breaker: { failures: 1 }, timeoutMs: 30000, logger: memoryLogger() });
    await client.sendCommand(['SET', 'fn:str', 'v']);
    for (let i = 0; i < 3; i += 1) await assert.rejects(rl.check('str', LIMIT), (e) => /^WRONGTYPE/.test(e.message));
    await rl.check('tb', limit('token-bucket', 5, '1s'));
    await assert.rejects(rl.check('tb', limit('fixed-window', 5, '1s')), (e) => /key holds a token-bucket limiter, not fixed-window/.test(e.message));
    assert.equal(rl.breakerOpen, false);
    assert.equal((await rl.check('ok', LIMIT)).source, 'library');
    assert.throws(() => limit('sliding-windw', 5, '1s'), (e) => e instanceof TypeError && /token-bucket, leaky-bucket, fixed-window, sliding-window, sliding-log, gcra/.test(e.message));
    await assert.rejects(rl.check('', LIMIT), TypeError);
    await assert.rejects(rl.check('k', LIMIT, { cost: -1 }), RangeError);
    await assert.rejects(rl.checkAll([]), TypeError);
    await assert.rejects(rl.acquire('k', 1, '1s', {}), /^TypeError: id must be a non-empty string/);
    await assert.rejects(rl.check('k', { algorithm: 'fixed-window', limit: 1, period: '1s' }), /limit\(\.\.\.\) or a policy/);
  } finally {
    await closeClient(client);
    await server.stop();
  }
});

test('a stall under concurrent load: every call in flight pays the timeout once, then the breaker answers without Redis', async () => {
  const server = await startServer();
  const client = await FLAVOURS[0].make(server);
  try {
    const rl = new RateLimiter(client, { onError: 'open', timeoutMs: 1000, breaker: { failures: 3, cooldownMs: 60000 }, logger: memoryLogger() });
    assert.equal((await rl.check('c', LIMIT)).source, 'library');
    server.pause();
    const sentBefore = rl.stats.commands;
    // Ten requests at once: all go to Redis (the breaker is closed when they start), all time out.
    const all = await Promise.all(Array.from({ length: 10 }, () => timed(() => rl.check('c', LIMIT))));
    assert.deepEqual(all.map(([d]) => d.source), Array(10).fill('error'));
    assert.ok(all.every(([, ms]) => ms >= 1000 - 50 && ms < 1000 + SLACK_MS), all.map(([, ms]) => ms.toFixed(0)).join(', '));
    assert.equal(rl.stats.commands - sentBefore, 10);
    assert.ok(rl.breakerOpen);
    // Then: answered at once, nothing sent, for the whole cool-down.
    for (let i = 0; i < 20; i += 1) assert.equal((await rl.check('c', LIMIT)).source, 'error');
    assert.equal(rl.stats.commands - sentBefore, 10);
    server.resume();
    await rl.close();
  } finally {
    server.resume();
    await closeClient(client);
    await server.stop();
  }
});
