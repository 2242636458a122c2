// The sans-IO engine (dist/esm/engine.js) and the batches' state (dist/esm/clientside.js) without
// a server: the breaker's transitions on a clock the test turns, which engine serves from the
// replies, the policies' cache, what each engine is sent, the library's loading, and onError.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { limit, policy, LIBRARY } from 'redis-ratelimit-client';
import { Batches } from '../dist/esm/clientside.js';
import { Breaker, Engine, LIBRARY_FUNCTIONS, Timeout, errorDecision, libraryAction, settings, share } from '../dist/esm/engine.js';
import { RateLimitError, RateLimitUnavailable } from '../dist/esm/types.js';
import { decision, policyDefinition } from '../dist/esm/wire.js';

/** An error reply as node-redis (ErrorReply) and ioredis (ReplyError) name theirs. */
class ErrorReply extends Error {}
class ReplyError extends Error {}

function clock(t = 0) {
  const c = () => c.t;
  c.t = t;
  return c;
}

function logs() {
  const lines = [];
  return { lines, info: (m) => lines.push(`info ${m}`), warn: (m) => lines.push(`warn ${m}`) };
}

function engine(options = {}) {
  const logger = logs();
  const now = clock();
  const e = new Engine(settings({ logger, now, ...options }));
  return { e, logger, now };
}

const MODULE_GONE = new ErrorReply("ERR unknown command 'RATELIMIT.CHECK', with args beginning with: 'k'");

test('the breaker opens after its failures, lets one probe through per cool-down, and closes on its success', () => {
  const now = clock(1000);
  const b = new Breaker(2, 100, now);
  assert.equal(b.allow(), true);
  b.failure();
  assert.deepEqual([b.open, b.allow()], [false, true], 'one failure of two: still closed');
  b.failure();
  assert.deepEqual([b.open, b.allow()], [true, false], 'two: open, calls refused at once');
  now.t = 1099;
  assert.equal(b.allow(), false, 'within the cool-down');
  now.t = 1100;
  assert.equal(b.allow(), true, 'the cool-down over: the probe');
  assert.equal(b.allow(), false, 'one probe at a time');
  b.failure();
  assert.deepEqual([b.open, b.allow()], [true, false], 'the probe failed: open for another cool-down');
  now.t = 1199;
  assert.equal(b.allow(), false);
  now.t = 1200;
  assert.equal(b.allow(), true);
  b.success();
  assert.deepEqual([b.open, b.allow(), b.allow()], [false, true, true], 'the probe answered: closed');
  // A success between failures starts the count again.
  b.failure();
  b.success();
  b.failure();
  assert.equal(b.open, false);
});

