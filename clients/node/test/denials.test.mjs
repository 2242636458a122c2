// The denial cache: it never admits what a per-request CHECK refuses (random sequences of checks
// and takes on all six algorithms, BLOCK, one clock for AT and the limiter's monotonic clock, the
// same requests sent raw to a twin key); it only refuses, and only until the wait it was told;
// what another process's RESET or POLICY SET costs (the cached wait of under-admission); reset,
// refund and policies.set through the limiter drop what it holds; bounded.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ALGORITHMS, RateLimiter, limit, policy } from 'redis-ratelimit-client';

import { CLIENTS, NO_MODULE, closeClient, memoryLogger, random, raw, startServer } from './helpers.mjs';

const FLAVOUR = CLIENTS.find((c) => c.name === 'node-redis 6 RESP3');

function randomLimit(rand, algorithm) {
  const bucket = ['token-bucket', 'leaky-bucket', 'gcra'].includes(algorithm);
  const options = {};
  if (bucket && rand() < 0.5) options.burst = rand.int(1, 6);
  if (rand() < 0.25) options.block = rand.pick([500, '2s']);
  return limit(algorithm, rand.int(1, 6), rand.pick(['1s', 2500, '10s']), options);
}

function specArgs(l) {
  const a = [l.algorithm, String(l.limit), String(l.period)];
  if (l.burst !== undefined) a.push('BURST', String(l.burst));
  if (l.block !== undefined) a.push('BLOCK', String(l.block));
  return a;
}

for (const seed of [1, 2]) {
  test(`the denial cache never admits what a per-request CHECK refuses, nor waits longer (seed ${seed})`, async (t) => {
    if (NO_MODULE) return t.skip(NO_MODULE);
    const server = await startServer({ module: true });
    const client = await FLAVOUR.make(server);
    const twin = raw(server);
    // One clock: AT is base + elapsed, and the limiter's monotonic clock is elapsed.
    const base = Date.now() + 86400000 * (3 + seed);
    let elapsed = 0;
    const rl = new RateLimiter(client, { denialCache: 64, now: () => elapsed, timeoutMs: 30000, logger: memoryLogger() });
    const rand = random(0xcace + seed);
    const counts = { requests: 0, cached: 0, refused: 0, admitted: 0 };
    try {
      for (const algorithm of ALGORITHMS) {
        const keys = [`${algorithm}:1`, `${algorithm}:2`];
        const limits = [randomLimit(rand, algorithm), randomLimit(rand, algorithm)];
        for (let step = 0; step < 300; step += 1) {
          elapsed += rand.pick([0, 0, 0, 1, 5, 30, 120, 400, 1500]);
          const at = base + elapsed;
          const i = rand.int(0, 1);
          const l = limits[i];
          const key = keys[i];
          const amount = rand.pick([0, 1, 1, 1, 2, 3, 4, (l.burst ?? l.limit) + 1]);
          const take = rand() < 0.3 && amount > 0;
          const label = `${take ? 'TAKE' : 'CHECK'} ${key} ${specArgs(l).join(' ')} ${take ? 'MAX' : 'COST'} ${amount} AT ${at}`;
          const d = take ? await rl.take(key, l, amount, { at }) : await rl.check(key, l, { cost: amount, at });
          const reply = (await twin.call(`RATELIMIT.${take ? 'TAKE' : 'CHECK'}`, `twin:${key}`, ...specArgs(l), take ? 'MAX' : 'COST', amount, 'AT', at)).map(Number);
          const expected = take ? reply[0] > 0 : reply[0] === 1;
          assert.equal(d.allowed, expected, `${label}: ${d.source} ${JSON.stringify(d)} vs ${reply}`);
          assert.equal(d.granted, take ? reply[0] : expected ? amount : 0, label);
          if (d.source === 'cache') {
            counts.cached += 1;
            assert.ok(d.retryAfterMs > 0 && d.retryAfterMs <= reply[3], `${label}: the cached wait ${d.retryAfterMs} within the true ${reply[3]}`);
          } else {
            assert.equal(d.source, 'module', label);
            assert.deepEqual([d.limit, d.remaining, d.retryAfterMs, d.resetAfterMs, d.delayMs], reply.slice(1), label);
          }
          counts.requests += 1;
          counts[d.allowed ? 'admitted' : 'refused'] += 1;
        }
      }
      t.diagnostic(JSON.stringify({ ...counts, stats: rl.stats }));
      assert.ok(counts.cached > 100 && counts.admitted > 200, JSON.stringify(counts));
      assert.equal(rl.stats.decisions.cache, counts.cached);
      assert.equal(rl.stats.commands, counts.requests - counts.cached);
    } finally {
      twin.disconnect();
      await closeClient(client);
      await server.stop();
    }
  });
}

