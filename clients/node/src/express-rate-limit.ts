// A Store for express-rate-limit (v7, v8): `rateLimit({ windowMs, limit, store: new
// RateLimitStore({ limiter }) })`. Counting is the module's (or the library's): atomic, on the
// server's clock, with the window express-rate-limit was configured with.

import { limit as makeLimit, type Algorithm, type Limit } from './types.js';
import type { RateLimiter } from './limiter.js';

/** What express-rate-limit expects back (its `ClientRateLimitInfo`). */
export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

export interface RateLimitStoreOptions {
  limiter: RateLimiter;
  /** Prepended to express-rate-limit's keys (default `'erl:'`). */
  prefix?: string;
  /** The algorithm counting the window (default `'fixed-window'`; `'sliding-window'` and
   * `'sliding-log'` have no edge burst). */
  algorithm?: Extract<Algorithm, 'fixed-window' | 'sliding-window' | 'sliding-log'>;
  /** The limit, where express-rate-limit's `limit` is a function of the request (the store never
   * sees the request). */
  limit?: number;
}

/**
 * express-rate-limit's `Store` on redis-ratelimit. What maps to what:
 * - `windowMs` and `limit` (a number) of express-rate-limit's options: the period and the limit
 *   of one `fixed-window` limit (or `algorithm`); `init` reads them.
 * - `increment(key)`: `check(prefix + key)`. Admitted: `totalHits` = limit - remaining. Refused:
 *   `totalHits` = limit + 1, so express-rate-limit refuses too; unlike its MemoryStore, a refused
 *   hit is not counted (a CHECK that refuses consumes nothing), so a client that keeps retrying
 *   does not push its own reset further.
 * - `resetTime`: now + the limit's `reset_after_ms` (admitted) or `retry_after_ms` (refused), on
 *   the server's clock; fixed windows are aligned to the epoch (MemoryStore starts each client's
 *   window at its first hit).
 * - `decrement(key)` (`skipFailedRequests`, `skipSuccessfulRequests`): `refund(..., 1)`;
 *   `get(key)`: a `peek` of cost 0; `resetKey(key)`: `reset`. `resetAll` is not offered.
 * - Redis unavailable: the limiter's `onError` decides; `'open'` counts the hit as the first
 *   (`totalHits` 1, allowed), `'closed'` rejects with RateLimitUnavailable (express-rate-limit
 *   then answers with its error handling, or lets it pass with `passOnStoreError`).
 */
export class RateLimitStore {
  readonly prefix: string;
  /** Keys live in Redis: shared by every process. */
  readonly localKeys = false;
  private readonly limiter: RateLimiter;
  private readonly algorithm: Algorithm;
  private readonly fixedLimit?: number;
  private spec?: Limit;

  constructor(options: RateLimitStoreOptions) {
    if (!options?.limiter || typeof options.limiter.check !== 'function') throw new TypeError('RateLimitStore needs { limiter }: a RateLimiter');
    this.limiter = options.limiter;
    this.prefix = options.prefix ?? 'erl:';
    this.algorithm = options.algorithm ?? 'fixed-window';
    if (!['fixed-window', 'sliding-window', 'sliding-log'].includes(this.algorithm)) {
      throw new TypeError(`RateLimitStore: algorithm must be fixed-window, sliding-window or sliding-log, not '${this.algorithm}'`);
    }
    this.fixedLimit = options.limit;
  }

  /** Called by express-rate-limit with its options: the window and the limit. */
  init(options: { windowMs: number; limit?: unknown; max?: unknown }): void {
    const configured = options.limit ?? options.max;
    const limitN = this.fixedLimit ?? configured;
    if (typeof limitN !== 'number') {
      throw new TypeError('RateLimitStore: express-rate-limit\'s limit is a function of the request: give the store its own { limit }');
    }
    this.spec = makeLimit(this.algorithm, limitN, options.windowMs);
  }

  private get limit(): Limit {
    if (!this.spec) throw new TypeError('RateLimitStore: init() was not called (pass the store to express-rate-limit)');
    return this.spec;
  }

  async increment(key: string): Promise<ClientRateLimitInfo> {
    const spec = this.limit;
    const d = await this.limiter.check(this.prefix + key, spec);
    if (d.source === 'error') return { totalHits: 1, resetTime: new Date(Date.now() + spec.periodMs) };
    if (d.allowed) return { totalHits: d.limit - d.remaining, resetTime: new Date(Date.now() + d.resetAfterMs) };
    const wait = d.retryAfterMs >= 0 ? d.retryAfterMs : d.resetAfterMs;
    return { totalHits: d.limit + 1, resetTime: new Date(Date.now() + wait) };
  }

  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    const d = await this.limiter.peek(this.prefix + key, this.limit, { cost: 0 });
    if (d.source === 'error' || d.resetAfterMs === 0) return undefined;
    return { totalHits: d.limit - d.remaining, resetTime: new Date(Date.now() + d.resetAfterMs) };
  }

  async decrement(key: string): Promise<void> {
    await this.limiter.refund(this.prefix + key, this.limit, 1);
  }

  async resetKey(key: string): Promise<void> {
    await this.limiter.reset(this.prefix + key);
  }
}
