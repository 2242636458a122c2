// Batches: the stated bound (over any window, batched admissions exceed what per-request CHECKs
// would have admitted by at most the units held when the window starts), tested on all six
// algorithms with several limiters on one key, one clock for AT and the limiters' monotonic
// clock, every admission logged with its time and the same requests replayed as per-request
// CHECKs on a twin key; unused units given back when the hold ends or the limiter closes; one TAKE
// in flight shared by concurrent callers; a failed refund logged; bad options refused.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ALGORITHMS, RateLimiter, limit } from 'redis-ratelimit-client';

import { CLIENTS, NO_MODULE, closeClient, memoryLogger, random, raw, sleep, startServer } from './helpers.mjs';

const FLAVOUR = CLIENTS.find((c) => c.name === 'node-redis 6 RESP3');
const CLIENT_COUNT = 3;
const RUN_MS = Number(process.env.NODE_BATCH_RUN_MS || 6000);

function specArgs(l) {
  const a = [l.algorithm, String(l.limit), String(l.period)];
  if (l.burst !== undefined) a.push('BURST', String(l.burst));
  return a;
}

/** Admissions `[time, cost]` in `[from, to)`, from prefix sums over times sorted ascending. */
function counter(admissions) {
  const sorted = [...admissions].sort((a, b) => a[0] - b[0]);
  const times = sorted.map(([time]) => time);
  const sums = [0];
  for (const [, cost] of sorted) sums.push(sums[sums.length - 1] + cost);
  const before = (time) => {
    let lo = 0;
    let hi = times.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (times[mid] < time) lo = mid + 1;
      else hi = mid;
    }
    return sums[lo];
  };
  return (from, to) => before(to) - before(from);
}

