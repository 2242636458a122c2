// The core without a server: limits checked when they are made, every reply shape read into the
// same decision, the headers of the README.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ALGORITHMS, limit, policy, periodMs, rateLimitHeaders } from 'redis-ratelimit-client';
import { decision, multiDecision, policyDefinition } from '../dist/esm/wire.js';

test('limit() takes the module\'s grammar and refuses a mistake when it is made', () => {
  assert.deepEqual(ALGORITHMS, ['token-bucket', 'leaky-bucket', 'fixed-window', 'sliding-window', 'sliding-log', 'gcra']);
  const l = limit('token-bucket', 10, '1s', { burst: 20, block: '15m' });
  assert.deepEqual({ ...l }, { kind: 'limit', algorithm: 'token-bucket', limit: 10, period: '1s', periodMs: 1000, burst: 20, block: '15m' });
  assert.ok(Object.isFrozen(l));
  for (const [period, ms] of [['250ms', 250], ['1S', 1000], ['15m', 900000], ['1h', 3600000], ['1d', 86400000], [2500, 2500], ['3650d', 3650 * 86400000]]) {
    assert.equal(periodMs(period), ms, String(period));
  }
  assert.throws(() => limit('sliding_window', 1, '1s'), (e) => e instanceof TypeError && e.message.startsWith('algorithm must be one of token-bucket, leaky-bucket, fixed-window, sliding-window, sliding-log, gcra'));
  assert.throws(() => limit('fixed-window', 0, '1s'), RangeError);
  assert.throws(() => limit('fixed-window', 1.5, '1s'), TypeError);
  assert.throws(() => limit('fixed-window', '5', '1s'), TypeError);
  assert.throws(() => limit('fixed-window', 1e12 + 1, '1s'), RangeError);
  assert.throws(() => limit('fixed-window', 1, '1 minute'), (e) => e instanceof TypeError && /'1 minute'/.test(e.message));
  assert.throws(() => limit('fixed-window', 1, '3651d'), RangeError);
  assert.throws(() => limit('fixed-window', 1, 0), RangeError);
  assert.throws(() => limit('fixed-window', 5, '1s', { burst: 3 }), /burst applies only to token-bucket, leaky-bucket and gcra/);
  assert.throws(() => limit('gcra', 5, '1s', { block: '1y' }), TypeError);
  assert.deepEqual({ ...policy('api.v1', { fallback: l }) }, { kind: 'policy', name: 'api.v1', fallback: l });
  assert.throws(() => policy('a:b'), TypeError);
  assert.throws(() => policy('x', { fallback: { algorithm: 'gcra' } }), TypeError);
});

test('every reply shape is the same decision', () => {
  const expected = { allowed: false, granted: 0, limit: 20, remaining: 0, retryAfterMs: 184, resetAfterMs: 1984, delayMs: 0, source: 'module', shadowRejected: false, periodMs: 1000 };
  const shapes = {
    'RESP2 (node-redis, ioredis)': [0, 20, 0, 184, 1984, 0],
    'RESP3 object (node-redis 5, 6)': { allowed: false, limit: 20, remaining: 0, retry_after_ms: 184, reset_after_ms: 1984, delay_ms: 0 },
    'RESP3 Map': new Map([['allowed', false], ['limit', 20], ['remaining', 0], ['retry_after_ms', 184], ['reset_after_ms', 1984], ['delay_ms', 0]]),
    'RESP3 flattened (ioredis 6)': ['allowed', 0, 'limit', 20, 'remaining', 0, 'retry_after_ms', 184, 'reset_after_ms', 1984, 'delay_ms', 0],
    'buffers': [Buffer.from('0'), 20, 0, 184, 1984, 0],
  };
  for (const [name, reply] of Object.entries(shapes)) assert.deepEqual(decision(reply, 'module', 1000), expected, name);
  assert.equal(decision([1, 5, 4, 0, 10, 0], 'library', 0).allowed, true);
  assert.equal(decision(new Map([['allowed', true], ['limit', 1], ['remaining', 0], ['retry_after_ms', 0], ['reset_after_ms', 1], ['delay_ms', 0]]), 'module', 0).allowed, true);
  assert.equal(decision([1, 5, 4, 0, 10, 0], 'library', 0, 3).granted, 3);
  // TAKE's reply: the grant first (RESP3 key `granted`).
  const takes = {
    'RESP2': [3, 5, 2, 0, 900, 0],
    'RESP3 object': { granted: 3, limit: 5, remaining: 2, retry_after_ms: 0, reset_after_ms: 900, delay_ms: 0 },
    'RESP3 Map': new Map([['granted', 3], ['limit', 5], ['remaining', 2], ['retry_after_ms', 0], ['reset_after_ms', 900], ['delay_ms', 0]]),
    'RESP3 flattened': ['granted', 3, 'limit', 5, 'remaining', 2, 'retry_after_ms', 0, 'reset_after_ms', 900, 'delay_ms', 0],
  };
  for (const [name, reply] of Object.entries(takes)) {
    const d = decision(reply, 'module', 1000, null);
    assert.deepEqual([d.allowed, d.granted, d.limit, d.remaining, d.resetAfterMs], [true, 3, 5, 2, 900], name);
  }
  assert.deepEqual([decision([0, 5, 0, 700, 700, 0], 'module', 1000, null).allowed, decision([0, 5, 0, 700, 700, 0], 'module', 1000, null).granted], [false, 0]);
  assert.throws(() => decision([1, 2, 3], 'module', 0), TypeError);
  assert.throws(() => decision({ allowed: true }, 'module', 0), TypeError);
});

