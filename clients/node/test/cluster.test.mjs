// Redis Cluster (three masters): node-redis createCluster (6 and 4) and ioredis Cluster, with the
// module (policies on every primary) and without it (the library loaded on every primary).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { LIBRARY, RateLimiter, limit, policy } from 'redis-ratelimit-client';
import { slot } from '../dist/esm/connection.js';
import { commandArity } from '../dist/esm/wire.js';

import { CLUSTER_CLIENTS, NO_MODULE, closeClient, memoryLogger, raw, startCluster } from './helpers.mjs';

const LIMIT = limit('fixed-window', 2, '1m');

test('the slot of a key is the cluster\'s (CRC16 of the hash tag)', () => {
  // Redis's own examples (CLUSTER KEYSLOT).
  assert.equal(slot('somekey'), 11058);
  assert.equal(slot('{user1000}.following'), slot('{user1000}.followers'));
  assert.equal(slot('foo{}{bar}'), slot('foo{}{bar}'));
  assert.equal(slot('{}foo'), 9500);
  assert.equal(slot('123456789'), 0x31c3 % 16384);
});

for (const engine of ['module', 'library']) {
  describe(`a cluster with the ${engine}`, () => {
    let cluster;
    before(async () => {
      if (engine === 'module' && NO_MODULE) return;
      cluster = await startCluster({ module: engine === 'module' });
    });
    after(() => cluster?.stop());

    for (const [c, flavour] of CLUSTER_CLIENTS.entries()) {
      test(`${flavour.name}: checks on keys of every master, checkAll on one hash tag, ${engine === 'module' ? 'policies on every primary' : 'the library on every primary'}`, async (t) => {
        if (!cluster) return t.skip(NO_MODULE);
        const client = await flavour.make(cluster.nodes);
        const nodes = cluster.nodes.map(raw);
        try {
          const logger = memoryLogger();
          const rl = new RateLimiter(client, { logger, timeoutMs: 30000 });
          const prefix = engine === 'library' ? 'fn:' : '';
          const keys = Array.from({ length: 24 }, (_, i) => `c${c}:user:${i}`);
          for (const key of keys) {
            const d1 = await rl.check(key, LIMIT);
            const d2 = await rl.check(key, LIMIT);
            const d3 = await rl.check(key, LIMIT);
            assert.deepEqual([d1.remaining, d2.remaining, d3.allowed, d3.source], [1, 0, false, engine], key);
          }
          // Each key is on the master serving its slot, and the keys are on every master.
          const held = await Promise.all(nodes.map((n) => n.keys(`${prefix}c${c}:user:*`)));
          assert.equal(held.flat().length, keys.length);
          assert.ok(held.every((k) => k.length > 0), JSON.stringify(held.map((k) => k.length)));
          const d = await rl.checkAll([[`{c${c}}:sec`, limit('fixed-window', 1, '1s')], [`{c${c}}:hour`, limit('token-bucket', 10, '1h')]], { cost: 1 });
          assert.deepEqual([d.allowed, d.limits.length, d.limits[1].remaining], [true, 2, 9]);
          assert.equal(await rl.reset(`{c${c}}:sec`, `{c${c}}:hour`), 2);
          assert.equal((await rl.acquire(`c${c}:jobs`, 1, '10s', { id: 'a' })).allowed, true);
          assert.equal(await rl.release(`c${c}:jobs`, 'a'), 1);
          // How the module takes a spec, asked of any node: what a node answers itself.
          const arity = commandArity(await nodes[0].call('COMMAND', 'INFO', 'RATELIMIT.CHECK'));
          assert.equal(arity === null, engine === 'library');
          assert.equal(commandArity(await rl.uncounted.send(['COMMAND', 'INFO', 'RATELIMIT.CHECK'], undefined, true)), arity);
          assert.deepEqual([rl.core.formUnknown, rl.core.oneArg], [false, arity === -3]);
          if (engine === 'module') {
            await rl.policies.set(`p${c}`, limit('fixed-window', 5, '1m'));
            for (const n of nodes) assert.notEqual(await n.call('RATELIMIT.POLICY', 'GET', `p${c}`), null);
            for (const key of keys.slice(0, 6)) assert.equal((await rl.check(key, policy(`p${c}`), { cost: 0 })).limit, 5);
            assert.equal(await rl.policies.delete(`p${c}`), true);
            for (const n of nodes) assert.equal(await n.call('RATELIMIT.POLICY', 'GET', `p${c}`), null);
            // Every call went to the master of its key's slot: no MOVED answered anywhere.
            const moved = await Promise.all(nodes.map((n) => n.info('errorstats')));
            assert.ok(moved.every((text) => !/errorstat_MOVED/.test(text)), moved.join('\n'));
          } else {
            for (const n of nodes) {
              const [library] = await n.call('FUNCTION', 'LIST', 'LIBRARYNAME', 'ratelimit', 'WITHCODE');
              assert.equal(library[library.indexOf('library_code') + 1], LIBRARY);
            }
          }
        } finally {
          nodes.forEach((n) => n.disconnect());
          await closeClient(client);
        }
      });
    }
  });
}
