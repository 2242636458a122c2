// Rate limiting for Express with redis-ratelimit: the part to lift as is.
//
// - RateLimiter decides requests: `RATELIMIT.CHECK <key> POLICY <name>` with the module, or, on a
//   server without it (`unknown command`), the Functions library's `FCALL ratelimit_check` with
//   the inline limit of the config (the library has no policies). It defines the policy when it
//   is missing, follows its definition (shadow mode, period) and fails open or closed when Redis
//   is unreachable.
// - rateLimit() is the middleware: per X-API-Key, 401 without one (not counted), 429 with
//   Retry-After when rejected, and the IETF draft's RateLimit-Policy / RateLimit on every limited
//   answer, derived from the reply as the README derives them (httpAnswer).
// - refundOnError() is the error handler that gives a failed request's cost back
//   (`RATELIMIT.REFUND`) before answering 500.
// - limiter.lease() holds a concurrency lease (`RATELIMIT.ACQUIRE` / `RATELIMIT.RELEASE`) while
//   a function runs.
'use strict';

const { randomUUID } = require('node:crypto');
const { ErrorReply } = require('redis');

const FIELDS = ['allowed', 'limit', 'remaining', 'retry_after_ms', 'reset_after_ms', 'delay_ms'];
const UNITS_MS = { ms: 1, s: 1000, m: 60000, h: 3600000, d: 86400000 };
// How often the policy's definition is read again: a POLICY SET rolls out without a deploy.
const POLICY_REFRESH_MS = 10000;

// A decision as an object of six numbers, from whatever the engine and protocol answered: the
// module under RESP3 (a map, allowed a boolean), RESP2 or the library (six integers).
function decision(reply) {
  if (reply instanceof Map) reply = Object.fromEntries(reply);
  const values = Array.isArray(reply) ? reply : FIELDS.map((field) => reply[field]);
  return Object.fromEntries(FIELDS.map((field, i) => [field, Number(values[i])]));
}

const ceilS = (ms) => Math.ceil(ms / 1000);

// The HTTP status and rate-limit headers for one decision (d: what decision() returns).
function httpAnswer(d, periodS, policy = 'default') {
  const headers = { 'RateLimit-Policy': `"${policy}";q=${d.limit};w=${periodS}` };
  if (d.allowed) {
    headers.RateLimit = `"${policy}";r=${d.remaining};t=${ceilS(d.reset_after_ms)}`;
    return [200, headers];
  }
  if (d.retry_after_ms >= 0) { // -1: this cost can never pass; send no Retry-After
    headers['Retry-After'] = String(ceilS(d.retry_after_ms));
    headers.RateLimit = `"${policy}";r=${d.remaining};t=${ceilS(d.retry_after_ms)}`;
  }
  return [429, headers];
}

// A period in the module's syntax (250ms, 10s, 1m, or bare ms) in ms.
function periodMs(text) {
  const match = /^(\d+)(ms|s|m|h|d)?$/i.exec(String(text).trim());
  if (!match) throw new Error(`not a period: ${text}`);
  return Number(match[1]) * UNITS_MS[(match[2] ?? 'ms').toLowerCase()];
}

// A field/value reply (a flat array under RESP2, a map under RESP3) as an object.
function pairs(reply) {
  if (reply instanceof Map) return Object.fromEntries(reply);
  if (!Array.isArray(reply)) return reply;
  const object = {};
  for (let i = 0; i < reply.length; i += 2) object[String(reply[i])] = reply[i + 1];
  return object;
}

// Redis is not there (offline, refused, closed), as opposed to an error reply.
const unreachable = (error) => !(error instanceof ErrorReply);

class Unavailable extends Error {}

// One named limit, decided by the module through its policy, or by the Functions library with the
// same limit inline. client: a connected-or-connecting node-redis client (with
// disableOfflineQueue, so that calls fail at once while Redis is down); policy: its name; limit:
// its definition as the module's words (['sliding-window', '5', '10s']), used to define it when it
// is missing and inline by the library; library: the text of
// lua-reference/functions/ratelimit.lua, loaded when needed; leases: { limit, lease } for lease().
class RateLimiter {
  constructor(client, policy, limit, { failOpen = true, library = null, leases = null, log = console } = {}) {
    Object.assign(this, { client, policy, failOpen, library, leases, log });
    this.limit = limit.map(String);
    this.engine = null; // 'module' or 'functions', once Redis has answered
    this.mode = 'enforce';
    this.periodS = ceilS(periodMs(this.limit[2]));
    this.peekSpec = this.limit; // the policy's definition inline, to PEEK in shadow mode
    this.fetchedAt = 0;
  }

  failing() {
    return this.failOpen ? 'open (admitted, no headers)' : 'closed (503)';
  }

