// Each middleware in a real app of its framework (Express 5, Fastify 5, Hono on Node's server, a
// bare fetch handler), driven by real HTTP requests (Node's fetch), its headers parsed and
// checked; and express-rate-limit with the store.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import express from 'express';
import { rateLimit as expressRateLimit } from 'express-rate-limit';
import Fastify from 'fastify';
import { Hono } from 'hono';
import { serve } from '@hono/node-server';

import { RateLimiter, limit } from 'redis-ratelimit-client';
import { rateLimit as forExpress } from 'redis-ratelimit-client/express';
import { RateLimitStore } from 'redis-ratelimit-client/express-rate-limit';
import { rateLimit as forFastify } from 'redis-ratelimit-client/fastify';
import { limitFetch, rateLimit as forHono } from 'redis-ratelimit-client/hono';

import { CLIENTS, closeClient, memoryLogger, startServer } from './helpers.mjs';

// A sliding window: on a refusal its retry (RateLimit's t, Retry-After) differs from its reset.
const LIMIT = limit('sliding-window', 3, '10s');

/** `"name";k=v;k=v` (one item of a structured-field list) as { name, k: v }. */
function item(value) {
  assert.ok(value, 'a header');
  const [name, ...params] = value.split(';');
  assert.match(name, /^"[A-Za-z0-9_.-]+"$/, value);
  const parsed = { name: name.slice(1, -1) };
  for (const p of params) {
    const [k, v] = p.split('=');
    assert.match(v, /^\d+$/, value);
    parsed[k] = Number(v);
  }
  return parsed;
}

async function get(base, path, key) {
  const response = await fetch(base + path, { headers: key ? { 'X-API-Key': key } : {} });
  const text = await response.text();
  return { status: response.status, headers: response.headers, body: text.startsWith('{') ? JSON.parse(text) : text };
}

/** The same plan for every framework: what each answer must be. */
async function plan(base, limiter) {
  // Without a key: limited by the client's address (all of these come from 127.0.0.1).
  await limiter.reset('ip:127.0.0.1');
  for (let i = 0; i < 3; i += 1) {
    const r = await get(base, '/', undefined);
    assert.equal(r.status, 200);
    assert.equal(item(r.headers.get('ratelimit')).r, 2 - i, 'no key: limited by the address');
  }
  const keyless = await get(base, '/', undefined);
  assert.equal(keyless.status, 429, 'no key: refused past the limit, as any caller');
  // skip: not limited, not counted.
  for (let i = 0; i < 5; i += 1) {
    const health = await get(base, '/health', undefined);
    assert.equal(health.status, 200);
    assert.equal(health.headers.get('ratelimit'), null, 'skipped: no headers');
  }
  for (let i = 0; i < 3; i += 1) {
    const r = await get(base, '/', 'alice');
    assert.equal(r.status, 200);
    assert.equal(r.body, 'ok');
    assert.deepEqual(item(r.headers.get('ratelimit-policy')), { name: 'api', q: 3, w: 10 });
    const rl = item(r.headers.get('ratelimit'));
    assert.equal(rl.name, 'api');
    assert.equal(rl.r, 2 - i);
    assert.ok(rl.t >= 10 && rl.t <= 20, `t=${rl.t}: the window and the one after`);
    assert.equal(r.headers.get('retry-after'), null);
    assert.equal(r.headers.get('x-decision-remaining'), String(2 - i), 'the decision is on the request');
  }
  const refused = await get(base, '/', 'alice');
  assert.equal(refused.status, 429);
  const retryAfter = Number(refused.headers.get('retry-after'));
  // At most the time until the key is fresh: two windows.
  assert.ok(retryAfter >= 1 && retryAfter <= 20, `Retry-After ${retryAfter}`);
  const rl = item(refused.headers.get('ratelimit'));
  assert.deepEqual([rl.r, rl.t], [0, retryAfter]);
  assert.deepEqual(item(refused.headers.get('ratelimit-policy')), { name: 'api', q: 3, w: 10 });
  assert.equal(refused.body.error, 'rate limited');
  assert.equal(refused.body.policy, 'api');
  assert.ok(refused.body.retry_after_ms > 0 && Math.ceil(refused.body.retry_after_ms / 1000) === retryAfter, JSON.stringify(refused.body));
  const other = await get(base, '/', 'bob');
  assert.equal(item(other.headers.get('ratelimit')).r, 2, 'another key is unaffected');
  // Per route: /heavy costs 3 on its own key.
  const heavy = await get(base, '/heavy', 'carol');
  assert.equal(heavy.status, 200);
  assert.equal(item(heavy.headers.get('ratelimit')).r, 0);
  assert.equal((await get(base, '/heavy', 'carol')).status, 429);
}

