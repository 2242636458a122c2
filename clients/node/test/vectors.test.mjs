// The conformance vectors (tests/vectors/v1.json at the repository's top, generated from the core
// crate; the format is in tests/vectors/README.md) replayed by the in-process algorithms of
// onError 'local' (the built dist/esm/local.js, what the packed tarball holds): every timeline,
// every call (CHECK, PEEK, TAKE, REFUND, RESET at their AT), the same reply integer for integer,
// and after each call the same stored key: absent when the vector's is, else the same expiry,
// `last`, parameters, block and state in exact integers. No server: the vectors are the module's
// answers. (Integers above 2^53 — saturated replies and expiries — compare as the doubles
// JSON.parse and the package both make of them.)
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { limit } from 'redis-ratelimit-client';

import { LocalLimiter } from '../dist/esm/local.js';

const VECTORS = new URL('../../../tests/vectors/v1.json', import.meta.url);
const file = JSON.parse(readFileSync(VECTORS, 'utf8'));
const FIELDS = ['allowed', 'limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'delayMs'];

function limitOf(call) {
  const options = {};
  if (call.burst !== undefined) options.burst = call.burst;
  if (call.block_ms !== undefined) options.block = call.block_ms;
  return limit(call.algorithm, call.limit, call.period_ms, options);
}

function ints(reply) {
  return FIELDS.map((f) => (f === 'allowed' ? Number(reply.allowed) : reply[f]));
}

function apply(local, key, call) {
  if (call.op === 'reset') return local.reset(key) ? 1 : 0;
  const l = limitOf(call);
  switch (call.op) {
    case 'check':
      return ints(local.check(key, l, call.cost, call.at, true));
    case 'peek':
      return ints(local.check(key, l, call.cost, call.at, false));
    case 'refund':
      return ints(local.refund(key, l, call.cost, call.at));
    case 'take': {
      const reply = local.take(key, l, call.max, call.at);
      return [reply.granted, ...ints(reply).slice(1)];
    }
    default:
      throw new Error(`unknown op ${call.op}`);
  }
}

/** A local state in the vectors' normalized form. */
function stateOf(algorithm, state) {
  switch (algorithm) {
    case 'token-bucket':
      return { tokens_scaled: String(state) };
    case 'leaky-bucket':
      return { level_scaled: String(state) };
    case 'gcra':
      return { ahead_scaled: String(state) };
    case 'fixed-window':
      return { window_start_ms: state.windowStart, count: state.count };
    case 'sliding-window':
      return { window_start_ms: state.windowStart, current: state.current, previous: state.previous };
    default: {
      const runs = [];
      for (const [ts, n] of state.runs) {
        if (runs.length && runs[runs.length - 1][0] === ts) runs[runs.length - 1][1] += n;
        else runs.push([ts, n]);
      }
      return { runs };
    }
  }
}

function storedOf(local, key) {
  // The limiter's own map (TypeScript-private, there at run time): the state it keeps per key.
  const stored = local.keys.get(key);
  if (stored === undefined) return null;
  return {
    // The expiry as the key's (PEXPIRETIME, a signed 64-bit integer): saturated at 2^63 - 1.
    expires_at_ms: Math.min(stored.expiresAt, 2 ** 63),
    last_ms: stored.last,
    limit: stored.params.limitN,
    period_ms: stored.params.periodMs,
    burst: stored.params.capacityN,
    blocked_until_ms: stored.blockedUntil,
    state: stateOf(stored.algorithm, stored.state),
  };
}

function expectedStored(call) {
  if (call.stored === null) return null;
  const { info, ...rest } = call.stored;
  return rest;
}

test('the vectors file is version 1 and covers every algorithm and operation', () => {
  assert.equal(file.version, 1);
  const calls = file.groups.flatMap((g) => g.calls);
  assert.ok(calls.length >= 500, `${calls.length} vectors`);
  assert.deepEqual(new Set(calls.map((c) => c.op)), new Set(['check', 'peek', 'take', 'refund', 'reset']));
  assert.equal(new Set(calls.filter((c) => c.algorithm).map((c) => c.algorithm)).size, 6);
});

test('the in-process limiter replays every vector', (t) => {
  let replayed = 0;
  const failures = [];
  for (const group of file.groups) {
    const local = new LocalLimiter({ maxKeys: 10, clock: () => 0 });
    for (const [i, call] of group.calls.entries()) {
      const { stored, ...input } = call;
      const where = `${group.name} call ${i}: ${JSON.stringify(input)}`;
      try {
        assert.deepEqual(apply(local, group.key, call), call.reply, where);
        assert.deepEqual(storedOf(local, group.key), expectedStored(call), where);
      } catch (e) {
        failures.push(e.message);
        break; // the rest of this timeline follows from a state that differs
      }
      replayed += 1;
    }
  }
  t.diagnostic(`${replayed} vectors replayed`);
  assert.equal(failures.length, 0, `${failures.length} timelines differ:\n${failures.slice(0, 10).join('\n\n')}`);
});
