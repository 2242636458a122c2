// A limit spec as one argument: where the module's RATELIMIT.CHECK has arity -3 (COMMAND INFO, sent
// once beside the first module call), every spec of CHECK, PEEK, TAKE, REFUND and CHECKALL goes as
// one argument, its words joined by single spaces ('token-bucket 10 1s BURST 20', 'POLICY api');
// elsewhere (arity -4, no answer, an error reply, the Functions library) as words. The engine and
// a limiter on a scripted client without a server (what is asked, the exact words sent both ways
// on every path), then real servers: the same sequences both ways answer the same decisions.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { LIBRARY, RateLimiter, limit, policy } from 'redis-ratelimit-client';
import { Engine, settings } from '../dist/esm/engine.js';
import { commandArity, policyDefinition } from '../dist/esm/wire.js';

import { CLIENTS, NO_MODULE, closeClient, memoryLogger, random, raw, startServer } from './helpers.mjs';

class ErrorReply extends Error {}

const LIMIT = limit('token-bucket', 10, '1s', { burst: 20, block: '1m' });
const WORDS = ['token-bucket', '10', '1s', 'BURST', '20', 'BLOCK', '1m'];
const WINDOW = limit('sliding-window', 100, '1m');
/** POLICY GET's fields of the policies the scripted server has. */
const POLICIES = {
  api: ['algorithm', 'sliding-window', 'limit', 100, 'period_ms', 60000, 'mode', 'enforce', 'block_ms', 0],
  dark: ['algorithm', 'gcra', 'limit', 5, 'period_ms', 1000, 'burst', 8, 'mode', 'shadow', 'block_ms', 2000],
};
const API = policyDefinition('api', POLICIES.api);
const DARK = policyDefinition('dark', POLICIES.dark);
const DARK_WORDS = ['gcra', '5', '1000', 'BURST', '8', 'BLOCK', '2000'];

/** COMMAND INFO RATELIMIT.CHECK's reply from a module of that arity. */
const info = (arity) => [['ratelimit.check', arity, ['write', 'fast'], 1, 1, 1, [], [], [], []]];
/** The words of a spec in a form. */
const form = (words, oneArg) => (oneArg ? [words.join(' ')] : words);

function engine(options = {}) {
  return new Engine(settings({ logger: memoryLogger(), ...options }));
}

test('the arity is read from COMMAND INFO\'s reply', () => {
  assert.equal(commandArity(info(-3)), -3);
  assert.equal(commandArity(info(-4)), -4);
  assert.equal(commandArity([['ratelimit.check', 3n]]), 3);
  assert.equal(commandArity([['ratelimit.check', '-3']]), -3);
  for (const none of [[null], [], null, 'x', [['ratelimit.check']], [['ratelimit.check', 'x']]]) assert.equal(commandArity(none), null, JSON.stringify(none));
});

test('the engine asks once where the module may serve: arity -3 one argument, anything else words, Redis unavailable asked again', () => {
  for (const [reply, oneArg] of [[info(-3), true], [info(-4), false], [info(-5), false], [[null], false]]) {
    for (const choice of ['auto', 'module']) {
      const e = engine({ engine: choice });
      assert.equal(e.oneArg, false, 'words until it is known');
      assert.deepEqual(e.formToAsk(), ['COMMAND', 'INFO', 'RATELIMIT.CHECK']);
      assert.equal(e.formToAsk(), null, 'asked once');
      e.formFound(reply);
      assert.equal(e.oneArg, oneArg, JSON.stringify(reply));
      assert.equal(e.formToAsk(), null);
    }
  }
  const denied = engine();
  denied.formToAsk();
  denied.formFailed(new ErrorReply('NOPERM this user has no permissions to run the \'command|info\' command'));
  assert.deepEqual([denied.oneArg, denied.formToAsk()], [false, null], 'an error reply: words, not asked again');
  const down = engine();
  down.formToAsk();
  down.formFailed(new Error('connect ECONNREFUSED 127.0.0.1:1'));
  assert.deepEqual(down.formToAsk(), ['COMMAND', 'INFO', 'RATELIMIT.CHECK'], 'Redis unavailable: asked again beside a later call');
  assert.equal(engine({ engine: 'library' }).formToAsk(), null, 'the library: never asked');
  const gone = engine();
  gone.moduleFailed(new ErrorReply("ERR unknown command 'RATELIMIT.CHECK', with args beginning with: 'k'"));
  assert.equal(gone.formToAsk(), null, 'the library serves: not asked');
});

