// The values of the package: limits and policies (checked when they are made), the decisions
// every engine answers, policies' definitions, and the errors. No I/O.


/** The six algorithms of the module and of the library. */
export const ALGORITHMS = [
  'token-bucket',
  'leaky-bucket',
  'fixed-window',
  'sliding-window',
  'sliding-log',
  'gcra',
] as const;

/** One of the six algorithms. */
export type Algorithm = (typeof ALGORITHMS)[number];

/** A period as the module takes it: `'1m'`, `'250ms'`, `'1h'`, or a number of ms. */
export type Period = string | number;

/** A limit given inline on every call: `limit('sliding-window', 100, '1m')`. */
export interface Limit {
  readonly kind: 'limit';
  readonly algorithm: Algorithm;
  /** Requests admitted per period. */
  readonly limit: number;
  /** The period as given (sent as is). */
  readonly period: Period;
  /** The period in ms. */
  readonly periodMs: number;
  /** A bucket's capacity (token-bucket, leaky-bucket, gcra); the module's default is `limit`. */
  readonly burst?: number;
  /** A penalty block: who exceeds the limit is refused for this long (the period's syntax). */
  readonly block?: Period;
  /** Batches (`check` only): each process takes units ahead with TAKE and admits from them
   * locally, holding them this long at most (the period's syntax, e.g. `'50ms'`). */
  readonly batch?: Period;
  /** The batch's hold time in ms. */
  readonly batchMs?: number;
  /** The most units one batch takes (default: `limit`). */
  readonly batchMax?: number;
}

/** A limit defined on the server (`RATELIMIT.POLICY SET`), named in calls. */
export interface Policy {
  readonly kind: 'policy';
  readonly name: string;
  /** The inline limit used where policies do not exist (the Functions library), and, with a
   * warning logged once, when the server has no policy of that name. */
  readonly fallback?: Limit;
}

/** What a call names: an inline limit or a policy. */
export type LimitSpec = Limit | Policy;

/** Where a decision comes from: the module's command, the library's function, `onError: 'open'`
 * (admitted, nothing known), the denial cache (a refusal answered again), a batch (units taken
 * beforehand), or the exact in-process limiter of `onError: 'local'`. */
export type Source = 'module' | 'library' | 'error' | 'cache' | 'local' | 'fallback';

/** One decision, whichever engine and protocol answered. */
export interface Decision {
  /** Admitted (and its cost consumed). With `source: 'error'`, admitted because Redis could not
   * answer and `onError` is `'open'`. */
  allowed: boolean;
  /** The units this decision admitted: `take`'s grant (0 to `max`); for `check`, `checkAll` and
   * `acquire` the cost when admitted, else 0; `peek` the cost it would admit, else 0; `refund` 0
   * (its decision is a peek of cost 0); failing open (`source: 'error'`) the cost asked. */
  granted: number;
  /** The most `remaining` can be: a bucket's capacity, else the limit. */
  limit: number;
  /** How much cost could still be admitted now. */
  remaining: number;
  /** 0 when allowed; else the least ms after which the same request is admitted; -1 if it never
   * can (a cost above `limit`). */
  retryAfterMs: number;
  /** ms until the key is as good as new. */
  resetAfterMs: number;
  /** Leaky bucket: ms to wait before processing the admitted request; else 0. */
  delayMs: number;
  source: Source;
  /** A shadow policy admitted what enforcement would have refused. */
  shadowRejected: boolean;
  /** The limit's period in ms (a lease's duration for acquire), 0 when unknown (`source:
   * 'error'` with a policy never fetched): what the `w` of the RateLimit-Policy header says. */
  periodMs: number;
}

/** The decision of `checkAll`: the overall one, and each limit's own, in order. */
export interface MultiDecision extends Decision {
  limits: Decision[];
}

const UNITS_MS: Record<string, number> = { ms: 1, s: 1000, m: 60000, h: 3600000, d: 86400000 };
export const MAX_VALUE = 1e12;
const MAX_PERIOD_MS = 3650 * 86400000;
export const BUCKETS: readonly string[] = ['token-bucket', 'leaky-bucket', 'gcra'];
const POLICY_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

export function integer(what: string, value: unknown, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new TypeError(`${what} must be an integer, not ${describe(value)}`);
  }
  if (value < min || value > max) throw new RangeError(`${what} must be from ${min} to ${max}, not ${value}`);
  return value;
}

export function describe(value: unknown): string {
  return typeof value === 'string' ? `'${value}'` : String(value);
}

/** A period in ms: `'1m'`, `'250ms'`, `'1h'` (units case-insensitive) or a number of ms. */
export function periodMs(period: Period, what = 'period'): number {
  let ms: number;
  if (typeof period === 'number') {
    ms = integer(what, period, 1, MAX_PERIOD_MS);
  } else if (typeof period === 'string') {
    const match = /^(\d+)(ms|s|m|h|d)?$/i.exec(period);
    if (!match) {
      throw new TypeError(`${what} must be an integer of ms or one with a unit ms, s, m, h or d ('250ms', '1s', '15m', '1h', '1d'), not '${period}'`);
    }
    ms = Number(match[1]) * UNITS_MS[(match[2] ?? 'ms').toLowerCase()];
  } else {
    throw new TypeError(`${what} must be a string such as '1m' or a number of ms, not ${describe(period)}`);
  }
  if (ms < 1 || ms > MAX_PERIOD_MS) throw new RangeError(`${what} must be from 1 ms to 3650 days, not ${describe(period)}`);
  return ms;
}

