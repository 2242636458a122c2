// Calls whose replies arrive after their timeout fired: what such a reply took from Redis (a
// batch's TAKE, a TAKE, a CHECK, a CHECKALL, a lease) is held or given back, never lost. Under load,
// another client runs busy 300 ms scripts so that replies arrive after a 40 ms timeout; after
// close(), the units consumed in Redis are the units admitted to callers.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { RateLimiter, RateLimitUnavailable, limit } from 'redis-ratelimit-client';

import { CLIENTS, NO_MODULE, closeClient, memoryLogger, raw, sleep, startServer } from './helpers.mjs';

const LIMIT = 1_000_000;
// A script that keeps Redis busy for 300 ms: every command sent meanwhile waits for it.
const BUSY = "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] "
  + "while true do local n = redis.call('TIME') if n[1] * 1000000 + n[2] - s > 300000 then break end end return 1";

/** Runs `workers` loops of `call` (each answering the units it admitted to its caller) while
 * another client stalls Redis `stalls` times; the units admitted in all. */
async function underStalls(server, call, { workers = 6, stalls = 4 } = {}) {
  const staller = raw(server);
  let admitted = 0;
  let calls = 0;
  let unavailable = 0;
  let running = true;
  const loops = Array.from({ length: workers }, async (_, w) => {
    for (let i = 0; running; i += 1) {
      try {
        const units = await call(w, i); // (not `admitted += await`: that reads admitted before)
        admitted += units;
      } catch (error) {
        if (!(error instanceof RateLimitUnavailable)) throw error;
        unavailable += 1;
      }
      calls += 1;
      if (i % 4 === 3) await sleep(2);
    }
  });
  try {
    for (let s = 0; s < stalls; s += 1) {
      await sleep(120);
      await staller.eval(BUSY, 0);
    }
    await sleep(120);
  } finally {
    running = false;
    await Promise.all(loops);
    staller.disconnect();
  }
  return { admitted, calls, unavailable };
}

/** Units consumed on `key` of a fixed-window limit of LIMIT: what a PEEK says is gone. */
async function consumed(admin, key) {
  const reply = await admin.call('RATELIMIT.PEEK', key, 'fixed-window', String(LIMIT), '1h', 'COST', '0');
  return LIMIT - Number(reply[2]);
}

const FLAVOURS = CLIENTS.filter((c) => ['node-redis 6 RESP3', 'ioredis 6'].includes(c.name));

for (const flavour of FLAVOURS) {
  test(`${flavour.name}: under late replies, units consumed in Redis are the units admitted (batched check, take, check, checkAll)`, async (t) => {
    if (NO_MODULE) return t.skip(NO_MODULE);
    const server = await startServer({ module: true });
    const client = await flavour.make(server);
    const admin = raw(server);
    try {
      const cases = {
        'batched check': (rl) => {
          const l = limit('fixed-window', LIMIT, '1h', { batch: '200ms', batchMax: 50 });
          return async () => {
            const d = await rl.check('batched', l);
            return d.allowed ? d.granted : 0;
          };
        },
        take: (rl) => {
          const l = limit('fixed-window', LIMIT, '1h');
          return async (w, i) => (await rl.take('take', l, 1 + ((w + i) % 5))).granted;
        },
        check: (rl) => {
          const l = limit('fixed-window', LIMIT, '1h');
          return async (w, i) => {
            const d = await rl.check('check', l, { cost: 1 + (i % 3) });
            return d.allowed ? d.granted : 0;
          };
        },
        checkAll: (rl) => {
          const l = limit('fixed-window', LIMIT, '1h');
          return async () => {
            const d = await rl.checkAll([['{all}a', l], ['{all}b', l]], { cost: 2 });
            return d.allowed ? 2 : 0;
          };
        },
      };
      for (const [name, make] of Object.entries(cases)) {
        // onError 'closed': a call that timed out admitted nothing; whatever it took must go back.
        const rl = new RateLimiter(client, { onError: 'closed', timeoutMs: 40, logger: memoryLogger() });
        const { admitted, calls, unavailable } = await underStalls(server, make(rl));
        await rl.close();
        const key = { 'batched check': 'batched', take: 'take', check: 'check', checkAll: '{all}a' }[name];
        const gone = await consumed(admin, key);
        if (name === 'checkAll') assert.equal(await consumed(admin, '{all}b'), gone);
        const late = rl.stats.lateReplies;
        t.diagnostic(`${name}: ${calls} calls, ${unavailable} unavailable, ${late} answered late; admitted ${admitted}, consumed ${gone}: ${gone - admitted} lost`);
        assert.ok(late > 0, `${name}: no reply came late`);
        assert.equal(gone, admitted, `${name}: units consumed in Redis = units admitted`);
        assert.equal(rl.stats.held, 0);
      }
    } finally {
      admin.disconnect();
      await closeClient(client);
      await server.stop();
    }
  });
}