for (const oneArg of [false, true]) {
  test(`the engine builds every module spec ${oneArg ? 'as one argument' : 'as words'}, the library's as words`, () => {
    const e = engine();
    e.formToAsk();
    e.formFound(info(oneArg ? -3 : -4));
    const s = (words) => form(words, oneArg);
    const at = ['AT', '1796006883715'];
    assert.deepEqual(e.inlineArgs('check', 'k', LIMIT, 1, undefined), ['RATELIMIT.CHECK', 'k', ...s(WORDS), 'COST', '1']);
    assert.deepEqual(e.inlineArgs('take', 'k', LIMIT, 7, 1796006883715), ['RATELIMIT.TAKE', 'k', ...s(WORDS), 'MAX', '7', ...at]);
    for (const [command, amount] of [['check', 'COST'], ['peek', 'COST'], ['take', 'MAX'], ['refund', 'COST']]) {
      const call = e.moduleCall(command, 'k', e.resolve(LIMIT, null), 3, at);
      assert.deepEqual(call.args, [`RATELIMIT.${command.toUpperCase()}`, 'k', ...s(WORDS), amount, '3', ...at], command);
      assert.deepEqual(e.moduleCall(command, 'k', e.resolve(policy('api'), API), 3, []).args, [`RATELIMIT.${command.toUpperCase()}`, 'k', ...s(['POLICY', 'api']), amount, '3']);
    }
    // A shadow policy: enforcement's PEEK of its definition inline, beside the call.
    const shadow = e.moduleCall('check', 'k', e.resolve(policy('dark'), DARK), 1, []);
    assert.deepEqual(shadow.args, ['RATELIMIT.CHECK', 'k', ...s(['POLICY', 'dark']), 'COST', '1']);
    assert.deepEqual(shadow.peek, ['RATELIMIT.PEEK', 'k', ...s(DARK_WORDS), 'COST', '1']);
    // A policy the server lacks: its fallback; none either: by name (the module says so).
    const gone = e.moduleCall('check', 'k', e.resolve(policy('gone', { fallback: WINDOW }), null), 1, []);
    assert.deepEqual(gone.args, ['RATELIMIT.CHECK', 'k', ...s(['sliding-window', '100', '1m']), 'COST', '1']);
    assert.deepEqual(e.moduleCall('check', 'k', e.resolve(policy('nope'), null), 1, []).args, ['RATELIMIT.CHECK', 'k', ...s(['POLICY', 'nope']), 'COST', '1']);
    const all = e.moduleCheckAll(['a', 'b', 'c'], [e.resolve(LIMIT, null), e.resolve(policy('dark'), DARK), e.resolve(WINDOW, null)], 2, at);
    assert.deepEqual(all.args, ['RATELIMIT.CHECKALL', '3', 'a', 'b', 'c', ...s(WORDS), ...s(['POLICY', 'dark']), ...s(['sliding-window', '100', '1m']), 'COST', '2', ...at]);
    assert.deepEqual(all.peeks, [null, ['RATELIMIT.PEEK', 'b', ...s(DARK_WORDS), 'COST', '2', ...at], null]);
    // The library's functions take words, whatever the module would.
    assert.deepEqual(e.libraryCall('take', 'k', policy('p', { fallback: WINDOW }), 5, []).args, ['FCALL', 'ratelimit_take', '1', 'fn:k', 'sliding-window', '100', '1m', 'MAX', '5']);
    assert.deepEqual(e.libraryCheckAll(['a', 'b'], [LIMIT, WINDOW], 1, []).args, ['FCALL', 'ratelimit_checkall', '2', 'fn:a', 'fn:b', ...WORDS, 'sliding-window', '100', '1m', 'COST', '1']);
  });
}

/** A node-redis-like client answering as a server of that arity would; `held`: a key whose CHECKs
 * are answered only when the test says (`release()`). `sent`: every command, in order. */
