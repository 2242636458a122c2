// The example API: `GET /` limited per X-API-Key (per client address without one), and
// `POST /jobs`, which also holds a concurrency lease while it works and refunds its rate cost
// when it fails. The limiting is
// redis-ratelimit-client's (clients/node): its RateLimiter (the module, else the Functions
// library it loads), its Express middleware and its headers.
//
// Settings: REDIS_URL (default redis://127.0.0.1:6379), RATELIMIT_POLICY (default `examples`),
// RATELIMIT_FAIL (`open` or `closed`, default the config's `fail`), RATELIMIT_CONFIG (default
// ratelimit.json beside this file), PORT (3000), HOST (127.0.0.1). Start it with run.sh.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const express = require('express');
const { createClient } = require('redis');
const { RateLimiter, RateLimited, RateLimitError, RateLimitUnavailable, addressKey, limit, policy, rateLimitHeaders } = require('redis-ratelimit-client');
const { rateLimit } = require('redis-ratelimit-client/express');

const configPath = process.env.RATELIMIT_CONFIG || path.join(__dirname, 'ratelimit.json');
const config = JSON.parse(fs.readFileSync(configPath, 'utf8'));
const fail = process.env.RATELIMIT_FAIL || config.fail || 'open';
if (!['open', 'closed'].includes(fail)) throw new Error(`RATELIMIT_FAIL must be open or closed, not '${fail}'`);
const policyName = process.env.RATELIMIT_POLICY || 'examples';

// The config's limit in the module's words (`sliding-window 5 10s [BURST n] [BLOCK d]`): the
// policy's definition when the server has none, and the fallback where there are no policies.
function parseLimit(text) {
  const [algorithm, count, period, ...options] = text.trim().split(/\s+/);
  const named = {};
  for (let i = 0; i < options.length; i += 2) named[options[i].toLowerCase()] = options[i + 1];
  return limit(algorithm, Number(count), /^\d+$/.test(period) ? Number(period) : period, {
    ...(named.burst ? { burst: Number(named.burst) } : {}),
    ...(named.block ? { block: named.block } : {}),
  });
}
const inline = parseLimit(config.limit);
const apiPolicy = policy(policyName, { fallback: inline });

const client = createClient({
  url: process.env.REDIS_URL || 'redis://127.0.0.1:6379',
  // Calls fail at once while Redis is down (instead of waiting in a queue to run later), so that
  // the limiter fails open or closed at once; the client reconnects by itself.
  disableOfflineQueue: true,
  socket: { connectTimeout: 1000, reconnectStrategy: (retries) => Math.min(50 * 2 ** retries, 2000) },
});
let lastError = '';
client.on('error', (error) => { // logged once per kind, not at every reconnection attempt
  if (error.message !== lastError) console.warn(`redis: ${error.message}`);
  lastError = error.message;
});
client.on('ready', () => { lastError = ''; });

const limiter = new RateLimiter(client, { onError: fail, timeoutMs: 1000 });
const failing = fail === 'open' ? 'open (admitted, no headers)' : 'closed (503)';

// Finds the engine and defines the policy if the server has none; says what it found. Never fails
// on an unreachable Redis: the limiter then fails open or closed at each request.
async function start() {
  console.info(`ratelimit: when Redis is unreachable, requests fail ${failing}`);
  try {
    let definition = await limiter.policies.get(policyName);
    if (definition === null) {
      await limiter.policies.set(policyName, inline);
      console.info(`ratelimit: policy '${policyName}' did not exist: defined it as ${config.limit}`);
      definition = await limiter.policies.get(policyName);
    } else {
      console.info(`ratelimit: using the existing policy '${policyName}'`);
    }
    const { algorithm, limit: count, periodMs, mode } = definition;
    console.info(`ratelimit: engine: the module (RATELIMIT.CHECK key POLICY ${policyName}), ${algorithm} ${count} ${periodMs}ms, mode ${mode}`);
  } catch (error) {
    if (error instanceof RateLimitUnavailable) {
      console.warn(`ratelimit: Redis is unreachable (${error.message}): failing ${failing}`);
    } else if (error instanceof RateLimitError) { // no module: the library, with the config's limit
      await limiter.check(`${config.key_prefix}:startup`, apiPolicy, { cost: 0 });
    } else {
      throw error;
    }
  }
}