test('CHECKALL replies: RESP2 nested arrays and RESP3 maps with limits', () => {
  const a = [1, 10, 9, 0, 714, 0];
  const b = [1, 100, 99, 0, 36000, 0];
  const resp2 = [[1, 10, 9, 0, 36000, 0], a, b];
  const resp3 = { allowed: true, limit: 10, remaining: 9, retry_after_ms: 0, reset_after_ms: 36000, delay_ms: 0, limits: [a, b] };
  for (const reply of [resp2, resp3]) {
    const d = multiDecision(reply, 'module', [1000, 3600000]);
    assert.deepEqual([d.allowed, d.limit, d.remaining, d.resetAfterMs, d.periodMs], [true, 10, 9, 36000, 1000]);
    assert.deepEqual(d.limits.map((x) => [x.remaining, x.periodMs]), [[9, 1000], [99, 3600000]]);
  }
  assert.throws(() => multiDecision([[1, 1, 1, 0, 0, 0], a], 'module', [1000, 1000]), TypeError);
});

test('POLICY GET, RESP2 pairs or a RESP3 map, as a definition with its inline limit', () => {
  const pairs = ['algorithm', 'token-bucket', 'limit', 5, 'period_ms', 1000, 'burst', 10, 'mode', 'shadow', 'block_ms', 60000];
  const d = policyDefinition('api', pairs);
  assert.deepEqual(
    { algorithm: d.algorithm, limit: d.limit, periodMs: d.periodMs, burst: d.burst, mode: d.mode, blockMs: d.blockMs },
    { algorithm: 'token-bucket', limit: 5, periodMs: 1000, burst: 10, mode: 'shadow', blockMs: 60000 },
  );
  assert.deepEqual({ ...d.limitSpec }, { kind: 'limit', algorithm: 'token-bucket', limit: 5, period: 1000, periodMs: 1000, burst: 10, block: 60000 });
  assert.deepEqual(policyDefinition('api', new Map(Object.entries({ algorithm: 'concurrency', limit: 3, lease_ms: 30000, mode: 'enforce' }))).leaseMs, 30000);
  assert.equal(policyDefinition('api', null), null);
});

test('the headers of the README: q, w, r, t; Retry-After on a refusal; none for a cost that never passes', () => {
  const base = { limit: 100, remaining: 99, retryAfterMs: 0, resetAfterMs: 116285, delayMs: 0, source: 'module', shadowRejected: false, periodMs: 60000 };
  assert.deepEqual(rateLimitHeaders({ ...base, allowed: true }), { 'RateLimit-Policy': '"default";q=100;w=60', RateLimit: '"default";r=99;t=117' });
  assert.deepEqual(rateLimitHeaders({ ...base, allowed: false, remaining: 0, retryAfterMs: 56869, resetAfterMs: 116269 }, 'api'), {
    'RateLimit-Policy': '"api";q=100;w=60', RateLimit: '"api";r=0;t=57', 'Retry-After': '57',
  });
  assert.deepEqual(rateLimitHeaders({ ...base, allowed: false, remaining: 100, retryAfterMs: -1, resetAfterMs: 0 }), { 'RateLimit-Policy': '"default";q=100;w=60' });
});