function scripted(arity, { held } = {}) {
  const sent = [];
  const waiting = [];
  const client = {
    sent,
    old: false, // true: the server refuses specs as one argument (an older module)
    release: () => waiting.splice(0).forEach((answer) => answer()),
    sendCommand: (args) => {
      sent.push(args);
      const [name] = args;
      const joined = args.find((a) => a.includes(' '));
      if (client.old && name !== 'COMMAND' && joined) return Promise.reject(new ErrorReply(`ERR unknown algorithm '${joined}': expected token-bucket, leaky-bucket, ...`));
      if (name === 'COMMAND') return Promise.resolve(arity === null ? [null] : info(arity));
      if (name === 'RATELIMIT.POLICY') return Promise.resolve(POLICIES[args[2]] ?? null);
      if (name === 'RATELIMIT.CHECKALL') return Promise.resolve(Array.from({ length: 1 + Number(args[1]) }, () => [1, 10, 9, 0, 100, 0]));
      if (name === 'RATELIMIT.TAKE') return Promise.resolve([4, 10, 6, 0, 100, 0]);
      if (name === 'RATELIMIT.CHECK' && args[1] === held) return new Promise((resolve) => waiting.push(() => resolve([1, 10, 9, 0, 100, 0])));
      return Promise.resolve([1, 10, 9, 0, 100, 0]);
    },
  };
  return client;
}

/** The decision commands sent (not COMMAND INFO, nor POLICY GET). */
const decisions = (sent) => sent.filter(([name]) => name !== 'COMMAND' && name !== 'RATELIMIT.POLICY');

for (const arity of [-3, -4, null]) {
  test(`a limiter on a server of arity ${arity}: COMMAND INFO once beside the first call, not counted; then every path sends ${arity === -3 ? 'one argument' : 'words'}`, async () => {
    const oneArg = arity === -3;
    const s = (words) => form(words, oneArg);
    let now = 0;
    const client = scripted(arity, { held: 'late' });
    const rl = new RateLimiter(client, { logger: memoryLogger(), timeoutMs: 1000, now: () => now });
    await rl.check('first', LIMIT);
    assert.deepEqual(client.sent.slice(0, 2), [['COMMAND', 'INFO', 'RATELIMIT.CHECK'], ['RATELIMIT.CHECK', 'first', ...WORDS, 'COST', '1']], 'pipelined: the first call does not wait for it, and goes as words');
    assert.equal(rl.stats.commands, 1, 'COMMAND INFO is not a call\'s command');
    client.sent.length = 0;
    await rl.check('k', LIMIT);
    await rl.peek('k', LIMIT, { cost: 2 });
    await rl.take('k', LIMIT, 7);
    await rl.refund('k', LIMIT, 3);
    await rl.check('k', policy('api'));
    await rl.check('k', policy('dark'));
    await rl.checkAll([['a', LIMIT], ['b', policy('dark')]], { cost: 2 });
    await rl.check('k', policy('gone', { fallback: WINDOW }));
    const batched = limit('gcra', 10, '1s', { batch: '50ms', batchMax: 4 });
    await rl.check('b', batched); // a batch's TAKE (grants 4: 3 held)
    now = 1000;
    await rl.check('b', batched, { cost: 2 }); // the hold is over: the 3 given back, then a TAKE (4: 2 held)
    await rl.close(); // the 2 given back
    const window = ['sliding-window', '100', '1m'];
    const gcra = ['gcra', '10', '1s'];
    assert.deepEqual(decisions(client.sent), [
      ['RATELIMIT.CHECK', 'k', ...s(WORDS), 'COST', '1'],
      ['RATELIMIT.PEEK', 'k', ...s(WORDS), 'COST', '2'],
      ['RATELIMIT.TAKE', 'k', ...s(WORDS), 'MAX', '7'],
      ['RATELIMIT.REFUND', 'k', ...s(WORDS), 'COST', '3'],
      ['RATELIMIT.CHECK', 'k', ...s(['POLICY', 'api']), 'COST', '1'],
      ['RATELIMIT.PEEK', 'k', ...s(DARK_WORDS), 'COST', '1'],
      ['RATELIMIT.CHECK', 'k', ...s(['POLICY', 'dark']), 'COST', '1'],
      ['RATELIMIT.PEEK', 'b', ...s(DARK_WORDS), 'COST', '2'],
      ['RATELIMIT.CHECKALL', '2', 'a', 'b', ...s(WORDS), ...s(['POLICY', 'dark']), 'COST', '2'],
      ['RATELIMIT.CHECK', 'k', ...s(window), 'COST', '1'],
      ['RATELIMIT.TAKE', 'b', ...s(gcra), 'MAX', '1'],
      ['RATELIMIT.REFUND', 'b', ...s(gcra), 'COST', '3'],
      ['RATELIMIT.TAKE', 'b', ...s(gcra), 'MAX', '2'],
      ['RATELIMIT.REFUND', 'b', ...s(gcra), 'COST', '2'],
    ]);
    assert.equal(client.sent.filter(([name]) => name === 'COMMAND').length, 0, 'asked once');

    // The denial cache's path and a late grant's refund: the same form.
    const cached = scripted(arity, { held: 'late' });
    const rl2 = new RateLimiter(cached, { logger: memoryLogger(), timeoutMs: 20, denialCache: 10 });
    await rl2.check('first', LIMIT);
    await rl2.check('c', LIMIT);
    assert.equal((await rl2.check('late', LIMIT)).source, 'error', 'no answer within timeoutMs');
    cached.release(); // answered now: its unit goes back
    await rl2.close();
    assert.deepEqual(decisions(cached.sent).slice(1), [
      ['RATELIMIT.CHECK', 'c', ...s(WORDS), 'COST', '1'],
      ['RATELIMIT.CHECK', 'late', ...s(WORDS), 'COST', '1'],
      ['RATELIMIT.REFUND', 'late', ...s(WORDS), 'COST', '1'],
    ]);
  });
}

