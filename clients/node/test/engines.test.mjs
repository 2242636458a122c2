// Every method, through every client (node-redis 4/5/6, RESP2 and RESP3, ioredis 5/6), against
// the module and against a server with only the library: equal to the raw replies of the same
// calls on twin keys, over seeded random sequences of all six algorithms, at explicit times (AT).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ALGORITHMS, RateLimiter, limit } from 'redis-ratelimit-client';

import { CLIENTS, NO_MODULE, closeClient, memoryLogger, random, raw, startServer } from './helpers.mjs';

const FIELDS = ['allowed', 'limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'delayMs'];
const STEPS = Number(process.env.NODE_STEPS || 24); // per algorithm and client

/** A raw six-integer reply as the fields of a Decision. */
function fields(reply) {
  const [allowed, ...rest] = reply.map(Number);
  return Object.fromEntries(FIELDS.map((f, i) => [f, i === 0 ? allowed === 1 : rest[i - 1]]));
}

function pick(d) {
  return Object.fromEntries(FIELDS.map((f) => [f, d[f]]));
}

function randomLimit(rand, algorithm) {
  const bucket = ['token-bucket', 'leaky-bucket', 'gcra'].includes(algorithm);
  const period = rand.pick(['1s', '10s', '1m', 2500, '1h']);
  const options = {};
  if (bucket && rand() < 0.5) options.burst = rand.int(1, 8);
  if (rand() < 0.15) options.block = rand.pick(['2s', 500]);
  return limit(algorithm, rand.int(1, 6), period, options);
}

for (const engine of ['module', 'library']) {
  describe(`the ${engine}`, () => {
    let server;
    let twin;
    before(async () => {
      if (engine === 'module' && NO_MODULE) return;
      server = await startServer({ module: engine === 'module' });
      twin = raw(server);
    });
    after(async () => {
      twin?.disconnect();
      await server?.stop();
    });

    // Raw calls on the twin key: the module's commands, or the library's functions.
    const rawCall = {
      module: {
        check: (k, a) => twin.call('RATELIMIT.CHECK', k, ...a),
        peek: (k, a) => twin.call('RATELIMIT.PEEK', k, ...a),
        refund: (k, a) => twin.call('RATELIMIT.REFUND', k, ...a),
        take: (k, a) => twin.call('RATELIMIT.TAKE', k, ...a),
        checkall: (ks, a) => twin.call('RATELIMIT.CHECKALL', ks.length, ...ks, ...a),
        acquire: (k, a) => twin.call('RATELIMIT.ACQUIRE', k, ...a),
        release: (k, a) => twin.call('RATELIMIT.RELEASE', k, ...a),
        reset: (ks) => twin.call('RATELIMIT.RESET', ...ks),
      },
      library: {
        check: (k, a) => twin.call('FCALL', 'ratelimit_check', 1, k, ...a),
        peek: (k, a) => twin.call('FCALL_RO', 'ratelimit_peek', 1, k, ...a),
        refund: (k, a) => twin.call('FCALL', 'ratelimit_refund', 1, k, ...a),
        take: (k, a) => twin.call('FCALL', 'ratelimit_take', 1, k, ...a),
        checkall: (ks, a) => twin.call('FCALL', 'ratelimit_checkall', ks.length, ...ks, ...a),
        acquire: (k, a) => twin.call('FCALL', 'ratelimit_acquire', 1, k, ...a),
        release: (k, a) => twin.call('FCALL', 'ratelimit_release', 1, k, ...a),
        reset: (ks) => twin.call('FCALL', 'ratelimit_reset', ks.length, ...ks),
      },
    }[engine];

    for (const [c, flavour] of CLIENTS.entries()) {
      test(`${flavour.name}: every method answers as the raw ${engine} on random sequences`, async (t) => {
        if (!server) return t.skip(NO_MODULE);
        const client = await flavour.make(server);
        const logger = memoryLogger();
        const rl = new RateLimiter(client, { logger, timeoutMs: 30000 });
        const rand = random(0x5eed + c);
        let at = Date.now() + 86400000 + c * 3600000;
        const source = engine;
        const spec = (l) => {
          const a = [l.algorithm, String(l.limit), String(l.period)];
          if (l.burst !== undefined) a.push('BURST', String(l.burst));
          if (l.block !== undefined) a.push('BLOCK', String(l.block));
          return a;
        };
        const counts = { admitted: 0, refused: 0, partial: 0 };
        try {
          for (const algorithm of ALGORITHMS) {
            const ours = `c${c}:{${algorithm}}:mine`;
            const theirs = `c${c}:{${algorithm}}:twin`;
            let l = randomLimit(rand, algorithm);
            for (let step = 0; step < STEPS; step += 1) {
              at += rand.pick([0, 1, 7, 150, 400, 1200]);
              if (rand() < 0.1) l = randomLimit(rand, algorithm); // parameters change now and then
              const cost = rand.pick([0, 1, 1, 1, 2, 3, l.burst ?? l.limit, 99]);
              const op = rand.pick(['check', 'check', 'check', 'peek', 'refund', 'take', 'take', 'checkall', 'reset']);
              const label = `${flavour.name} ${algorithm} step ${step} ${op} ${spec(l).join(' ')} COST ${cost} AT ${at}`;
              if (op === 'check' || op === 'peek') {
                const d = await rl[op](ours, l, { cost, at });
                const expected = fields(await rawCall[op](theirs, [...spec(l), 'COST', cost, 'AT', at]));
                assert.deepEqual(pick(d), expected, label);
                assert.equal(d.source, source, label);
                assert.equal(d.periodMs, l.periodMs, label);
                assert.equal(d.shadowRejected, false, label);
                assert.equal(d.granted, d.allowed ? cost : 0, label);
                counts[d.allowed ? 'admitted' : 'refused'] += 1;
              } else if (op === 'take') {
                const max = Math.max(1, cost);
                const d = await rl.take(ours, l, max, { at });
                const [granted, ...rest] = (await rawCall.take(theirs, [...spec(l), 'MAX', max, 'AT', at])).map(Number);
                assert.deepEqual(pick(d), { ...fields([granted > 0 ? 1 : 0, ...rest]) }, label);
                assert.equal(d.granted, granted, label);
                assert.equal(d.source, source, label);
                if (granted > 0 && granted < max) counts.partial += 1;
              } else if (op === 'refund') {
                const d = await rl.refund(ours, l, cost, { at });
                const expected = fields(await rawCall.refund(theirs, [...spec(l), 'COST', cost, 'AT', at]));
                assert.deepEqual(pick(d), expected, label);
              } else if (op === 'checkall') {
                const other = limit('fixed-window', rand.int(1, 4), '1m');
                const d = await rl.checkAll([[ours, l], [`${ours}:2`, other]], { cost, at });
                const reply = await rawCall.checkall([theirs, `${theirs}:2`], [...spec(l), ...spec(other), 'COST', cost, 'AT', at]);
                assert.deepEqual(pick(d), fields(reply[0]), label);
                assert.deepEqual(d.limits.map(pick), reply.slice(1).map(fields), label);
                assert.deepEqual(d.limits.map((x) => x.periodMs), [l.periodMs, other.periodMs], label);
              } else {
                const removed = await rl.reset(ours, `${ours}:2`);
                assert.equal(removed, Number(await rawCall.reset([theirs, `${theirs}:2`])), label);
              }
            }
          }
          // checkAll's overall decision carries the period of the limit it shows (the least remaining).
          const tight = await rl.checkAll([[`c${c}:{w}:a`, limit('fixed-window', 10, '1m')], [`c${c}:{w}:b`, limit('fixed-window', 2, '1h')]], { at });
          assert.deepEqual([tight.limit, tight.remaining, tight.periodMs], [2, 1, 3600000]);
          // Leases: acquire, renew, release, on twin keys.
          for (let step = 0; step < STEPS * 2; step += 1) {
            at += rand.pick([0, 5, 300, 2000]);
            const id = `id${rand.int(1, 4)}`;
            const n = rand.int(1, 3);
            const lease = rand.pick(['1s', '5s', 800]);
            const label = `${flavour.name} lease step ${step} AT ${at}`;
            if (rand() < 0.65) {
              const cost = rand.int(1, 3);
              const d = await rl.acquire(`c${c}:lease`, n, lease, { id, cost, at });
              assert.deepEqual(pick(d), fields(await rawCall.acquire(`c${c}:lease:twin`, [n, lease, 'ID', id, 'COST', cost, 'AT', at])), label);
              counts[d.allowed ? 'admitted' : 'refused'] += 1;
            } else {
              const released = await rl.release(`c${c}:lease`, id, { at });
              assert.equal(released, Number(await rawCall.release(`c${c}:lease:twin`, ['ID', id, 'AT', at])), label);
            }
          }
          assert.ok(counts.admitted > 20 && counts.refused > 20 && counts.partial > 0, `every outcome exercised: ${JSON.stringify(counts)}`);
          // The library's keys live under its own prefix; the module's under the key itself.
          const keys = await twin.keys(`*c${c}:lease`);
          if (engine === 'library') assert.ok(keys.every((k) => k.startsWith('fn:')), String(keys));
          assert.equal(rl.engine, engine);
          assert.ok(logger.lines.some((l) => l.includes(engine === 'module' ? 'engine: the module' : 'engine: the Functions library')), logger.lines.join('\n'));
        } finally {
          await closeClient(client);
        }
      });
    }
  });
}