test("another process's RESET, REFUND or POLICY SET costs at most the cached wait; this limiter's own drop the key's refusals", async (t) => {
  if (NO_MODULE) return t.skip(NO_MODULE);
  const server = await startServer({ module: true });
  const client = await FLAVOUR.make(server);
  const other = raw(server);
  let elapsed = 0;
  const rl = new RateLimiter(client, { denialCache: 100, now: () => elapsed, timeoutMs: 30000, logger: memoryLogger() });
  const at = () => 1_900_000_000_000 + elapsed;
  const l = limit('fixed-window', 2, '10s');
  try {
    assert.equal((await rl.check('k', l, { at: at(), cost: 2 })).allowed, true);
    const refused = await rl.check('k', l, { at: at() });
    assert.deepEqual([refused.allowed, refused.source, refused.retryAfterMs], [false, 'module', 10000]);
    // Another process resets the key: the cache still refuses, counting the wait down.
    await other.call('RATELIMIT.RESET', 'k');
    elapsed += 4000;
    const cached = await rl.check('k', l, { at: at() });
    assert.deepEqual([cached.allowed, cached.source, cached.retryAfterMs, cached.resetAfterMs, cached.granted], [false, 'cache', 6000, 6000, 0]);
    // A smaller cost is not covered by a refusal of a larger one; a larger one is.
    assert.equal((await rl.check('k', l, { at: at(), cost: 2 })).source, 'cache');
    assert.deepEqual([(await rl.check('k', l, { at: at(), cost: 0 })).source], ['module']);
    // Another limit on the same key is another entry: asked of Redis.
    assert.equal((await rl.check('k', limit('fixed-window', 3, '10s'), { at: at() })).source, 'module');
    // A limit with a BLOCK: never cached (a refusal after the block ends starts another).
    const blocking = limit('fixed-window', 1, '10s', { block: 1000 });
    await rl.check('b', blocking, { at: at() });
    const sources = [];
    for (let i = 0; i < 3; i += 1) sources.push((await rl.check('b', blocking, { at: at() })).source);
    assert.deepEqual(sources, ['module', 'module', 'module']);
    // Once the wait has passed, Redis answers again.
    elapsed += 6000;
    assert.deepEqual([(await rl.check('k', l, { at: at() })).source], ['module']);
    // This limiter's reset and refund drop the key's refusals at once.
    await rl.check('k', l, { at: at() });
    const again = await rl.check('k', l, { at: at() });
    assert.deepEqual([again.allowed, again.source], [false, 'module']);
    assert.equal((await rl.check('k', l, { at: at() })).source, 'cache');
    await rl.refund('k', l, 1, { at: at() });
    const afterRefund = await rl.check('k', l, { at: at() });
    assert.deepEqual([afterRefund.allowed, afterRefund.source], [true, 'module']);
    assert.equal((await rl.check('k', l, { at: at() })).source, 'module'); // refused, now cached
    assert.equal((await rl.check('k', l, { at: at() })).source, 'cache');
    await rl.reset('k');
    assert.deepEqual([(await rl.check('k', l, { at: at() })).allowed], [true]);
    // take: a refusal is cached for a MAX at least the refused one.
    await rl.take('t', l, 5, { at: at() });
    const none = await rl.take('t', l, 3, { at: at() });
    assert.deepEqual([none.granted, none.source], [0, 'module']);
    assert.deepEqual([(await rl.take('t', l, 4, { at: at() })).source, (await rl.take('t', l, 2, { at: at() })).source], ['cache', 'module']);
    // Policies: another process's POLICY SET is seen once the wait passes; this limiter's at once.
    await rl.policies.set('p', limit('fixed-window', 1, '10s'));
    await rl.check('u', policy('p'), { at: at() });
    assert.equal((await rl.check('u', policy('p'), { at: at() })).source, 'module');
    await other.call('RATELIMIT.POLICY', 'SET', 'p', 'fixed-window', '5', '10s');
    assert.equal((await rl.check('u', policy('p'), { at: at() })).source, 'cache');
    await rl.policies.set('p', limit('fixed-window', 5, '10s'));
    const raised = await rl.check('u', policy('p'), { at: at() });
    assert.deepEqual([raised.allowed, raised.source], [true, 'module']);
  } finally {
    other.disconnect();
    await closeClient(client);
    await server.stop();
  }
});

test('the denial cache keeps refusals with a wait only, never admissions, peeks or checkAll; it is bounded; bad sizes are typed errors', async () => {
  const server = await startServer();
  const client = await FLAVOUR.make(server);
  let elapsed = 0;
  const rl = new RateLimiter(client, { denialCache: 2, now: () => elapsed, timeoutMs: 30000, logger: memoryLogger() });
  const at = 1_900_000_000_000;
  const l = limit('sliding-log', 1, '1m');
  try {
    for (const key of ['a', 'b', 'c']) {
      assert.equal((await rl.check(key, l, { at })).allowed, true);
      assert.equal((await rl.check(key, l, { at })).source, 'library');
    }
    // 'a' was the least recently used of three: dropped (and kept again, dropping 'b').
    const sources = [];
    for (const key of ['b', 'c', 'a', 'c', 'b']) sources.push((await rl.check(key, l, { at })).source);
    assert.deepEqual(sources, ['cache', 'cache', 'library', 'cache', 'library']);
    // Never: a cost above the limit is asked of Redis every time.
    assert.deepEqual([(await rl.check('n', l, { at, cost: 2 })).retryAfterMs, (await rl.check('n', l, { at, cost: 2 })).source], [-1, 'library']);
    // peek and checkAll go to Redis.
    assert.equal((await rl.peek('b', l, { at })).source, 'library');
    assert.equal((await rl.checkAll([['b', l]], { at })).source, 'library');
    const before = rl.stats;
    elapsed += 60000;
    assert.equal((await rl.check('b', l, { at: at + 60000 })).allowed, true);
    assert.equal(rl.stats.commands, before.commands + 1);
    for (const bad of [-1]) assert.throws(() => new RateLimiter(client, { denialCache: bad }), (e) => e instanceof RangeError && e.message.includes('-1'));
    assert.throws(() => new RateLimiter(client, { now: 5 }), (e) => e instanceof TypeError && e.message.includes('not 5'));
    for (const bad of [1.5, '10']) assert.throws(() => new RateLimiter(client, { denialCache: bad }), (e) => e instanceof TypeError && e.message.includes(String(bad)));
  } finally {
    await closeClient(client);
    await server.stop();
  }
});