test('a server that refuses one argument (an older module) gets the call again as words, and words from then on', async () => {
  const e = engine();
  e.formToAsk();
  e.formFound(info(-3));
  assert.equal(e.oneArgRefused(new ErrorReply('WRONGTYPE Operation against a key holding the wrong kind of value')), false);
  assert.equal(e.oneArgRefused(new Error("ERR unknown algorithm 'gcra 10 1s'")), false, 'not an error reply');
  assert.equal(e.oneArg, true);
  assert.equal(e.oneArgRefused(new ErrorReply("ERR unknown algorithm 'gcra 10 1s': expected token-bucket, ...")), true);
  assert.equal(e.oneArg, false);
  assert.equal(e.oneArgRefused(new ErrorReply("ERR limit spec 1 (key 'a'): unknown algorithm 'POLICY api': expected ...")), true, 'a call in flight meanwhile: sent again too');

  const client = scripted(-3);
  const logger = memoryLogger();
  const rl = new RateLimiter(client, { logger, timeoutMs: 1000 });
  await rl.check('first', LIMIT);
  client.old = true; // a failover to an older module, or a cluster's node not upgraded yet
  client.sent.length = 0;
  assert.equal((await rl.check('k', LIMIT)).allowed, true);
  await rl.take('k', LIMIT, 2);
  rl.core.oneArg = true;
  assert.equal((await rl.checkAll([['a', LIMIT], ['b', policy('api')]])).allowed, true);
  rl.core.oneArg = true;
  assert.equal((await rl.peek('k', policy('api'))).allowed, true);
  await rl.close();
  assert.deepEqual(decisions(client.sent), [
    ['RATELIMIT.CHECK', 'k', WORDS.join(' '), 'COST', '1'],
    ['RATELIMIT.CHECK', 'k', ...WORDS, 'COST', '1'],
    ['RATELIMIT.TAKE', 'k', ...WORDS, 'MAX', '2'],
    ['RATELIMIT.CHECKALL', '2', 'a', 'b', WORDS.join(' '), 'POLICY api', 'COST', '1'],
    ['RATELIMIT.CHECKALL', '2', 'a', 'b', ...WORDS, 'POLICY', 'api', 'COST', '1'],
    ['RATELIMIT.PEEK', 'k', 'POLICY api', 'COST', '1'],
    ['RATELIMIT.PEEK', 'k', 'POLICY', 'api', 'COST', '1'],
  ]);
  assert.equal(logger.lines.filter((l) => /does not take a limit spec as one argument/.test(l)).length, 3, 'said at each change of form');
});

// ---- real servers: the same sequences in both forms answer the same ----

async function arityOf(server) {
  const client = raw(server);
  try {
    return commandArity(await client.call('COMMAND', 'INFO', 'RATELIMIT.CHECK'));
  } finally {
    client.disconnect();
  }
}

/** Every algorithm, with BURST and BLOCK where they apply, tight enough to refuse and block often. */
const SPECS = [
  limit('token-bucket', 3, '1s', { burst: 5, block: '300ms' }),
  limit('leaky-bucket', 2, '500ms', { burst: 4 }),
  limit('fixed-window', 2, '200ms', { block: '300ms' }),
  limit('sliding-window', 3, '1s'),
  limit('sliding-log', 2, '250ms', { block: 400 }),
  limit('gcra', 2, '1s', { burst: 3, block: '1s' }),
];