test('node-redis 6 RESP3: a lease granted after its call timed out is released', async (t) => {
  if (NO_MODULE) return t.skip(NO_MODULE);
  const server = await startServer({ module: true });
  const client = await FLAVOURS[0].make(server);
  const admin = raw(server);
  try {
    const rl = new RateLimiter(client, { onError: 'closed', timeoutMs: 40, logger: memoryLogger() });
    const n = 100000;
    const { admitted } = await underStalls(server, async (w, i) => ((await rl.acquire('leases', n, '1h', { id: `w${w}-${i}` })).allowed ? 1 : 0));
    await rl.close();
    // The leases held now: one more acquired says how many there are.
    const reply = await admin.call('RATELIMIT.ACQUIRE', 'leases', String(n), '1h', 'ID', 'probe');
    const held = n - 1 - Number(reply[2]);
    t.diagnostic(`leases: ${admitted} admitted, ${held} held in Redis, ${rl.stats.lateReplies} answered late`);
    assert.ok(rl.stats.lateReplies > 0);
    assert.equal(held, admitted);
  } finally {
    admin.disconnect();
    await closeClient(client);
    await server.stop();
  }
});

test('a grant answered after close() has returned is given back when it arrives', async (t) => {
  if (NO_MODULE) return t.skip(NO_MODULE);
  const server = await startServer({ module: true });
  const client = await FLAVOURS[0].make(server);
  const admin = raw(server);
  try {
    const rl = new RateLimiter(client, { onError: 'open', timeoutMs: 500, logger: memoryLogger() });
    const l = limit('fixed-window', LIMIT, '1h', { batch: '1h', batchMax: 20 });
    // One unit taken and admitted (again if a busy machine made the first time out).
    let first;
    for (let i = 0; i < 20 && first?.source !== 'local'; i += 1) first = await rl.check('after', l);
    assert.equal(first.source, 'local');
    await rl.close();
    const before = { ...rl.stats, gone: await consumed(admin, 'after') };
    // Redis pauses every client for 2 s: a TAKE sent now is answered after its timeout.
    await admin.call('CLIENT', 'PAUSE', '2000', 'ALL');
    const d = await rl.check('after', l, { cost: 5 });
    assert.equal(d.source, 'error'); // failed open
    await rl.close({ waitMs: 0 }); // returns before the TAKE is answered
    assert.equal(rl.stats.lateReplies, before.lateReplies);
    for (let i = 0; i < 1000 && (rl.stats.lateReplies === before.lateReplies || rl.stats.held > 0 || rl.stats.batchRefunded < rl.stats.batchTaken - rl.stats.batchUsed); i += 1) await sleep(10);
    const s = rl.stats;
    assert.equal(s.lateReplies, before.lateReplies + 1);
    assert.ok(s.batchTaken >= before.batchTaken + 5, JSON.stringify(s)); // the late TAKE granted at least the 5 asked
    assert.deepEqual([s.batchUsed, s.batchRefunded, s.held], [before.batchUsed, s.batchTaken - s.batchUsed, 0]);
    assert.equal(await consumed(admin, 'after'), before.gone, 'what the late TAKE took is back');
  } finally {
    admin.disconnect();
    await closeClient(client);
    await server.stop();
  }
});
