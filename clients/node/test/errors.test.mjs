// Every mistake a caller can make in an argument is a TypeError or RangeError, thrown (or
// rejected) before anything is sent, whose message starts with the argument's name as the API
// (and the README) spells it.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { RateLimiter, limit, policy, periodMs, addressKey } from 'redis-ratelimit-client';
import { rateLimit as forExpress } from 'redis-ratelimit-client/express';
import { RateLimitStore } from 'redis-ratelimit-client/express-rate-limit';

// A client that fails the test if anything reaches it.
const nothingSent = { sendCommand: async (args) => assert.fail(`sent ${args.join(' ')}`) };
const L = limit('fixed-window', 5, '1s');

/** [what the caller did, the call, the error class, how its message starts]. */
const CASES = [
  ['limit: algorithm', () => limit('sliding_window', 1, '1s'), TypeError, 'algorithm must be one of'],
  ['limit: limit 0', () => limit('gcra', 0, '1s'), RangeError, 'limit must be from 1'],
  ['limit: limit a string', () => limit('gcra', '5', '1s'), TypeError, 'limit must be an integer'],
  ['limit: period', () => limit('gcra', 5, '1 minute'), TypeError, 'period must be'],
  ['limit: burst', () => limit('gcra', 5, '1s', { burst: 0 }), RangeError, 'burst must be from 1'],
  ['limit: burst on a window', () => limit('fixed-window', 5, '1s', { burst: 3 }), TypeError, 'burst applies only'],
  ['limit: block', () => limit('gcra', 5, '1s', { block: '1y' }), TypeError, 'block must be'],
  ['limit: batch', () => limit('gcra', 5, '1s', { batch: 0 }), RangeError, 'batch must be from 1'],
  ['limit: batchMax', () => limit('gcra', 5, '1s', { batch: '5ms', batchMax: 0 }), RangeError, 'batchMax must be from 1'],
  ['limit: batchMax alone', () => limit('gcra', 5, '1s', { batchMax: 3 }), TypeError, 'batchMax needs batch'],
  ['periodMs', () => periodMs('soon'), TypeError, 'period must be'],
  ['policy: name', () => policy('a:b'), TypeError, "name (a policy's) must be"],
  ['policy: fallback', () => policy('p', { fallback: { algorithm: 'gcra' } }), TypeError, 'fallback must be a limit(...)'],
  ['new RateLimiter: client', () => new RateLimiter({}), TypeError, 'RateLimiter needs a node-redis client'],
  ['new RateLimiter: onError', () => new RateLimiter(nothingSent, { onError: 'fail' }), TypeError, 'onError must be'],
  ['new RateLimiter: timeoutMs', () => new RateLimiter(nothingSent, { timeoutMs: 0 }), TypeError, 'timeoutMs must be a positive number'],
  ['new RateLimiter: timeoutMs a string', () => new RateLimiter(nothingSent, { timeoutMs: '100' }), TypeError, 'timeoutMs must be a positive number'],
  ['new RateLimiter: localShare', () => new RateLimiter(nothingSent, { localShare: 2 }), RangeError, 'localShare must be'],
  ['new RateLimiter: denialCache', () => new RateLimiter(nothingSent, { denialCache: -1 }), RangeError, 'denialCache must be'],
  ['new RateLimiter: engine', () => new RateLimiter(nothingSent, { engine: 'lua' }), TypeError, 'engine must be'],
  ['new RateLimiter: libraryPrefix', () => new RateLimiter(nothingSent, { libraryPrefix: 1 }), TypeError, 'libraryPrefix must be'],
  ['new RateLimiter: loadLibrary', () => new RateLimiter(nothingSent, { loadLibrary: 'yes' }), TypeError, 'loadLibrary must be'],
  ['new RateLimiter: breaker.failures', () => new RateLimiter(nothingSent, { breaker: { failures: 0 } }), TypeError, 'breaker.failures must be'],
  ['new RateLimiter: breaker.cooldownMs', () => new RateLimiter(nothingSent, { breaker: { cooldownMs: -1 } }), TypeError, 'breaker.cooldownMs must be'],
  ['new RateLimiter: policyRefreshMs', () => new RateLimiter(nothingSent, { policyRefreshMs: 'often' }), TypeError, 'policyRefreshMs must be'],
  ['new RateLimiter: logger', () => new RateLimiter(nothingSent, { logger: {} }), TypeError, 'logger must have'],
  ['new RateLimiter: now', () => new RateLimiter(nothingSent, { now: 5 }), TypeError, 'now must be a function'],
];
const rl = () => new RateLimiter(nothingSent, { logger: { info() {}, warn() {} } });
const ASYNC = [
  ['check: key', () => rl().check('', L), TypeError, 'key must be a non-empty string'],
  ['check: limit', () => rl().check('k', { algorithm: 'gcra' }), TypeError, 'limit must be a limit(...) or a policy(...)'],
  ['check: cost', () => rl().check('k', L, { cost: -1 }), RangeError, 'cost must be from 0'],
  ['check: at', () => rl().check('k', L, { at: -1 }), RangeError, 'at must be from 0'],
  ['peek: cost', () => rl().peek('k', L, { cost: 1.5 }), TypeError, 'cost must be an integer'],
  ['refund: cost', () => rl().refund('k', L, 'one'), TypeError, 'cost must be an integer'],
  ['take: max 0', () => rl().take('k', L, 0), RangeError, 'max must be from 1 to 1000000000000, not 0'],
  ['take: max missing', () => rl().take('k', L), TypeError, 'max must be an integer'],
  ['take: key', () => rl().take(5, L, 1), TypeError, 'key must be a non-empty string'],
  ['checkAll: limits', () => rl().checkAll([]), TypeError, 'limits must be a non-empty array'],
  ['checkAll: a pair', () => rl().checkAll([['k']]), TypeError, 'limits[0] must be a [key, limit] pair'],
  ['checkAll: a key', () => rl().checkAll([['k', L], ['', L]]), TypeError, 'limits[1][0] (a key) must be'],
  ['checkAll: a limit', () => rl().checkAll([['k', L], ['j', 'gcra']]), TypeError, 'limits[1][1] must be a limit(...)'],
  ['checkAll: cost', () => rl().checkAll([['k', L]], { cost: -2 }), RangeError, 'cost must be'],
  ['reset: no key', () => rl().reset(), TypeError, 'reset needs at least one key'],
  ['reset: key', () => rl().reset(''), TypeError, 'key must be'],
  ['reset: keys[1]', () => rl().reset('a', ''), TypeError, 'keys[1] must be'],
  ['acquire: key', () => rl().acquire('', 1, '1s', { id: 'x' }), TypeError, 'key must be'],
  ['acquire: n', () => rl().acquire('k', 0, '1s', { id: 'x' }), RangeError, 'n must be from 1'],
  ['acquire: lease', () => rl().acquire('k', 1, 'forever', { id: 'x' }), TypeError, 'lease must be'],
  ['acquire: id', () => rl().acquire('k', 1, '1s', {}), TypeError, 'id must be a non-empty string'],
  ['acquire: cost', () => rl().acquire('k', 1, '1s', { id: 'x', cost: 0 }), RangeError, 'cost must be from 1'],
  ['release: id', () => rl().release('k', ''), TypeError, 'id must be a non-empty string'],
  ['withLease: work', () => rl().withLease('k', 1, '1s', 'job'), TypeError, 'work must be a function'],
  ['policies.set: name', () => rl().policies.set('', L), TypeError, 'name must be a non-empty string'],
  ['policies.set: limit', () => rl().policies.set('p', policy('q')), TypeError, 'limit must be a limit(...)'],
  ['policies.get: name', () => rl().policies.get(5), TypeError, 'name must be'],
  ['close: waitMs', () => rl().close({ waitMs: -1 }), TypeError, 'waitMs must be'],
];
const MIDDLEWARE = [
  ['rateLimit: limiter', () => forExpress({ limit: L }), TypeError, 'rateLimit: limiter must be a RateLimiter'],
  ['rateLimit: limit', () => forExpress({ limiter: rl(), limit: 5 }), TypeError, 'rateLimit: limit must be'],
  ['rateLimit: key', () => forExpress({ limiter: rl(), limit: L, key: 'api' }), TypeError, 'rateLimit: key must be a function'],
  ['rateLimit: skip', () => forExpress({ limiter: rl(), limit: L, skip: 1 }), TypeError, 'rateLimit: skip must be a function'],
  ['rateLimit: cost', () => forExpress({ limiter: rl(), limit: L, cost: '1' }), TypeError, 'rateLimit: cost must be'],
  ['rateLimit: name', () => forExpress({ limiter: rl(), limit: L, name: 'a b' }), TypeError, 'rateLimit: name must be'],
  ['rateLimit: ipv6Subnet', () => forExpress({ limiter: rl(), limit: L, ipv6Subnet: 129 }), TypeError, 'rateLimit: ipv6Subnet must be'],
  ['RateLimitStore: limiter', () => new RateLimitStore({}), TypeError, 'RateLimitStore needs { limiter }'],
  ['RateLimitStore: algorithm', () => new RateLimitStore({ limiter: rl(), algorithm: 'gcra' }), TypeError, 'RateLimitStore: algorithm must be'],
];

test('every bad argument: the right error class, its message naming the argument the caller passed', async () => {
  for (const [what, call, kind, start] of [...CASES, ...MIDDLEWARE]) {
    assert.throws(call, (e) => e instanceof kind && e.message.startsWith(start), what);
  }
  for (const [what, call, kind, start] of ASYNC) {
    await assert.rejects(call, (e) => {
      assert.ok(e instanceof kind, `${what}: ${e}`);
      assert.ok(e.message.startsWith(start), `${what}: '${e.message}' does not start with '${start}'`);
      return true;
    }, what);
  }
  assert.equal(addressKey('192.0.2.1'), 'ip:192.0.2.1');
});