for (const engineName of ['module', 'library']) {
  describe(`both forms on the ${engineName}`, () => {
    let server;
    let arity = null;
    before(async () => {
      if (engineName === 'module' && NO_MODULE) return;
      server = await startServer({ module: engineName === 'module' });
      arity = await arityOf(server);
      const admin = raw(server);
      if (engineName === 'module') {
        await admin.call('RATELIMIT.POLICY', 'SET', 'form-api', 'token-bucket', '5', '1s', 'BURST', '7');
        await admin.call('RATELIMIT.POLICY', 'SET', 'form-dark', 'fixed-window', '3', '1s', 'SHADOW');
      } else {
        await admin.call('FUNCTION', 'LOAD', 'REPLACE', LIBRARY);
      }
      admin.disconnect();
    });
    after(() => server?.stop());

    for (const flavour of CLIENTS.filter((c) => ['node-redis 6 RESP3', 'node-redis 4', 'ioredis 6 RESP2'].includes(c.name))) {
      test(`${flavour.name}: a limiter finds the server's form, and both forms answer the same decisions`, async (t) => {
        if (!server) return t.skip(NO_MODULE);
        // The form found by a limiter of its own: what the server's arity says.
        const finder = await flavour.make(server);
        const found = new RateLimiter(finder, { logger: memoryLogger(), timeoutMs: 30000 });
        await found.check('form:find', WINDOW);
        await found.check('form:find', WINDOW);
        assert.equal(found.core.formUnknown, false);
        assert.equal(found.core.oneArg, engineName === 'module' && arity === -3);
        await closeClient(finder);
        // An older module (arity -4) refuses the first call's one argument: words from then on.
        const older = engineName === 'module' && arity !== -3;

        const rand = random(0xf0a + flavour.name.length);
        const specs = [...SPECS];
        specs.push(...(engineName === 'module'
          ? [policy('form-api'), policy('form-dark'), policy('form-gone', { fallback: limit('gcra', 4, '1s') })]
          : [policy('form-api', { fallback: limit('token-bucket', 5, '1s', { burst: 7 }) })]));
        const steps = [];
        let at = Date.now() + 86400000;
        for (let i = 0; i < 120; i += 1) {
          at += rand.pick([0, 1, 7, 40, 150, 600]);
          const op = rand.pick(['check', 'check', 'peek', 'refund', 'take', 'checkAll']);
          steps.push({ at, op, cost: op === 'take' ? rand.int(1, 9) : rand.int(0, 4), i: rand.int(0, specs.length - 1), j: rand.int(0, specs.length - 1) });
        }
        const run = async (oneArg, denialCache) => {
          const client = await flavour.make(server);
          let elapsed = 0;
          const rl = new RateLimiter(client, { logger: memoryLogger(), timeoutMs: 30000, denialCache, now: () => elapsed });
          rl.core.formUnknown = false; // (before any call: not asked)
          rl.core.oneArg = oneArg;
          const tag = `${flavour.name}:${denialCache}:${oneArg}`;
          const got = [];
          got.form = rl.core;
          try {
            for (const { at: time, op, cost, i, j } of steps) {
              elapsed = time;
              if (op === 'checkAll') got.push(await rl.checkAll([[`{${tag}}a${i}`, specs[i]], [`{${tag}}b${j}`, specs[j]]], { cost, at: time }));
              else if (op === 'take' || op === 'refund') got.push(await rl[op](`${tag}a${i}`, specs[i], cost, { at: time }));
              else got.push(await rl[op](`${tag}a${i}`, specs[i], { cost, at: time }));
            }
            await rl.close();
          } finally {
            await closeClient(client);
          }
          return got;
        };
        for (const denialCache of [0, 100]) {
          const words = await run(false, denialCache);
          const one = await run(true, denialCache);
          if (engineName === 'module') assert.equal(one.form.oneArg, !older, 'refused once by an older module');
          assert.equal(words.length, steps.length);
          words.forEach((d, n) => {
            assert.deepEqual(one[n], d, `${flavour.name} denialCache ${denialCache} step ${n}: ${JSON.stringify(steps[n])}`);
            assert.ok(['module', 'library', 'cache'].includes(d.source), d.source);
          });
        }
      });
    }
  });
}
