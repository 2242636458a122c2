// What the middleware of every framework shares: the options, the decision for a request, and
// the answer (status, draft-ietf-httpapi-ratelimit-headers-10 fields, body). No framework here.

import { ceilSeconds, checkSpec, isPolicy, type Decision, type LimitSpec } from './core.js';
import { RateLimitUnavailable } from './errors.js';
import type { RateLimiter } from './limiter.js';

/** The options of every middleware; `Req` is the framework's own request object. */
export interface RateLimitOptions<Req> {
  limiter: RateLimiter;
  /** The limit: inline, or a policy (with a fallback for servers without the module). */
  limit: LimitSpec;
  /** The key to count the request under; undefined (or '') leaves it unlimited and uncounted. */
  key: (req: Req) => string | undefined | null | Promise<string | undefined | null>;
  /** The policy's name in the headers (default: the policy's own name, else `'default'`). */
  name?: string;
  /** The request's cost (default 1), or a function of the request. */
  cost?: number | ((req: Req) => number | Promise<number>);
}

/** What a middleware does with a request. */
export type Outcome =
  | { kind: 'skip' }
  | { kind: 'unavailable'; status: 503; body: { error: string } }
  | { kind: 'answer'; decision: Decision; status: 200 | 429; headers: Record<string, string>; body?: Record<string, unknown> };

/** Checks the options once, when the middleware is made: a mistake is a TypeError at start-up. */
export function checkOptions<Req>(options: RateLimitOptions<Req>): Required<Pick<RateLimitOptions<Req>, 'limiter' | 'limit' | 'key'>> & {
  name: string;
  cost: (req: Req) => number | Promise<number>;
} {
  if (!options || typeof options !== 'object') throw new TypeError('rateLimit needs { limiter, limit, key }');
  const { limiter, key, cost = 1 } = options;
  if (!limiter || typeof (limiter as RateLimiter).check !== 'function') throw new TypeError('rateLimit needs { limiter }: a RateLimiter');
  const spec = checkSpec(options.limit, 'rateLimit: limit');
  if (typeof key !== 'function') throw new TypeError('rateLimit needs { key: (req) => string | undefined }');
  if (typeof cost !== 'number' && typeof cost !== 'function') throw new TypeError('rateLimit: cost must be a number or a function of the request');
  const name = options.name ?? (isPolicy(spec) ? spec.name : 'default');
  if (typeof name !== 'string' || !/^[A-Za-z0-9_.-]+$/.test(name)) {
    throw new TypeError(`rateLimit: name must be a token of A-Z, a-z, 0-9, '_', '-' and '.', not '${name}'`);
  }
  return { limiter, limit: spec, key, name, cost: typeof cost === 'function' ? cost : () => cost };
}

/** The RateLimit-Policy, RateLimit and (on a refusal) Retry-After fields of a decision, as the
 * README derives them: `q` the limit, `w` the period in seconds, `r` remaining, `t` the seconds
 * until the limit is as good as new (admitted) or until a retry is admitted (refused). */
export function rateLimitHeaders(d: Decision, name = 'default'): Record<string, string> {
  const headers: Record<string, string> = {};
  const policy = [`"${name}"`, `q=${d.limit}`];
  if (d.periodMs > 0) policy.push(`w=${ceilSeconds(d.periodMs)}`);
  headers['RateLimit-Policy'] = policy.join(';');
  const wait = d.allowed ? d.resetAfterMs : d.retryAfterMs;
  if (wait >= 0) headers.RateLimit = `"${name}";r=${d.remaining};t=${ceilSeconds(wait)}`;
  if (!d.allowed && d.retryAfterMs >= 0) headers['Retry-After'] = String(ceilSeconds(d.retryAfterMs));
  return headers;
}

/** Decides a request: skip (no key), unavailable (onError closed), or the answer to give. */
export async function decideRequest<Req>(options: ReturnType<typeof checkOptions<Req>>, req: Req): Promise<Outcome> {
  const key = await options.key(req);
  if (key === undefined || key === null || key === '') return { kind: 'skip' };
  const cost = await options.cost(req);
  let d: Decision;
  try {
    d = await options.limiter.check(key, options.limit, { cost });
  } catch (error) {
    if (error instanceof RateLimitUnavailable) return { kind: 'unavailable', status: 503, body: { error: 'rate limiter unavailable' } };
    throw error;
  }
  if (d.source === 'error') return { kind: 'answer', decision: d, status: 200, headers: {} }; // failing open: nothing known
  const headers = rateLimitHeaders(d, options.name);
  if (d.allowed) return { kind: 'answer', decision: d, status: 200, headers };
  return {
    kind: 'answer',
    decision: d,
    status: 429,
    headers,
    body: { error: 'rate limited', policy: options.name, retry_after_ms: d.retryAfterMs },
  };
}