/** An inline limit. A bad algorithm name is a TypeError naming the valid ones; bad numbers and
 * periods are TypeErrors or RangeErrors, before anything is sent. */
export function limit(
  algorithm: Algorithm,
  limit: number,
  period: Period,
  options: { burst?: number; block?: Period; batch?: Period; batchMax?: number } = {},
): Limit {
  if (!(ALGORITHMS as readonly string[]).includes(algorithm)) {
    throw new TypeError(`algorithm must be one of ${ALGORITHMS.join(', ')}, not ${describe(algorithm)}`);
  }
  integer('limit', limit, 1, MAX_VALUE);
  const result: { -readonly [K in keyof Limit]: Limit[K] } = {
    kind: 'limit',
    algorithm,
    limit,
    period,
    periodMs: periodMs(period),
  };
  const { burst, block, batch, batchMax } = options ?? {};
  if (burst !== undefined) {
    if (!BUCKETS.includes(algorithm)) throw new TypeError('burst applies only to token-bucket, leaky-bucket and gcra');
    result.burst = integer('burst', burst, 1, MAX_VALUE);
  }
  if (block !== undefined) {
    periodMs(block, 'block');
    result.block = block;
  }
  if (batch !== undefined) {
    result.batch = batch;
    result.batchMs = periodMs(batch, 'batch');
    result.batchMax = batchMax === undefined ? limit : integer('batchMax', batchMax, 1, MAX_VALUE);
  } else if (batchMax !== undefined) {
    throw new TypeError('batchMax needs batch (the hold time, e.g. { batch: \'50ms\', batchMax: 100 })');
  }
  return Object.freeze(result);
}

/** A policy defined on the server, by name; `fallback` is the inline limit used where policies do
 * not exist (the Functions library) or the server does not have it. */
export function policy(name: string, options: { fallback?: Limit } = {}): Policy {
  if (typeof name !== 'string' || !POLICY_NAME.test(name)) {
    throw new TypeError(`name (a policy's) must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '-' and '.', not ${describe(name)}`);
  }
  const fallback = options?.fallback;
  if (fallback !== undefined && !isLimit(fallback)) throw new TypeError('fallback must be a limit(...)');
  return Object.freeze({ kind: 'policy', name, ...(fallback ? { fallback } : {}) });
}

export function isLimit(value: unknown): value is Limit {
  return typeof value === 'object' && value !== null && (value as Limit).kind === 'limit';
}

export function isPolicy(value: unknown): value is Policy {
  return typeof value === 'object' && value !== null && (value as Policy).kind === 'policy';
}

export function checkSpec(spec: unknown, what = 'limit'): LimitSpec {
  if (!isLimit(spec) && !isPolicy(spec)) throw new TypeError(`${what} must be a limit(...) or a policy(...)`);
  return spec;
}

export function checkKey(key: unknown, what = 'key'): string {
  if (typeof key !== 'string' || key === '') throw new TypeError(`${what} must be a non-empty string`);
  return key;
}

/** A number of units (a cost, `take`'s max, `acquire`'s n): an integer from `min` to 10^12; the
 * error names `what`, the caller's argument. */
export function checkCost(cost: unknown, min = 0, what = 'cost'): number {
  return integer(what, cost, min, MAX_VALUE);
}

/** What a limiter has done, for scripts and benchmarks: `rl.stats`. */
export interface Stats {
  /** Commands sent to Redis (each one of a pipeline counts). */
  commands: number;
  /** Decisions answered, by `source`. */
  decisions: Record<Source, number>;
  /** Units batches took from Redis (TAKE), admitted locally, and gave back (REFUND). */
  batchTaken: number;
  batchUsed: number;
  batchRefunded: number;
  /** Units this limiter's batches hold now: taken, not yet admitted or given back. */
  held: number;
  /** Replies that arrived after their call's timeout fired (what they took was given back). */
  lateReplies: number;
}

/** The options of a call: its cost (default 1), and `at`, a time in ms since the Unix epoch to
 * evaluate it at instead of the server's clock (replays and tests; applications leave it out). */
export interface CallOptions {
  cost?: number;
  at?: number;
}

/** A policy's definition as `RATELIMIT.POLICY GET` answers it. */
export interface PolicyDefinition {
  name: string;
  algorithm: string;
  limit: number;
  /** Rate limits: the period; concurrency policies: undefined (see `leaseMs`). */
  periodMs?: number;
  burst?: number;
  /** A concurrency policy's lease duration. */
  leaseMs?: number;
  mode: 'enforce' | 'shadow';
  blockMs: number;
  /** The definition as an inline limit (rate limits only). */
  limitSpec?: Limit;
}

/** The base of this package's errors. */
export class RateLimitError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** A request refused (`withLease`, or middleware that throws): `decision` says why and until when. */
export class RateLimited extends RateLimitError {
  readonly decision: Decision;
  constructor(decision: Decision, message = `rate limited: retry in ${decision.retryAfterMs} ms`) {
    super(message);
    this.decision = decision;
  }
}

/** Redis is down, refuses, did not answer within `timeoutMs`, or the breaker is open, and
 * `onError` is `'closed'` (or the call has no decision to fall back to). `cause` holds the
 * client's error where there was one. */
export class RateLimitUnavailable extends RateLimitError {}