// Who a request counts as: its API key, else its client address (`ip:<req.ip>`, as the
// middleware does by itself; Express's `trust proxy` setting decides which address that is).
const caller = (req) => (req.get('X-API-Key') ? `${config.key_prefix}:${req.get('X-API-Key')}` : addressKey(req.ip));

const app = express();
app.disable('x-powered-by');
app.use(express.json());
// The limit, per caller: a request without a key is limited by its address.
app.use(rateLimit({ limiter, limit: apiPolicy, key: caller }));
// Shadow mode: admitted, and said in the log.
app.use((req, res, next) => {
  if (req.rateLimit?.shadowRejected) {
    console.warn(`ratelimit: shadow policy '${policyName}' would have rejected ${caller(req)}; admitted`);
  }
  next();
});

app.get('/', (req, res) => res.type('text/plain').send('ok'));

class JobFailed extends Error {
  constructor() {
    super('job failed');
    Object.assign(this, { status: 500, expose: true });
  }
}

// Runs a job of `work_ms` (at most 5000) ms holding a lease on `jobs:<api key>` (without a key,
// `jobs:ip:<address>`);
// `{"fail": true}` makes it fail with a 500 (and the error handler gives its rate cost back).
app.post('/jobs', async (req, res) => {
  const job = req.body ?? {};
  const workMs = Math.min(Number(job.work_ms ?? 100), 5000);
  const leaseKey = `${config.jobs.key_prefix}:${req.get('X-API-Key') || addressKey(req.ip)}`;
  try {
    // The lease is released when the function ends, however it ends, before the answer is sent.
    const done = await limiter.withLease(leaseKey, config.jobs.limit, config.jobs.lease, async () => {
      const startedAtMs = Date.now();
      await new Promise((resolve) => setTimeout(resolve, workMs));
      const finishedAtMs = Date.now();
      if (job.fail) throw new JobFailed();
      return { status: 'done', started_at_ms: startedAtMs, finished_at_ms: finishedAtMs };
    });
    return res.json(done);
  } catch (error) {
    if (!(error instanceof RateLimited)) throw error;
    if (error.decision.retryAfterMs >= 0) { // an upper bound: leases usually end sooner
      res.set('Retry-After', String(Math.ceil(error.decision.retryAfterMs / 1000)));
    }
    return res.status(429).json({ error: 'too many jobs in flight', limit: config.jobs.limit });
  }
});

// The error handler, registered last: a request that failed was not served, so its cost goes back
// before the 500 is sent (its headers then show the refund).
app.use(async (error, req, res, next) => {
  if (error instanceof RateLimitUnavailable && !res.headersSent) { // a lease, failing closed
    return res.status(503).json({ error: 'rate limiter unavailable' });
  }
  const status = error.status ?? error.statusCode ?? 500;
  if (res.headersSent || status < 500) return next(error); // a 4xx: Express answers it
  console.error(error.stack ?? error);
  if (req.rateLimit && req.rateLimit.source !== 'error') {
    try {
      const refunded = await limiter.refund(caller(req), apiPolicy, 1);
      if (refunded.source !== 'error') res.set(rateLimitHeaders(refunded, policyName));
    } catch (refundError) {
      console.warn(`ratelimit: refund not done: ${refundError.message}`);
    }
  }
  return res.status(status).json({ error: error.expose ? error.message : 'internal error' });
});

async function main() {
  client.connect().catch(() => {}); // reconnects by itself; the limiter says what it does meanwhile
  await new Promise((resolve) => { // up to 1 s for the first connection, then start regardless
    const timer = setTimeout(resolve, 1000);
    client.once('ready', () => { clearTimeout(timer); resolve(); });
  });
  await start();
  const port = Number(process.env.PORT || 3000);
  const host = process.env.HOST || '127.0.0.1';
  const server = app.listen(port, host, () => console.info(`listening on http://${host}:${port}`));
  const stop = () => server.close(() => client.close().finally(() => process.exit(0)));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main();