test('which engine serves: the module until the server says it has no such command (auto only)', () => {
  const auto = engine();
  assert.equal(auto.e.inUse, null);
  auto.e.moduleAnswered();
  auto.e.moduleAnswered();
  assert.equal(auto.e.inUse, 'module');
  assert.deepEqual(auto.logger.lines, ['info ratelimit: engine: the module (RATELIMIT.* commands)'], 'said once');
  // An error of the program or of the call is not the module's absence.
  assert.equal(auto.e.moduleFailed(new Error(MODULE_GONE.message)), false);
  assert.equal(auto.e.moduleFailed(new ReplyError('ERR syntax error')), false);
  assert.equal(auto.e.inUse, 'module');
  assert.equal(auto.e.moduleFailed(MODULE_GONE), true, 'send it again, to the library');
  assert.equal(auto.e.inUse, 'library');
  auto.e.libraryServes();
  auto.e.libraryServes();
  assert.equal(auto.logger.lines.filter((l) => /Functions library 'ratelimit'/.test(l)).length, 1);
  assert.match(auto.logger.lines.at(-1), /the module is not loaded: engine: the Functions library 'ratelimit' \(keys prefixed 'fn:'/);

  const pinned = engine({ engine: 'module' });
  assert.equal(pinned.e.inUse, 'module');
  assert.equal(pinned.e.moduleFailed(MODULE_GONE), false, "engine: 'module' never switches");
  assert.equal(pinned.e.inUse, 'module');
  assert.equal(engine({ engine: 'library' }).e.inUse, 'library');
  assert.match(pinned.e.adminError(MODULE_GONE).message, /^policies need the redis-ratelimit module/);
  assert.ok(pinned.e.adminError(MODULE_GONE) instanceof RateLimitError);
  const other = new ReplyError('ERR syntax error');
  assert.equal(pinned.e.adminError(other), other);
});

test("the library a primary has: loaded when missing, replaced when it lacks a function, else kept", () => {
  assert.ok(LIBRARY_FUNCTIONS.includes('ratelimit_check') && LIBRARY_FUNCTIONS.includes('ratelimit_take'));
  const all = LIBRARY_FUNCTIONS.map((name) => ['name', name, 'description', null, 'flags', []]);
  const listed = (code, functions) => [['library_name', 'ratelimit', 'engine', 'LUA', 'functions', functions, 'library_code', code]];
  assert.equal(libraryAction([]), 'load');
  assert.equal(libraryAction(listed(LIBRARY, all)), 'keep');
  assert.equal(libraryAction(listed('#!lua name=ratelimit\n-- another', all)), 'differs');
  assert.equal(libraryAction(listed('#!lua name=ratelimit\n-- older', all.slice(1))), 'replace');
  // RESP3: maps.
  const map = new Map([['library_name', 'ratelimit'], ['library_code', 'old'], ['functions', [new Map([['name', 'ratelimit_check']])]]]);
  assert.equal(libraryAction([map]), 'replace');
  const { e, logger } = engine();
  e.libraryLoaded('differs');
  e.libraryLoaded('differs');
  assert.equal(logger.lines.length, 1, 'a different library is warned about once');
});

test("policies: read at first use, again in the background after policyRefreshMs, forgotten on 'no such policy'", () => {
  const { e, now } = engine({ policyRefreshMs: 1000 });
  const definition = policyDefinition('api', ['algorithm', 'gcra', 'limit', '10', 'period_ms', '1000', 'burst', '20', 'mode', 'enforce']);
  assert.deepEqual(e.definitionOf('api'), { definition: null, fetch: 'wait' });
  e.learned('api', definition);
  now.t = 1000;
  assert.deepEqual(e.definitionOf('api'), { definition, fetch: null });
  now.t = 1001;
  assert.deepEqual(e.definitionOf('api'), { definition, fetch: 'refresh' });
  assert.deepEqual(e.definitionOf('api'), { definition, fetch: null }, 'one read at a time');
  e.refreshFailed('api');
  assert.equal(e.definitionOf('api').fetch, 'refresh', 'a failed read is tried again');
  e.learned('api', definition);
  assert.equal(e.definitionOf('api').fetch, null);
  assert.equal(e.moduleFailed(new ErrorReply('ERR no such policy: api')), false);
  assert.equal(e.definitionOf('api').fetch, 'wait', 'deleted meanwhile: read again');
  e.learned('api', null);
  assert.equal(e.definitionOf('api').definition, null, 'the server has none: known as such');
  e.forget('api');
  assert.equal(e.definitionOf('api').fetch, 'wait');
});

test('what each engine is sent for a spec: inline, a policy by name, its fallback, a shadow policy beside its PEEK', () => {
  const { e, logger } = engine();
  const l = limit('token-bucket', 10, '1s', { burst: 20 });
  const fallback = limit('fixed-window', 5, '1m');
  assert.deepEqual(e.inlineArgs('check', 'k', l, 2, undefined), ['RATELIMIT.CHECK', 'k', 'token-bucket', '10', '1s', 'BURST', '20', 'COST', '2']);
  assert.deepEqual(e.inlineArgs('take', 'k', l, 7, 1234), ['RATELIMIT.TAKE', 'k', 'token-bucket', '10', '1s', 'BURST', '20', 'MAX', '7', 'AT', '1234']);
  assert.equal(e.argsOf(l), e.argsOf(l), "an inline limit's arguments are made once");

  const p = policy('api', { fallback });
  const missing = e.resolve(p, null);
  assert.deepEqual(missing, { args: ['fixed-window', '5', '1m'], periodMs: 60000 });
  e.resolve(p, null);
  assert.deepEqual(logger.lines, ["warn ratelimit: the server has no policy 'api': using its fallback fixed-window 5 1m"], 'warned once');
  assert.deepEqual(e.resolve(policy('bare'), null), { args: ['POLICY', 'bare'], periodMs: 0 }, "the module's own error says it");

  const shadow = policyDefinition('api', ['algorithm', 'sliding-window', 'limit', '3', 'period_ms', '60000', 'mode', 'shadow']);
  const resolved = e.resolve(p, shadow);
  assert.deepEqual(resolved.args, ['POLICY', 'api']);
  assert.equal(resolved.periodMs, 60000);
  const call = e.moduleCall('take', 'k', resolved, 4, ['AT', '5']);
  assert.deepEqual(call.args, ['RATELIMIT.TAKE', 'k', 'POLICY', 'api', 'MAX', '4', 'AT', '5']);
  assert.deepEqual(call.peek, ['RATELIMIT.PEEK', 'k', 'sliding-window', '3', '60000', 'COST', '4', 'AT', '5']);
  assert.equal(e.moduleCall('refund', 'k', resolved, 4, []).peek, null, 'a refund is not compared');
  assert.equal(e.moduleCall('peek', 'k', resolved, 1, []).readonly, true);
  // Admitted by the shadow policy, refused by enforcement: shadowRejected.
  assert.equal(e.read('check', [1, 3, 2, 0, 100, 0], 'module', 60000, 1, [0, 3, 0, 10, 100, 0]).shadowRejected, true);
  assert.equal(e.read('check', [1, 3, 2, 0, 100, 0], 'module', 60000, 1, [1, 3, 2, 0, 100, 0]).shadowRejected, false);
  assert.equal(e.read('check', [0, 3, 0, 9, 100, 0], 'module', 60000, 1, [0, 3, 0, 9, 100, 0]).shadowRejected, false);
  assert.equal(e.read('take', [2, 3, 0, 0, 100, 0], 'module', 60000, 5).granted, 2);

  const lib = e.libraryCall('peek', 'k', p, 1, []);
  assert.deepEqual(lib, { args: ['FCALL_RO', 'ratelimit_peek', '1', 'fn:k', 'fixed-window', '5', '1m', 'COST', '1'], key: 'fn:k', readonly: true, periodMs: 60000 });
  assert.throws(() => e.libraryCall('check', 'k', policy('bare'), 1, []), (error) => error instanceof RateLimitError && /has no fallback/.test(error.message));
  assert.deepEqual(e.reset(['a', 'b'], true), { args: ['FCALL', 'ratelimit_reset', '2', 'fn:a', 'fn:b'], key: 'fn:a' });
  assert.deepEqual(e.release('k', 'id1', [], false), { args: ['RATELIMIT.RELEASE', 'k', 'ID', 'id1'], key: 'k' });
});

test('Redis unavailable: the breaker counts it, the log says it once, and onError answers', () => {
  const { e, logger } = engine({ breaker: { failures: 2, cooldownMs: 1000 } });
  const wrong = new TypeError('not a decision');
  assert.equal(e.failed(wrong), wrong, "the program's error as is");
  const refused = new ReplyError('ERR syntax error');
  assert.equal(e.failed(refused), refused, 'an error reply is an answer');
  const first = e.failed(new Timeout('Redis did not answer within 100 ms'));
  assert.ok(first instanceof RateLimitUnavailable);
  assert.equal(first.message, 'Redis unavailable: Redis did not answer within 100 ms');
  assert.equal(e.breaker.open, false);
  e.failed(new ReplyError('LOADING Redis is loading the dataset in memory'));
  assert.equal(e.breaker.open, true);
  assert.deepEqual(logger.lines, ['warn ratelimit: Redis unavailable (Redis did not answer within 100 ms): failing open (admitted)']);
  e.answered();
  e.answered();
  assert.equal(e.breaker.open, false);
  assert.deepEqual(logger.lines.slice(1), ['warn ratelimit: Redis answers again']);

  const down = new RateLimitUnavailable('Redis unavailable: x');
  assert.deepEqual(e.unavailable(down, 1000, 3, null), errorDecision(1000, 3));
  assert.deepEqual(e.unavailable(down, 0, 1, null, true), { ...errorDecision(0, 1), limits: [] });
  assert.throws(() => e.unavailable(wrong, 0, 1, null), (error) => error === wrong, 'only unavailability is answered');
  assert.throws(() => engine({ onError: 'closed' }).e.unavailable(down, 0, 1, null), (error) => error === down);
  const local = engine({ onError: 'local' }).e;
  const decided = decision([0, 1, 0, 5, 5, 0], 'fallback', 1000, 1);
  assert.equal(local.unavailable(down, 0, 1, () => decided), decided);
  assert.deepEqual(local.unavailable(down, 7, 1, () => null), errorDecision(7, 1), 'no limit known here: open');
});

test("onError 'local': the limit scaled by localShare, a policy's definition or its fallback, never a shadow policy's", () => {
  assert.deepEqual([share(10, 0.5), share(7, 0.1), share(1e12, 0.3), share(3, 1e-9)], [5, 1, 3e11, 1]);
  const { e } = engine({ onError: 'local', localShare: 0.5 });
  const l = limit('token-bucket', 10, '1s', { burst: 5, block: '1m' });
  const scaled = e.localLimit(l);
  assert.deepEqual([scaled.limit, scaled.burst, scaled.block, scaled.periodMs], [5, 2, '1m', 1000]);
  assert.equal(e.localLimit(l), scaled, 'scaled once');
  const p = policy('api', { fallback: limit('fixed-window', 4, '1m') });
  assert.equal(e.localLimit(p).limit, 2, 'the fallback before the definition is read');
  assert.equal(e.localLimit(policy('bare')), null);
  e.learned('api', policyDefinition('api', ['algorithm', 'gcra', 'limit', '8', 'period_ms', '1000', 'mode', 'enforce']));
  assert.deepEqual([e.localLimit(p).algorithm, e.localLimit(p).limit], ['gcra', 4]);
  e.learned('api', policyDefinition('api', ['algorithm', 'gcra', 'limit', '8', 'period_ms', '1000', 'mode', 'shadow']));
  assert.equal(e.localLimit(p), null);
  assert.equal(e.decideLocally('check', 'k', p, 1, 0), null);
  // At the machine's time: the in-process limiter drops a key when Redis would expire it.
  const t = Date.now();
  const d = e.decideLocally('check', 'k', limit('sliding-log', 2, '1h'), 1, t);
  assert.deepEqual([d.allowed, d.granted, d.limit, d.remaining, d.source], [true, 1, 1, 0, 'fallback']);
  assert.equal(e.decideLocally('check', 'k', limit('sliding-log', 2, '1h'), 1, t + 1).allowed, false, 'half of 2 is 1');
});

test('the denial cache takes a refusal only where no BLOCK would be skipped', () => {
  const { e } = engine();
  assert.equal(e.cacheable(limit('gcra', 1, '1s')), true);
  assert.equal(e.cacheable(limit('gcra', 1, '1s', { block: '1m' })), false);
  const p = policy('api', { fallback: limit('gcra', 1, '1s', { block: '1m' }) });
  assert.equal(e.cacheable(p), false, "the fallback's block until the definition is read");
  e.learned('api', policyDefinition('api', ['algorithm', 'gcra', 'limit', '1', 'period_ms', '1000', 'mode', 'enforce']));
  assert.equal(e.cacheable(p), true);
  e.learned('api', policyDefinition('api', ['algorithm', 'gcra', 'limit', '1', 'period_ms', '1000', 'mode', 'enforce', 'block_ms', '5000']));
  assert.equal(e.cacheable(p), false);
});

test("a batch: its TAKE's size from the demand of the last hold time, its units admitted here, the rest given back at its time", () => {
  const now = clock(0);
  const stats = { held: 0, batchTaken: 0, batchUsed: 0 };
  const batches = new Batches(now, stats);
  const lim = limit('sliding-log', 100, '1h', { batch: '100ms', batchMax: 50 });
  const b = batches.of('k', lim);
  assert.equal(batches.of('k', lim), b);
  assert.notEqual(batches.of('k2', lim), b);
  batches.noteDemand(b, 3);
  assert.equal(batches.wanted(b, 3), 3);
  now.t = 150; // the next interval: the previous one's 3 weighted by the half still within 100 ms
  batches.noteDemand(b, 1);
  assert.equal(batches.demand(b), Math.ceil(1 + 3 * 0.5));
  b.waiting = 60;
  assert.equal(batches.wanted(b, 1), 50, 'at most batchMax');
  b.waiting = 0;
  const taken = decision([10, 100, 90, 0, 3600000, 0], 'module', 3600000, null);
  batches.hold(b, taken, 5000);
  assert.deepEqual([b.units, stats.held, stats.batchTaken, b.holdEnd], [10, 10, 10, 250]);
  now.t = 200;
  const d = batches.admit(b, 4);
  assert.deepEqual([d.allowed, d.granted, d.remaining, d.limit, d.resetAfterMs, d.source], [true, 4, 6, 100, 3600000 - 50, 'local']);
  assert.equal(batches.expired(b), false);
  now.t = 250;
  assert.equal(batches.expired(b), true);
  assert.deepEqual(batches.release(b), { units: 6, at: 5000 + 100 }, "given back at the batch's own time");
  assert.deepEqual([b.units, stats.held, stats.batchUsed], [0, 0, 4]);
  assert.equal(batches.release(b), null);
  assert.equal(batches.next(b, 300), 100, 'kept while asked for within two hold times');
  assert.equal(batches.next(b, 350), null, 'forgotten after two hold times without a request');
  assert.equal(batches.current(b), false);
  // Demand older than the previous interval counts no more.
  const quiet = batches.of('k3', lim);
  batches.noteDemand(quiet, 30);
  now.t += 250;
  batches.noteDemand(quiet, 1);
  assert.equal(batches.demand(quiet), 1);
});