for (const algorithm of ALGORITHMS) {
  test(`${algorithm}: over every 100 ms and 1 s window, batched admissions stay within what Redis admitted plus the units held when it starts, and Redis admitted what per-request CHECKs admit`, async (t) => {
    if (NO_MODULE) return t.skip(NO_MODULE);
    const server = await startServer({ module: true });
    // RESP2: the logged replies are arrays.
    const client = await CLIENTS.find((c) => c.name === 'node-redis 6 RESP2').make(server);
    const twin = raw(server);
    const rand = random(0xba7c + ALGORITHMS.indexOf(algorithm));
    const base = Math.ceil((Date.now() + 86400000) / 3600000) * 3600000;
    let elapsed = 0;
    // Every command the limiters send, with its reply, in the order sent (one connection); not
    // their one COMMAND INFO each (how the module takes a spec), which decides nothing.
    const sent = [];
    const logging = {
      sendCommand: (args) => {
        if (args[0] === 'COMMAND') return client.sendCommand(args);
        const entry = { args, reply: null };
        sent.push(entry);
        return client.sendCommand(args).then((reply) => (entry.reply = reply));
      },
    };
    const options = { now: () => elapsed, timeoutMs: 30000, logger: memoryLogger() };
    const limiters = Array.from({ length: CLIENT_COUNT }, () => new RateLimiter(logging, options));
    const bucket = ['token-bucket', 'leaky-bucket', 'gcra'].includes(algorithm);
    const batched = limit(algorithm, 200, '1s', { ...(bucket ? { burst: 50 } : {}), batch: '50ms', batchMax: 20 });
    const plain = limit(algorithm, 200, '1s', bucket ? { burst: 50 } : {});
    const requests = []; // [time, cost], in the order sent
    const admitted = []; // [time, cost]
    const direct = []; // [time, cost] admitted by a CHECK of their own (a cost above what a batch held, refused by its TAKE)
    const steps = []; // [time, units held, taken, refunded] after the requests at that time (cumulative)
    const total = (field) => limiters.reduce((sum, rl) => sum + rl.stats[field], 0);
    let refused = 0;
    try {
      while (elapsed < RUN_MS) {
        // Busy stretches above the limit, quiet ones below it, and pauses longer than a hold.
        const phase = Math.floor(elapsed / 700) % 3;
        elapsed += phase === 0 ? rand.pick([0, 1, 2, 4, 8]) : phase === 1 ? rand.pick([2, 5, 10, 20]) : rand.pick([5, 20, 120, 400]);
        const at = base + elapsed;
        const burst = Array.from({ length: rand.pick([1, 1, 2, 3, 5]) }, () => [rand.int(0, CLIENT_COUNT - 1), rand.pick([1, 1, 1, 1, 2, 3])]);
        const decisions = await Promise.all(burst.map(([c, cost]) => limiters[c].check('hot', batched, { cost, at })));
        burst.forEach(([, cost], i) => {
          requests.push([elapsed, cost]);
          if (!decisions[i].allowed) {
            refused += 1;
            return;
          }
          admitted.push([elapsed, cost]);
          if (decisions[i].source !== 'local') direct.push([elapsed, cost]);
        });
        steps.push([elapsed, total('held'), total('batchTaken'), total('batchRefunded')]);
      }
      const stats = limiters.map((rl) => rl.stats);
      await Promise.all(limiters.map((rl) => rl.close()));
      assert.ok(limiters.every((rl) => rl.stats.held === 0));
      assert.equal(total('batchTaken'), total('batchUsed') + total('batchRefunded'));

      // 1. What the batches took and gave back is what per-request CHECKs and REFUNDs answer: each
      // TAKE granting g is the CHECK of cost g (of 1 when g is 0) at its time, field for field.
      let takes = 0;
      for (const { args, reply } of sent) {
        const [command, , ...rest] = args;
        const at = rest.slice(rest.indexOf('AT'));
        if (command === 'RATELIMIT.TAKE') {
          takes += 1;
          const granted = Number(reply[0]);
          // A leaky bucket's TAKE reports the wait of its last unit: the CHECK of that unit after
          // the others (docs/commands.md).
          if (algorithm === 'leaky-bucket' && granted > 1) await twin.call('RATELIMIT.CHECK', 'twin', ...specArgs(plain), 'COST', granted - 1, ...at);
          const last = algorithm === 'leaky-bucket' && granted > 1 ? 1 : Math.max(granted, 1);
          const check = (await twin.call('RATELIMIT.CHECK', 'twin', ...specArgs(plain), 'COST', last, ...at)).map(Number);
          assert.deepEqual(check, [granted > 0 ? 1 : 0, ...reply.slice(1).map(Number)], `${args.join(' ')} -> ${reply}`);
        } else if (command === 'RATELIMIT.CHECK') {
          const check = (await twin.call('RATELIMIT.CHECK', 'twin', ...specArgs(plain), ...rest.slice(rest.indexOf('COST')))).map(Number);
          assert.deepEqual(check, reply.map(Number), args.join(' '));
        } else {
          assert.equal(command, 'RATELIMIT.REFUND', args.join(' '));
          const cost = rest[rest.indexOf('COST') + 1];
          const refund = (await twin.call('RATELIMIT.REFUND', 'twin', ...specArgs(plain), 'COST', cost, ...at)).map(Number);
          assert.deepEqual(refund, reply.map(Number), args.join(' '));
        }
      }

      // 2. Over every window, admissions <= what Redis admitted (granted - given back) in it +
      // the units held when it starts.
      const ours = counter(admitted);
      const granted = counter(steps.map(([time, , taken], i) => [time, taken - (i > 0 ? steps[i - 1][2] : 0)]));
      const own = counter(direct);
      // Given back at the time each REFUND was sent at (its AT), not when its answer was counted:
      // a refund the batch's timer sends is answered while later requests run.
      const givenBack = counter(sent.filter(({ args }) => args[0] === 'RATELIMIT.REFUND')
        .map(({ args }) => [Number(args[args.indexOf('AT') + 1]) - base, Number(args[args.indexOf('COST') + 1])]));
      const heldAt = (start) => {
        let units = 0;
        for (const [time, h] of steps) {
          if (time >= start) break;
          units = h;
        }
        return units;
      };
      // For the record: the same requests, one CHECK each, on another key.
      const perRequest = [];
      for (const [time, cost] of requests) {
        const reply = await twin.call('RATELIMIT.CHECK', 'replay', ...specArgs(plain), 'COST', cost, 'AT', base + time);
        if (Number(reply[0]) === 1) perRequest.push([time, cost]);
      }
      const theirs = counter(perRequest);
      const worst = {};
      for (const width of [100, 1000]) {
        worst[width] = { excess: 0, held: 0, versusReplay: -Infinity };
        for (let start = 0; start <= elapsed; start += 5) {
          const end = start + width;
          const redis = granted(start, end) - givenBack(start, end) + own(start, end);
          const held = heldAt(start);
          const excess = ours(start, end) - redis;
          assert.ok(excess <= held, `window [${start}, ${end}) ms: ${ours(start, end)} admitted, ${redis} admitted by Redis, ${held} held at its start`);
          if (excess > worst[width].excess) Object.assign(worst[width], { excess, held });
          worst[width].versusReplay = Math.max(worst[width].versusReplay, ours(start, end) - theirs(start, end) - held);
        }
      }
      const commands = stats.reduce((sum, s) => sum + s.commands, 0);
      const local = stats.reduce((sum, s) => sum + s.decisions.local, 0);
      t.diagnostic(JSON.stringify({ requests: requests.length, admitted: admitted.length, perRequest: perRequest.length, refused, local, takes, commands, worst }));
      // Batches served, refusals happened; over a whole run, the replayed CHECKs and the batches
      // admit about as much (the long-run rate is the limit's).
      assert.ok(local > requests.length / 4 && refused > 20 && takes > 20, JSON.stringify({ local, refused, takes }));
      assert.ok(Math.abs(admitted.length - perRequest.length) <= 0.05 * perRequest.length, `${admitted.length} batched, ${perRequest.length} per request`);
    } finally {
      twin.disconnect();
      await closeClient(client);
      await server.stop();
    }
  });
}