  // Finds the engine, defines the policy if it is missing, and logs what it did. Never fails on
  // an unreachable Redis: it says so, and tries again at the next request.
  async start() {
    this.log.info(`ratelimit: when Redis is unreachable, requests fail ${this.failing()}`);
    try {
      await this.detect();
    } catch (error) {
      if (!unreachable(error)) throw error;
      this.log.warn(`ratelimit: Redis is unreachable (${error.message}): failing ${this.failing()}`);
    }
  }

  async detect() {
    let reply;
    try {
      reply = await this.client.sendCommand(['RATELIMIT.POLICY', 'GET', this.policy]);
    } catch (error) {
      if (!(error instanceof ErrorReply) || !/unknown command/i.test(error.message)) throw error;
      return this.useLibrary();
    }
    if (reply === null) {
      await this.client.sendCommand(['RATELIMIT.POLICY', 'SET', this.policy, ...this.limit]);
      this.log.info(`ratelimit: policy '${this.policy}' did not exist: defined it as ${this.limit.join(' ')}`);
      reply = await this.client.sendCommand(['RATELIMIT.POLICY', 'GET', this.policy]);
    } else {
      this.log.info(`ratelimit: using the existing policy '${this.policy}'`);
    }
    this.follow(pairs(reply));
    if (this.engine !== 'module') {
      this.engine = 'module';
      this.log.info(`ratelimit: engine: the module (RATELIMIT.CHECK key POLICY ${this.policy}), `
        + `${this.peekSpec.join(' ')}, mode ${this.mode}`);
    }
  }

  // Takes the policy's definition as the server has it (POLICY GET's fields).
  follow(definition) {
    const algorithm = String(definition.algorithm);
    const spec = [algorithm, String(definition.limit), `${definition.period_ms}ms`];
    if (['token-bucket', 'leaky-bucket', 'gcra'].includes(algorithm)) spec.push('BURST', String(definition.burst));
    if (Number(definition.block_ms ?? 0) > 0) spec.push('BLOCK', `${definition.block_ms}ms`);
    const mode = String(definition.mode);
    if (mode !== this.mode) this.log.info(`ratelimit: policy '${this.policy}' is in ${mode} mode`);
    this.mode = mode;
    this.periodS = ceilS(Number(definition.period_ms));
    this.peekSpec = spec;
    this.fetchedAt = Date.now();
  }

  async useLibrary() {
    const loaded = await this.client.sendCommand(['FUNCTION', 'LIST', 'LIBRARYNAME', 'ratelimit']);
    if (loaded.length === 0) {
      if (this.library === null) throw new Error('the module is not loaded and neither is the ratelimit library');
      try {
        await this.client.sendCommand(['FUNCTION', 'LOAD', this.library]);
        this.log.info("ratelimit: loaded the Functions library 'ratelimit'");
      } catch (error) {
        if (!/already exists/.test(error.message)) throw error; // another app loaded it meanwhile
      }
    }
    this.engine = 'functions';
    this.log.info('ratelimit: the module is not loaded: engine: the Functions library '
      + `(FCALL ratelimit_check 1 fn:key ${this.limit.join(' ')}; no policies, so no shadow mode)`);
  }

  async ready() {
    if (this.engine === null) return this.detect();
    if (this.engine === 'module' && Date.now() - this.fetchedAt > POLICY_REFRESH_MS) {
      const reply = await this.client.sendCommand(['RATELIMIT.POLICY', 'GET', this.policy]);
      if (reply === null) return this.detect(); // deleted meanwhile: define it again
      this.follow(pairs(reply));
    }
  }

  // The decision for one request of `cost` on `key`, or null when Redis is unreachable and the
  // limiter fails open (Unavailable is thrown when it fails closed).
  async check(key, cost = 1) {
    try {
      await this.ready();
      try {
        return await this.decide(key, cost);
      } catch (error) {
        if (!(error instanceof ErrorReply) || !/no such policy/.test(error.message)) throw error;
        await this.detect(); // deleted between two refreshes
        return await this.decide(key, cost);
      }
    } catch (error) {
      if (!unreachable(error)) throw error;
      return this.unreachable(error);
    }
  }

  async decide(key, cost) {
    if (this.engine === 'functions') {
      const fcall = ['FCALL', 'ratelimit_check', '1', `fn:${key}`, ...this.limit, 'COST', String(cost)];
      return decision(await this.client.sendCommand(fcall));
    }
    const check = ['RATELIMIT.CHECK', key, 'POLICY', this.policy, 'COST', String(cost)];
    if (this.mode !== 'shadow') return decision(await this.client.sendCommand(check));
    // Shadow mode answers a would-be rejection as admitted: what enforcement would answer is a
    // PEEK of the same definition inline, in one transaction with the CHECK.
    const [enforced, answered] = (await this.client.multi()
      .addCommand(['RATELIMIT.PEEK', key, ...this.peekSpec, 'COST', String(cost)])
      .addCommand(check)
      .exec()).map(decision);
    if (!enforced.allowed) {
      this.log.warn(`ratelimit: shadow policy '${this.policy}' would have rejected ${key} `
        + `(retry in ${enforced.retry_after_ms} ms); admitted`);
    }
    return answered;
  }