const apps = {
  async express(limiter, prefix) {
    const app = express();
    app.use(forExpress({ limiter, limit: LIMIT, name: 'api', key: (req) => req.get('X-API-Key') && `${prefix}:${req.get('X-API-Key')}`, skip: (req) => req.path === '/health' }));
    const heavy = forExpress({ limiter, limit: LIMIT, name: 'api', cost: 3, key: (req) => `${prefix}:heavy:${req.get('X-API-Key')}` });
    const show = (req, res) => res.set('X-Decision-Remaining', String(req.rateLimit?.remaining ?? '')).send('ok');
    app.get('/', show);
    app.get('/health', show);
    app.get('/heavy', heavy, show);
    return listen((port) => new Promise((resolve) => { const s = app.listen(port, '127.0.0.1', () => resolve(() => new Promise((r) => s.close(r)))); }));
  },
  async fastify(limiter, prefix) {
    const app = Fastify();
    await app.register(forFastify, { limiter, limit: LIMIT, name: 'api', key: (request) => request.headers['x-api-key'] && `${prefix}:${request.headers['x-api-key']}`, skip: (request) => request.url === '/health' });
    const show = async (request, reply) => reply.header('X-Decision-Remaining', String(request.rateLimit?.remaining ?? '')).send('ok');
    app.get('/', show);
    app.get('/health', show);
    // Per route: a plugin of its own (encapsulated) with its own hook.
    await app.register(async (scoped) => {
      await scoped.register(forFastify, { limiter, limit: LIMIT, name: 'api', cost: 3, key: (request) => `${prefix}:heavy:${request.headers['x-api-key']}` });
      scoped.get('/heavy', show);
    });
    return listen(async (port) => { await app.listen({ port, host: '127.0.0.1' }); return () => app.close(); });
  },
  async hono(limiter, prefix) {
    const app = new Hono();
    app.use('*', forHono({ limiter, limit: LIMIT, name: 'api', key: (c) => c.req.header('X-API-Key') && `${prefix}:${c.req.header('X-API-Key')}`, skip: (c) => c.req.path !== '/' }));
    const show = (c) => { c.header('X-Decision-Remaining', String(c.get('rateLimit')?.remaining ?? '')); return c.text('ok'); };
    app.get('/', show);
    app.get('/health', show);
    app.get('/heavy', forHono({ limiter, limit: LIMIT, name: 'api', cost: 3, key: (c) => `${prefix}:heavy:${c.req.header('X-API-Key')}` }), show);
    return serveFetch(app.fetch);
  },
  async fetch(limiter, prefix) {
    const handler = (request) => new Response('ok', { headers: { 'X-Decision-Remaining': '' } });
    const light = limitFetch(async (request) => new Response('ok'), { limiter, limit: LIMIT, name: 'api', key: (request) => request.headers.get('X-API-Key') && `${prefix}:${request.headers.get('X-API-Key')}`, skip: (request) => new URL(request.url).pathname === '/health' });
    const heavy = limitFetch(handler, { limiter, limit: LIMIT, name: 'api', cost: 3, key: (request) => `${prefix}:heavy:${request.headers.get('X-API-Key')}` });
    return serveFetch(async (request, env) => {
      const response = await (new URL(request.url).pathname === '/heavy' ? heavy : light)(request, env);
      // The bare handler has no request object to carry the decision: show it from the header.
      const remaining = response.headers.get('ratelimit')?.match(/r=(\d+)/)?.[1] ?? '';
      const shown = new Response(response.body, response);
      shown.headers.set('X-Decision-Remaining', remaining);
      return shown;
    });
  },
};