test('units left when the hold ends or the limiter closes are given back: Redis then counts only what was admitted', async (t) => {
  if (NO_MODULE) return t.skip(NO_MODULE);
  const server = await startServer({ module: true });
  const client = await FLAVOUR.make(server);
  const admin = raw(server);
  const base = Math.ceil((Date.now() + 86400000) / 3600000) * 3600000;
  let elapsed = 0;
  const rl = new RateLimiter(client, { now: () => elapsed, timeoutMs: 30000, logger: memoryLogger() });
  const l = limit('fixed-window', 100, '10s', { batch: '50ms', batchMax: 30 });
  const remaining = async (key) => Number((await admin.call('RATELIMIT.PEEK', key, 'fixed-window', '100', '10s', 'COST', '0', 'AT', String(base + elapsed)))[2]);
  try {
    let admitted = 0;
    for (let i = 0; i < 40; i += 1) {
      elapsed += 1;
      if ((await rl.check('a', l, { at: base + elapsed })).allowed) admitted += 1;
    }
    assert.equal(admitted, 40);
    const held = rl.stats.held;
    assert.ok(held > 0, `held ${held}`);
    assert.equal(await remaining('a'), 100 - admitted - held);
    // The hold ends: the next request gives the rest back before it takes again.
    elapsed += 60;
    assert.equal((await rl.check('a', l, { at: base + elapsed })).allowed, true);
    admitted += 1;
    await rl.close();
    assert.equal(await remaining('a'), 100 - admitted);
    assert.deepEqual([rl.stats.held, rl.stats.batchTaken - rl.stats.batchUsed - rl.stats.batchRefunded], [0, 0]);
    // Without a request, the batch's timer gives the units back (the limiter's real clock).
    const real = new RateLimiter(client, { timeoutMs: 30000, logger: memoryLogger() });
    const quick = limit('fixed-window', 100, '1h', { batch: '20ms' });
    for (let i = 0; i < 12; i += 1) await real.check('b', quick);
    assert.ok(real.stats.held > 0);
    for (let i = 0; i < 500 && real.stats.held > 0; i += 1) await sleep(10);
    for (let i = 0; i < 500 && real.stats.batchRefunded < real.stats.batchTaken - 12; i += 1) await sleep(10);
    assert.equal(real.stats.batchRefunded, real.stats.batchTaken - 12);
    const left = Number((await admin.call('RATELIMIT.PEEK', 'b', 'fixed-window', '100', '1h', 'COST', '0'))[2]);
    assert.equal(left, 88);
  } finally {
    admin.disconnect();
    await closeClient(client);
    await server.stop();
  }
});