  // Gives back `cost` that an admitted request consumed (it was not served); the decision right
  // after, or null if Redis is unreachable.
  async refund(key, cost = 1) {
    const command = this.engine === 'functions'
      ? ['FCALL', 'ratelimit_refund', '1', `fn:${key}`, ...this.limit, 'COST', String(cost)]
      : ['RATELIMIT.REFUND', key, 'POLICY', this.policy, 'COST', String(cost)];
    try {
      return decision(await this.client.sendCommand(command));
    } catch (error) {
      if (!unreachable(error)) throw error;
      this.log.warn(`ratelimit: refund of ${key} not done: ${error.message}`);
      return null;
    }
  }

  unreachable(error) {
    this.log.warn(`ratelimit: Redis is unreachable (${error.message}): failing ${this.failing()}`);
    if (this.failOpen) return null;
    throw new Unavailable(error.message);
  }

  // Holds a concurrency lease on `key` while `work(acquired)` runs: `acquired` is the ACQUIRE
  // decision (look at its `allowed`; null when failing open). The lease is released when `work`
  // ends, however it ends; a lease whose holder dies expires by itself after `leases.lease`.
  async lease(key, work, cost = 1) {
    const id = randomUUID();
    const [limit, duration] = [String(this.leases.limit), String(this.leases.lease)];
    const functions = this.engine === 'functions';
    let acquired;
    try {
      acquired = decision(await this.client.sendCommand(functions
        ? ['FCALL', 'ratelimit_acquire', '1', `fn:${key}`, limit, duration, 'ID', id, 'COST', String(cost)]
        : ['RATELIMIT.ACQUIRE', key, limit, duration, 'ID', id, 'COST', String(cost)]));
    } catch (error) {
      if (!unreachable(error)) throw error;
      acquired = this.unreachable(error);
    }
    try {
      return await work(acquired);
    } finally {
      if (acquired?.allowed) {
        try {
          await this.client.sendCommand(functions
            ? ['FCALL', 'ratelimit_release', '1', `fn:${key}`, 'ID', id]
            : ['RATELIMIT.RELEASE', key, 'ID', id]);
        } catch (error) { // the lease expires by itself
          this.log.warn(`ratelimit: release of ${key} not done: ${error.message}`);
        }
      }
    }
  }
}

// The middleware: limits each request per X-API-Key (the key `<prefix>:<api key>`), stores the
// decision in res.locals.ratelimit and sets the rate-limit headers.
function rateLimit(limiter, { prefix = 'api' } = {}) {
  return async (req, res, next) => {
    const apiKey = req.get('X-API-Key');
    if (!apiKey) return res.status(401).json({ error: 'missing X-API-Key' });
    const key = `${prefix}:${apiKey}`;
    let d;
    try {
      d = await limiter.check(key);
    } catch (error) {
      if (error instanceof Unavailable) return res.status(503).json({ error: 'rate limiter unavailable' });
      throw error;
    }
    res.locals.ratelimit = { key, decision: d };
    if (d === null) return next(); // failing open: no decision, no headers
    const [status, headers] = httpAnswer(d, limiter.periodS, limiter.policy);
    res.set(headers);
    if (status === 429) {
      const body = { error: 'rate limited', policy: limiter.policy, retry_after_ms: d.retry_after_ms };
      return res.status(429).json(body);
    }
    return next();
  };
}

// The error handler, registered last: a request that failed was not served, so its cost goes back
// before the 500 is sent (its headers then show the refund).
function refundOnError(limiter) {
  return async (error, req, res, next) => {
    if (error instanceof Unavailable && !res.headersSent) { // a lease, failing closed
      return res.status(503).json({ error: 'rate limiter unavailable' });
    }
    const status = error.status ?? error.statusCode ?? 500;
    if (res.headersSent || status < 500) return next(error); // a 4xx: Express answers it
    limiter.log.error(error.stack ?? error);
    const limited = res.locals.ratelimit;
    if (limited?.decision) {
      const refunded = await limiter.refund(limited.key);
      if (refunded) res.set(httpAnswer(refunded, limiter.periodS, limiter.policy)[1]);
    }
    res.status(status).json({ error: error.expose ? error.message : 'internal error' });
  };
}

module.exports = { RateLimiter, Unavailable, rateLimit, refundOnError, decision, httpAnswer, periodMs, ceilS };