async function listen(start) {
  const { freePort } = await import('./helpers.mjs');
  const port = await freePort();
  const close = await start(port);
  return { base: `http://127.0.0.1:${port}`, close };
}

function serveFetch(fetchHandler) {
  return listen((port) => new Promise((resolve) => {
    const server = serve({ fetch: fetchHandler, port, hostname: '127.0.0.1' }, () => resolve(() => new Promise((r) => server.close(r))));
  }));
}

describe('middleware', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer(); // the library (no module needed): the module's answers are the same
    client = await CLIENTS[0].make(server);
  });
  after(async () => {
    await closeClient(client);
    await server?.stop();
  });

  for (const framework of Object.keys(apps)) {
    test(`${framework}: limited per key with draft-10 headers, 429 with Retry-After, per route, onError open and closed`, async () => {
      const limiter = new RateLimiter(client, { timeoutMs: 30000, logger: memoryLogger() });
      const app = await apps[framework](limiter, framework);
      try {
        await plan(app.base, limiter);
      } finally {
        await app.close();
      }
      // A server nobody answers on: open admits without headers, closed answers 503.
      const { createClient } = await import('redis');
      const nowhere = createClient({ url: 'redis://127.0.0.1:9', socket: { reconnectStrategy: false } }).on('error', () => {});
      for (const onError of ['open', 'closed']) {
        const down = new RateLimiter(nowhere, { onError, timeoutMs: 200, logger: memoryLogger() });
        const failing = await apps[framework](down, `${framework}-${onError}`);
        try {
          const r = await get(failing.base, '/', 'dave');
          if (onError === 'open') {
            assert.equal(r.status, 200);
            assert.equal(r.headers.get('ratelimit'), null);
          } else {
            assert.equal(r.status, 503);
            assert.deepEqual(r.body, { error: 'rate limiter unavailable' });
          }
        } finally {
          await failing.close();
        }
      }
    });
  }

  test("express: without a key, req.ip as Express's trust proxy reads it", async () => {
    const limiter = new RateLimiter(client, { timeoutMs: 30000, logger: memoryLogger() });
    const app = express();
    app.set('trust proxy', 'loopback'); // the proxy in front is on this machine: X-Forwarded-For
    app.use(forExpress({ limiter, limit: limit('fixed-window', 2, '1m') }));
    app.get('/', (req, res) => res.send(req.ip));
    const { base, close } = await listen((port) => new Promise((resolve) => { const s = app.listen(port, '127.0.0.1', () => resolve(() => new Promise((r) => s.close(r)))); }));
    const from = (address) => fetch(`${base}/`, { headers: { 'X-Forwarded-For': address } }).then((r) => r.status);
    try {
      await limiter.reset('ip:198.51.100.1', 'ip:198.51.100.2', 'ip:2001:db8:1:200::/56');
      assert.deepEqual([await from('198.51.100.1'), await from('198.51.100.1'), await from('198.51.100.1')], [200, 200, 429]);
      assert.equal(await from('198.51.100.2'), 200, 'another address: its own key');
      // One /56: two addresses of it share a key.
      assert.deepEqual([await from('2001:db8:1:2ff::1'), await from('2001:db8:1:200::99'), await from('2001:db8:1:201::1')], [200, 200, 429]);
      assert.equal((await limiter.peek('ip:198.51.100.1', limit('fixed-window', 2, '1m'), { cost: 0 })).remaining, 0);
    } finally {
      await close();
    }
  });

  test('express-rate-limit with the store: its documented behaviour for a limit of 5', async () => {
    const limiter = new RateLimiter(client, { timeoutMs: 30000, logger: memoryLogger() });
    const make = (prefix, options = {}) => expressRateLimit({
      windowMs: 60 * 1000,
      limit: 5,
      standardHeaders: 'draft-6',
      legacyHeaders: false,
      keyGenerator: () => 'client1',
      store: new RateLimitStore({ limiter, prefix }),
      ...options,
    });
    const app = express();
    app.use('/a', make('erl-a:'));
    app.use('/b', make('erl-b:', { skipFailedRequests: true }));
    app.get('/a', (req, res) => res.send('ok'));
    app.get('/b', (req, res) => res.status(req.query.fail ? 500 : 200).send('b'));
    const { base, close } = await listen((port) => new Promise((resolve) => { const s = app.listen(port, '127.0.0.1', () => resolve(() => new Promise((r) => s.close(r)))); }));
    try {
      for (let i = 1; i <= 5; i += 1) {
        const r = await get(base, '/a');
        assert.equal(r.status, 200);
        assert.equal(r.headers.get('ratelimit-limit'), '5');
        assert.equal(r.headers.get('ratelimit-remaining'), String(5 - i));
        const reset = Number(r.headers.get('ratelimit-reset'));
        assert.ok(reset >= 0 && reset <= 60, `reset ${reset}`);
      }
      const sixth = await get(base, '/a');
      assert.equal(sixth.status, 429);
      assert.equal(sixth.body, 'Too many requests, please try again later.');
      assert.equal(sixth.headers.get('ratelimit-remaining'), '0');
      const retryAfter = Number(sixth.headers.get('retry-after'));
      assert.ok(retryAfter >= 1 && retryAfter <= 60, `Retry-After ${retryAfter}`);
      // The module counted five, not six: a refused hit consumes nothing.
      const stored = await limiter.peek('erl-a:client1', limit('fixed-window', 5, 60000), { cost: 0 });
      assert.deepEqual([stored.limit, stored.remaining], [5, 0]);
      assert.equal((await limiter.peek('erl-a:client1', limit('fixed-window', 6, 60000))).allowed, true, 'five counted, not six');
      // skipFailedRequests: a 500 gives its hit back (decrement: a refund).
      for (let i = 0; i < 3; i += 1) assert.equal((await get(base, '/b?fail=1')).status, 500);
      const ok = await get(base, '/b');
      assert.equal(ok.headers.get('ratelimit-remaining'), '4', 'the failed requests were given back: only this one counts');
    } finally {
      await close();
    }
  });
});