test('concurrent callers share one TAKE in flight; local answers report the TAKE with what is still held', async (t) => {
  if (NO_MODULE) return t.skip(NO_MODULE);
  const server = await startServer({ module: true });
  const client = await FLAVOUR.make(server);
  const at = Math.ceil((Date.now() + 86400000) / 3600000) * 3600000;
  try {
    const rl = new RateLimiter(client, { now: () => 0, timeoutMs: 30000, logger: memoryLogger() });
    const l = limit('fixed-window', 100, '1m', { batch: '1s' });
    const decisions = await Promise.all(Array.from({ length: 50 }, () => rl.check('c', l, { at })));
    assert.ok(decisions.every((d) => d.allowed && d.granted === 1));
    // One TAKE of 1, then one for the 49 waiting for it.
    assert.equal(rl.stats.commands, 2);
    // The second sized by the demand seen (50 asked), one more than the 49 waiting: held.
    assert.deepEqual([rl.stats.batchTaken, rl.stats.batchUsed, rl.stats.held], [51, 50, 1]);
    const local = decisions.filter((d) => d.source === 'local');
    assert.equal(local.length, 50);
    // remaining: what the batch still holds after each.
    assert.deepEqual(local.slice(-3).map((d) => d.remaining), [3, 2, 1]);
    // A request of more than is held, with nothing held: a TAKE of at least its cost.
    const big = await rl.check('c', l, { at, cost: 5 });
    assert.deepEqual([big.allowed, big.granted, big.source], [true, 5, 'local']);
    // Refused: a TAKE that grants nothing is the refusal of one unit; a larger cost asks Redis.
    const full = limit('fixed-window', 2, '1m', { batch: '1s' });
    await rl.check('f', full, { at, cost: 2 });
    const one = await rl.check('f', full, { at });
    assert.deepEqual([one.allowed, one.source, one.retryAfterMs > 0], [false, 'module', true]);
    const two = await rl.check('f', full, { at, cost: 2 });
    assert.deepEqual([two.allowed, two.source, two.granted], [false, 'module', 0]);
    await rl.close();
  } finally {
    await closeClient(client);
    await server.stop();
  }
});

test('a refund that fails is logged, not lost silently; a TAKE that fails applies onError', async () => {
  const server = await startServer();
  const client = await FLAVOUR.make(server);
  const logger = memoryLogger();
  try {
    const rl = new RateLimiter(client, { timeoutMs: 2000, logger, breaker: { failures: 100 } });
    const l = limit('sliding-window', 100, '1m', { batch: '10s', batchMax: 20 });
    for (let i = 0; i < 5; i += 1) assert.equal((await rl.check('r', l)).allowed, true);
    assert.ok(rl.stats.held > 0);
    await server.stop();
    await rl.close();
    assert.ok(logger.lines.some((line) => /^warn ratelimit: could not give back \d+ unused units of a batch on r/.test(line)), logger.lines.join('\n'));
    const d = await rl.check('r', l);
    assert.deepEqual([d.allowed, d.source, d.granted], [true, 'error', 1]);
  } finally {
    await closeClient(client);
    await server.stop();
  }
});

