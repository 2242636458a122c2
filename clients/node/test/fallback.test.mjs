// onError 'local': the in-process limiter equals the module integer for integer (random sequences
// of check, peek, take and refund on all six algorithms, BLOCK, parameter changes, time running
// backwards, the largest numbers, at explicit AT times), decides while Redis is down or stalled,
// and hands back to Redis when it answers again.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ALGORITHMS, RateLimitError, RateLimiter, limit, policy } from 'redis-ratelimit-client';

import Redis5 from 'ioredis5';

import { NO_MODULE, closeClient, CLIENTS, memoryLogger, random, startServer } from './helpers.mjs';

const FIELDS = ['allowed', 'limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'delayMs'];
const STEPS = Number(process.env.NODE_LOCAL_STEPS || 400); // per algorithm and seed

/** A client whose every command fails as a refused connection does. */
function deadClient() {
  return { sendCommand: async () => { throw new Error('connect ECONNREFUSED 127.0.0.1:1'); } };
}

function fields(reply) {
  const [first, ...rest] = reply.map(Number);
  return Object.fromEntries(FIELDS.map((f, i) => [f, i === 0 ? first > 0 : rest[i - 1]]));
}

const pick = (d) => Object.fromEntries(FIELDS.map((f) => [f, d[f]]));

function specArgs(l) {
  const a = [l.algorithm, String(l.limit), String(l.period)];
  if (l.burst !== undefined) a.push('BURST', String(l.burst));
  if (l.block !== undefined) a.push('BLOCK', String(l.block));
  return a;
}

/** Small limits (refusals, partial grants, blocks), now and then the largest the module takes. */
function randomLimit(rand, algorithm) {
  const bucket = ['token-bucket', 'leaky-bucket', 'gcra'].includes(algorithm);
  const options = {};
  if (rand() < 0.06 && algorithm !== 'sliding-log') {
    if (bucket) options.burst = rand.pick([1, 1e12]);
    return limit(algorithm, rand.pick([1, 7, 1e12]), rand.pick(['3650d', 1, '1h']), options);
  }
  if (bucket && rand() < 0.5) options.burst = rand.int(1, 9);
  if (rand() < 0.2) options.block = rand.pick(['2s', 300, '1m']);
  return limit(algorithm, rand.int(1, 7), rand.pick(['1s', '10s', 2500, 333, '1m', 7]), options);
}

for (const seed of [1, 2, 3]) {
  test(`the in-process limiter answers as the module, integer for integer (seed ${seed})`, async (t) => {
    if (NO_MODULE) return t.skip(NO_MODULE);
    const server = await startServer({ module: true });
    // Numbers as strings: ioredis's own parsing of integers above 2^53 is not the nearest double.
    const twin = new Redis5({ port: server.port, host: '127.0.0.1', stringNumbers: true });
    const history = [];
    const logger = memoryLogger();
    const rl = new RateLimiter(deadClient(), { onError: 'local', logger });
    const rand = random(0xfa11 + seed);
    let at = Date.now() + 86400000 * (10 + seed);
    const counts = { allowed: 0, refused: 0, partial: 0, blocked: 0, never: 0, refunds: 0, checkAll: 0 };
    try {
      for (const algorithm of ALGORITHMS) {
        const keys = [`${algorithm}:a`, `${algorithm}:b`];
        let l = randomLimit(rand, algorithm);
        for (let step = 0; step < STEPS; step += 1) {
          at += rand.pick([0, 0, 1, 3, 40, 150, 333, 1000, 2600, 70000]);
          if (rand() < 0.03) at -= rand.int(1, 3000); // time running backwards now and then
          if (rand() < 0.08) l = randomLimit(rand, algorithm);
          const key = rand.pick(keys);
          const cost = rand.pick([0, 1, 1, 1, 2, 3, l.burst ?? l.limit, Math.min(1e12, (l.burst ?? l.limit) + 1), 1e12]);
          const op = rand.pick(['check', 'check', 'check', 'peek', 'take', 'take', 'refund', 'checkAll']);
          const label = `${op} ${key} ${specArgs(l).join(' ')} ${op === 'take' ? 'MAX' : 'COST'} ${cost} AT ${at}`;
          let d;
          let reply;
          if (op === 'checkAll') {
            // One to three limits on the two keys (a key named twice now and then), all or nothing.
            const items = Array.from({ length: rand.int(1, 3) }, () => [rand.pick(keys), rand() < 0.5 ? l : randomLimit(rand, algorithm)]);
            const all = await rl.checkAll(items, { cost, at });
            const replies = await twin.call('RATELIMIT.CHECKALL', items.length, ...items.map(([k]) => k), ...items.flatMap(([, x]) => specArgs(x)), 'COST', cost, 'AT', at);
            const text = `CHECKALL ${items.map(([k, x]) => `${k} ${specArgs(x).join(' ')}`).join(' | ')} COST ${cost} AT ${at}`;
            history.push(`${text} -> ${JSON.stringify(replies)}`);
            assert.deepEqual(all.limits.map(pick), replies.slice(1).map(fields), text);
            assert.deepEqual(pick(all), fields(replies[0]), text);
            assert.deepEqual([all.source, all.granted], ['fallback', all.allowed ? cost : 0], text);
            counts.checkAll += 1;
            continue;
          }
          if (op === 'take') {
            const max = Math.max(1, cost);
            d = await rl.take(key, l, max, { at });
            reply = await twin.call('RATELIMIT.TAKE', key, ...specArgs(l), 'MAX', max, 'AT', at);
            assert.equal(d.granted, Number(reply[0]), label);
            if (d.granted > 0 && d.granted < max) counts.partial += 1;
          } else {
            const command = { check: 'RATELIMIT.CHECK', peek: 'RATELIMIT.PEEK', refund: 'RATELIMIT.REFUND' }[op];
            d = op === 'refund' ? await rl.refund(key, l, cost, { at }) : await rl[op](key, l, { cost, at });
            reply = await twin.call(command, key, ...specArgs(l), 'COST', cost, 'AT', at);
            if (op === 'refund') counts.refunds += 1;
          }
          history.push(`${label} -> ${reply.join(' ')}`);
          assert.deepEqual(pick(d), fields(reply), `${label}\n${history.filter((h) => h.includes(` ${key} `)).slice(-12).join('\n')}`);
          assert.equal(d.source, 'fallback', label);
          counts[d.allowed ? 'allowed' : 'refused'] += 1;
          if (!d.allowed && d.retryAfterMs === -1) counts.never += 1;
          if (!d.allowed && l.block !== undefined && d.retryAfterMs > 0) counts.blocked += 1;
        }
      }
      t.diagnostic(JSON.stringify(counts));
      assert.ok(Object.values(counts).every((n) => n > 5), `every outcome exercised: ${JSON.stringify(counts)}`);
      assert.ok(logger.lines.some((line) => line.includes('failing over to the in-process limiter')), logger.lines.join('\n'));
    } finally {
      twin.disconnect();
      await server.stop();
    }
  });
}

test('localShare scales the limit and burst to exact integers, at least 1; bad options are typed errors', async () => {
  const at = 1_800_000_000_000;
  const admitted = async (rl, l) => {
    let n = 0;
    for (let i = 0; i < 200; i += 1) if ((await rl.check(`k${l.algorithm}${l.limit}`, l, { at })).allowed) n += 1;
    return n;
  };
  const share = (s) => new RateLimiter(deadClient(), { onError: 'local', localShare: s, logger: memoryLogger() });
  // 0.29 · 100 is 28.999999999999996 in floating point: the share is read as the decimal 0.29.
  assert.equal(await admitted(share(0.29), limit('fixed-window', 100, '1m')), 29);
  assert.equal(await admitted(share(0.5), limit('token-bucket', 10, '1m', { burst: 7 })), 3);
  assert.equal(await admitted(share(0.01), limit('sliding-log', 50, '1m')), 1);
  assert.equal(await admitted(share(1), limit('gcra', 100, '1m', { burst: 5 })), 5);
  const d = await share(0.5).check('x', limit('fixed-window', 9, '1m'), { at });
  assert.deepEqual([d.limit, d.remaining, d.source, d.granted, d.periodMs], [4, 3, 'fallback', 1, 60000]);
  for (const bad of [0, -0.5, 1.5, Infinity]) {
    assert.throws(() => share(bad), (e) => e instanceof RangeError && e.message.includes(String(bad)));
  }
  assert.throws(() => share('half'), (e) => e instanceof TypeError && e.message.includes("'half'"));
  assert.throws(() => new RateLimiter(deadClient(), { onError: 'locally' }), (e) => e instanceof TypeError && e.message.includes("'locally'"));
});

test('onError local: policies use their cached definition or their fallback, else fail open; leases fail open; checkAll all or nothing; a key of another algorithm is refused', async () => {
  const rl = new RateLimiter(deadClient(), { onError: 'local', logger: memoryLogger() });
  const at = 1_800_000_000_000;
  const withFallback = policy('api', { fallback: limit('fixed-window', 1, '1m') });
  assert.deepEqual([(await rl.check('p', withFallback, { at })).source, (await rl.check('p', withFallback, { at })).allowed], ['fallback', false]);
  const d = await rl.check('q', policy('bare'), { at });
  assert.deepEqual([d.source, d.allowed, d.granted], ['error', true, 1]);
  assert.equal((await rl.acquire('l', 1, '1s', { id: 'a', at })).source, 'error');
  const all = await rl.checkAll([['{a}1', limit('fixed-window', 1, '1m')], ['{a}2', policy('unknown')]], { at, cost: 2 });
  assert.deepEqual([all.source, all.granted], ['error', 2]);
  const local = await rl.checkAll([['{a}1', limit('fixed-window', 3, '1m')], ['{a}2', limit('fixed-window', 9, '1h')]], { at, cost: 2 });
  assert.deepEqual([local.source, local.granted, local.remaining, local.periodMs, local.limits.map((d) => d.remaining)], ['fallback', 2, 1, 60000, [1, 7]]);
  await rl.check('mixed', limit('gcra', 5, '1s'), { at });
  await assert.rejects(rl.check('mixed', limit('fixed-window', 5, '1s'), { at }), (e) => e instanceof RateLimitError && /holds a gcra limiter, not fixed-window/.test(e.message));
});

test('onError local: a stalled server is decided in process, exactly, and Redis decides again once it answers', async () => {
  const server = await startServer();
  const flavour = CLIENTS.find((c) => c.name === 'node-redis 6 RESP3');
  const client = await flavour.make(server);
  let clock = 1_000_000;
  const logger = memoryLogger();
  const rl = new RateLimiter(client, { onError: 'local', timeoutMs: 1000, breaker: { failures: 2, cooldownMs: 5000 }, now: () => clock, logger });
  const l = limit('fixed-window', 3, '1m');
  const at = Math.floor(Date.now() / 60000) * 60000 + 86400000;
  try {
    assert.equal((await new RateLimiter(client, { timeoutMs: 30000, logger: memoryLogger() }).check('warm', l)).source, 'library');
    assert.deepEqual([(await rl.check('s', l, { at })).source, (await rl.check('s', l, { at })).remaining], ['library', 1]);
    server.pause();
    // Redis's count is not known here: the in-process limiter starts from its own (the limit
    // again, at most: the bound of docs/guarantees.md for a partition).
    const seen = [];
    for (let i = 0; i < 5; i += 1) {
      const d = await rl.check('s', l, { at: at + i });
      seen.push([d.source, d.allowed, d.remaining]);
    }
    assert.deepEqual(seen, [
      ['fallback', true, 2], ['fallback', true, 1], ['fallback', true, 0], ['fallback', false, 0], ['fallback', false, 0],
    ]);
    const taken = await rl.take('t', l, 5, { at });
    assert.deepEqual([taken.source, taken.granted, taken.remaining], ['fallback', 3, 0]);
    assert.ok(rl.breakerOpen);
    server.resume();
    clock += 5001; // the next call is the breaker's probe: Redis answers, and decides again
    const back = await rl.check('s', l, { at: at + 10 });
    assert.deepEqual([back.source, back.remaining], ['library', 0]);
    assert.equal(rl.breakerOpen, false);
    // The failure and the recovery are logged at one level: who sees one sees the other.
    const down = logger.lines.filter((line) => line.includes('Redis unavailable'));
    const up = logger.lines.filter((line) => line.includes('Redis answers again'));
    assert.deepEqual([down.length, up.length], [1, 1], logger.lines.join('\n'));
    assert.equal(up[0].split(' ')[0], down[0].split(' ')[0], logger.lines.join('\n'));
    assert.match(up[0], /^warn ratelimit: Redis answers again$/);
  } finally {
    server.resume();
    await closeClient(client);
    await server.stop();
  }
});

test('onError local: checkAll starts and answers blocks as the module does (once per key, admitted or not)', async (t) => {
  if (NO_MODULE) return t.skip(NO_MODULE);
  const server = await startServer({ module: true });
  const twin = new Redis5({ port: server.port, host: '127.0.0.1', stringNumbers: true });
  const rl = new RateLimiter(deadClient(), { onError: 'local', logger: memoryLogger() });
  const base = Math.ceil((Date.now() + 86400000) / 60000) * 60000;
  const l1 = limit('fixed-window', 2, '10s', { block: '5s' });
  const l2 = limit('sliding-log', 5, '10s', { block: 700 });
  const l3 = limit('fixed-window', 2, '10s', { block: '1s' });
  const steps = [
    [0, 2, [['k1', l1]]],
    [100, 1, [['k1', l1], ['k2', l2]]],
    [200, 0, [['k1', l1], ['k1', l3]]],
    [300, 1, [['k2', l2], ['k2', l2], ['k1', l1]]],
    [6000, 1, [['k2', l2], ['k2', l2], ['k1', l3], ['k1', l1]]],
    [6500, 2, [['k2', l2], ['k2', l2], ['k2', l2]]],
    [7000, 1, [['k2', l2], ['k1', l1]]],
    [12000, 1, [['k1', l1], ['k1', l1], ['k2', l2]]],
  ];
  try {
    for (const [offset, cost, items] of steps) {
      const at = base + offset;
      const label = `CHECKALL ${items.map(([k, x]) => `${k} ${specArgs(x).join(' ')}`).join(' | ')} COST ${cost} AT +${offset}`;
      const all = await rl.checkAll(items, { cost, at });
      const replies = await twin.call('RATELIMIT.CHECKALL', items.length, ...items.map(([k]) => k), ...items.flatMap(([, x]) => specArgs(x)), 'COST', cost, 'AT', at);
      assert.deepEqual([pick(all), ...all.limits.map(pick)], replies.map(fields), label);
    }
  } finally {
    twin.disconnect();
    await server.stop();
  }
});