test('the client address: IPv4 as is, IPv4-mapped IPv6 as IPv4, IPv6 by its /56 (or as asked)', async () => {
  const { addressKey } = await import('redis-ratelimit-client');
  assert.equal(addressKey('203.0.113.7'), 'ip:203.0.113.7');
  assert.equal(addressKey('::ffff:203.0.113.7'), 'ip:203.0.113.7');
  assert.equal(addressKey('2001:db8:1234:5678:9abc::1'), 'ip:2001:db8:1234:5600::/56');
  assert.equal(addressKey('2001:DB8:1234:56ff:ffff:ffff:ffff:ffff'), 'ip:2001:db8:1234:5600::/56');
  assert.equal(addressKey('[2001:db8::1%eth0]'), 'ip:2001:db8::/56');
  assert.equal(addressKey('2001:db8:1234:5678:9abc::1', 64), 'ip:2001:db8:1234:5678::/64');
  assert.equal(addressKey('2001:db8:1234:5678:9abc::1', false), 'ip:2001:db8:1234:5678:9abc::1');
  assert.equal(addressKey('::1'), 'ip:::/56');
  assert.equal(addressKey('::1', false), 'ip:::1');
  assert.equal(addressKey('1:0:0:2:0:0:0:3', false), 'ip:1:0:0:2::3');
  assert.equal(addressKey('::ffff:1.2.3.4:5'), 'ip:::ffff:1.2.3.4:5'); // not an address: as given
  assert.throws(() => forExpress({ limiter: { check() {} }, limit: LIMIT, ipv6Subnet: 0 }), /ipv6Subnet must be an integer from 1 to 128 or false, not 0/);
  assert.throws(() => forExpress({ limiter: { check() {} }, limit: LIMIT, key: 'api' }), /key must be a function/);
  assert.throws(() => forExpress({ limiter: { check() {} }, limit: LIMIT, skip: true }), /skip must be a function/);
});