test('batch options are checked when the limit is made', () => {
  assert.throws(() => limit('gcra', 5, '1s', { batch: '5 ms' }), (e) => e instanceof TypeError && e.message.includes("'5 ms'"));
  assert.throws(() => limit('gcra', 5, '1s', { batch: '5ms', batchMax: 0 }), (e) => e instanceof RangeError && e.message.includes('batchMax'));
  assert.throws(() => limit('gcra', 5, '1s', { batch: '5ms', batchMax: 2.5 }), (e) => e instanceof TypeError && e.message.includes('2.5'));
  assert.throws(() => limit('gcra', 5, '1s', { batchMax: 3 }), (e) => e instanceof TypeError && e.message.includes('batchMax needs batch'));
  const l = limit('gcra', 5, '1s', { batch: '50ms' });
  assert.deepEqual([l.batchMs, l.batchMax], [50, 5]);
});

test('leaky bucket: a request admitted from a batch never reports less delayMs than a per-request CHECK in its place would have', async (t) => {
  if (NO_MODULE) return t.skip(NO_MODULE);
  const server = await startServer({ module: true });
  const client = await CLIENTS.find((c) => c.name === 'node-redis 6 RESP2').make(server);
  const twin = raw(server);
  const rand = random(0xde1a);
  const base = Math.ceil((Date.now() + 86400000) / 3600000) * 3600000;
  let elapsed = 0;
  const sent = []; // every command the limiter sends, in order (one connection), but its COMMAND INFO
  const logging = { sendCommand: (args) => (args[0] === 'COMMAND' || sent.push(args), client.sendCommand(args)) };
  try {
    const rl = new RateLimiter(logging, { now: () => elapsed, timeoutMs: 30000, logger: memoryLogger() });
    // 10 a second: each unit waits 100 ms behind the one before it; batches of up to 8 held 300 ms.
    const batched = limit('leaky-bucket', 10, '1s', { burst: 20, batch: '300ms', batchMax: 8 });
    const local = []; // [elapsed, delayMs, index in sent of the TAKE whose units it used, which unit]
    let lastTake = -1;
    let used = 0;
    while (elapsed < 20000) {
      elapsed += rand.pick([0, 5, 20, 60, 150, 400]);
      const d = await rl.check('lb', batched, { at: base + elapsed });
      const take = sent.findLastIndex((args) => args[0] === 'RATELIMIT.TAKE');
      if (take !== lastTake) [lastTake, used] = [take, 0];
      if (d.source === 'local') local.push([elapsed, d.delayMs, take, (used += 1)]);
    }
    await rl.close();
    // The same commands on a twin key, each TAKE granting g replaced by g CHECKs of one unit at its
    // time: the waits per-request CHECKs in its place would have had.
    const waits = new Map();
    for (const [index, args] of sent.entries()) {
      const [command, , ...rest] = args;
      if (command === 'RATELIMIT.TAKE') {
        const at = rest.slice(rest.indexOf('AT'));
        const max = Number(rest[rest.indexOf('MAX') + 1]);
        const units = [];
        for (let i = 0; i < max; i += 1) {
          const reply = (await twin.call('RATELIMIT.CHECK', 'twin', ...rest.slice(0, rest.indexOf('MAX')), 'COST', '1', ...at)).map(Number);
          if (reply[0] !== 1) break;
          units.push(reply[5]);
        }
        waits.set(index, { at: Number(at[1]) - base, units });
      } else {
        await twin.call(command, 'twin', ...rest);
      }
    }
    let longer = 0;
    for (const [time, delayMs, take, unit] of local) {
      const { at, units } = waits.get(take);
      const own = Math.max(0, Math.ceil(units[unit - 1] - (time - at)));
      assert.ok(delayMs >= own, `at +${time} ms, unit ${unit} of a TAKE at +${at} ms: the batch said ${delayMs} ms, a CHECK in its place ${own} ms`);
      if (delayMs > own) longer += 1;
    }
    assert.ok(local.length > 50 && longer > 0, `${local.length} admitted from batches, ${longer} told more`);
    t.diagnostic(`${local.length} admitted from batches; ${longer} told to wait longer than a CHECK in their place (the last unit's wait)`);
  } finally {
    twin.disconnect();
    await closeClient(client);
    await server.stop();
  }
});
