// The example API: `GET /` limited per X-API-Key, and `POST /jobs`, which also holds a
// concurrency lease while it works and refunds its rate cost when it fails.
//
// Settings: REDIS_URL (default redis://127.0.0.1:6379), RATELIMIT_POLICY (default `examples`),
// RATELIMIT_FAIL (`open` or `closed`, default the config's `fail`), RATELIMIT_CONFIG (default
// ratelimit.json beside this file), PORT (3000), HOST (127.0.0.1). Start it with run.sh.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const express = require('express');
const { createClient } = require('redis');
const { RateLimiter, rateLimit, refundOnError, ceilS } = require('./ratelimit');

const configPath = process.env.RATELIMIT_CONFIG || path.join(__dirname, 'ratelimit.json');
const config = JSON.parse(fs.readFileSync(configPath, 'utf8'));
const libraryPath = path.resolve(path.dirname(configPath), config.functions_library);
const fail = process.env.RATELIMIT_FAIL || config.fail || 'open';
if (!['open', 'closed'].includes(fail)) throw new Error(`RATELIMIT_FAIL must be open or closed, not '${fail}'`);

const client = createClient({
  url: process.env.REDIS_URL || 'redis://127.0.0.1:6379',
  // Calls fail at once while Redis is down (instead of waiting in a queue), so that the limiter
  // fails open or closed; the client reconnects by itself.
  disableOfflineQueue: true,
  socket: { connectTimeout: 1000, reconnectStrategy: (retries) => Math.min(50 * 2 ** retries, 2000) },
});
let lastError = '';
client.on('error', (error) => { // logged once per kind, not at every reconnection attempt
  if (error.message !== lastError) console.warn(`redis: ${error.message}`);
  lastError = error.message;
});
client.on('ready', () => { lastError = ''; });

const limiter = new RateLimiter(client, process.env.RATELIMIT_POLICY || 'examples', config.limit.split(' '), {
  failOpen: fail === 'open',
  library: fs.existsSync(libraryPath) ? fs.readFileSync(libraryPath, 'utf8') : null,
  leases: config.jobs,
});

class JobFailed extends Error {
  constructor() {
    super('job failed');
    Object.assign(this, { status: 500, expose: true });
  }
}

const app = express();
app.disable('x-powered-by');
app.use(express.json());
app.use(rateLimit(limiter, { prefix: config.key_prefix }));

app.get('/', (req, res) => res.type('text/plain').send('ok'));

// Runs a job of `work_ms` (at most 5000) ms holding a lease on `jobs:<api key>`;
// `{"fail": true}` makes it fail with a 500 (and refundOnError gives its rate cost back).
app.post('/jobs', async (req, res) => {
  const job = req.body ?? {};
  const workMs = Math.min(Number(job.work_ms ?? 100), 5000);
  const leaseKey = `${config.jobs.key_prefix}:${req.get('X-API-Key')}`;
  // The lease is released when the function ends, however it ends, before the answer is sent.
  const done = await limiter.lease(leaseKey, async (acquired) => {
    if (acquired && !acquired.allowed) {
      if (acquired.retry_after_ms >= 0) { // an upper bound: leases usually end sooner
        res.set('Retry-After', String(ceilS(acquired.retry_after_ms)));
      }
      return null;
    }
    const startedAtMs = Date.now();
    await new Promise((resolve) => setTimeout(resolve, workMs));
    const finishedAtMs = Date.now();
    if (job.fail) throw new JobFailed();
    return { status: 'done', started_at_ms: startedAtMs, finished_at_ms: finishedAtMs };
  });
  if (done === null) return res.status(429).json({ error: 'too many jobs in flight', limit: config.jobs.limit });
  return res.json(done);
});

app.use(refundOnError(limiter));

async function main() {
  client.connect().catch(() => {}); // reconnects by itself; the limiter says what it does meanwhile
  await new Promise((resolve) => { // up to 1 s for the first connection, then start regardless
    const timer = setTimeout(resolve, 1000);
    client.once('ready', () => { clearTimeout(timer); resolve(); });
  });
  await limiter.start();
  const port = Number(process.env.PORT || 3000);
  const host = process.env.HOST || '127.0.0.1';
  const server = app.listen(port, host, () => console.info(`listening on http://${host}:${port}`));
  const stop = () => server.close(() => client.close().finally(() => process.exit(0)));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main();
