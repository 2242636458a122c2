// The core: limits and policies as values, the arguments of each command, and the replies (RESP2
// arrays, RESP3 maps, the library's arrays) read into typed decisions. No I/O: the limiter sends
// what this builds and hands back what this reads.

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
const MAX_VALUE = 1e12;
const MAX_PERIOD_MS = 3650 * 86400000;
const BUCKETS: readonly string[] = ['token-bucket', 'leaky-bucket', 'gcra'];
const POLICY_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

function integer(what: string, value: unknown, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new TypeError(`${what} must be an integer, not ${describe(value)}`);
  }
  if (value < min || value > max) throw new RangeError(`${what} must be from ${min} to ${max}, not ${value}`);
  return value;
}

function describe(value: unknown): string {
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

/** `AT unix-ms` when given: evaluate at that time instead of the server's clock (replays and
 * tests; applications leave it out). */
export function atArgs(at: unknown): string[] {
  if (at === undefined) return [];
  return ['AT', String(integer('at', at, 0, 2 ** 53 - 1))];
}

/** The arguments of an inline limit, after the key: `algorithm limit period [BURST c] [BLOCK d]`. */
export function limitArgs(lim: Limit, withBlock = true): string[] {
  const args = [lim.algorithm, String(lim.limit), String(lim.period)];
  if (lim.burst !== undefined) args.push('BURST', String(lim.burst));
  if (withBlock && lim.block !== undefined) args.push('BLOCK', String(lim.block));
  return args;
}

/** The arguments of a spec for the module: the limit's, or `POLICY name`. */
export function specArgs(spec: LimitSpec): string[] {
  return isPolicy(spec) ? ['POLICY', spec.name] : limitArgs(spec);
}

function toNumber(value: unknown): number {
  if (typeof value === 'boolean') return value ? 1 : 0;
  if (typeof value === 'number') return value;
  if (typeof value === 'bigint') return Number(value);
  if (typeof value === 'string') return Number(value);
  if (value instanceof Uint8Array) return Number(new TextDecoder().decode(value));
  throw new TypeError(`unexpected reply element ${describe(value)}`);
}

function text(value: unknown): string {
  if (typeof value === 'string') return value;
  if (value instanceof Uint8Array) return new TextDecoder().decode(value);
  return String(value);
}

/** A field/value reply (a flat array under RESP2, a Map or an object under RESP3) as an object. */
export function pairs(reply: unknown): Record<string, unknown> {
  if (reply instanceof Map) return Object.fromEntries([...reply].map(([k, v]) => [text(k), v]));
  if (Array.isArray(reply)) {
    const object: Record<string, unknown> = {};
    for (let i = 0; i + 1 < reply.length; i += 2) object[text(reply[i])] = reply[i + 1];
    return object;
  }
  if (typeof reply === 'object' && reply !== null) return reply as Record<string, unknown>;
  throw new TypeError(`unexpected reply ${describe(reply)}`);
}

/** A RESP3 map that the client flattened into `[field, value, ...]` (ioredis 6). */
function flatMap(reply: unknown): boolean {
  if (!Array.isArray(reply) || reply.length === 0) return false;
  const first = reply[0];
  if (typeof first === 'number' || typeof first === 'bigint' || typeof first === 'boolean') return false;
  const name = text(first);
  return name === 'allowed' || name === 'granted';
}

/** One decision from a reply of cost `cost` (`granted` when admitted): six integers (RESP2, the
 * library) or a map (RESP3: a Map, an object, or a flattened array). With `cost` null, the reply
 * is TAKE's: its first field (`granted` under RESP3) is the grant. */
export function decision(reply: unknown, source: Source, periodMs: number, cost: number | null = 0): Decision {
  let v0: unknown, v1: unknown, v2: unknown, v3: unknown, v4: unknown, v5: unknown;
  if (Array.isArray(reply) && !flatMap(reply)) {
    [v0, v1, v2, v3, v4, v5] = reply;
  } else {
    const first = cost === null ? 'granted' : 'allowed';
    if (reply instanceof Map) {
      [v0, v1, v2, v3, v4, v5] = [reply.get(first), reply.get('limit'), reply.get('remaining'), reply.get('retry_after_ms'), reply.get('reset_after_ms'), reply.get('delay_ms')];
    }
    if (v0 === undefined) {
      const named = pairs(reply);
      [v0, v1, v2, v3, v4, v5] = [named[first], named.limit, named.remaining, named.retry_after_ms, named.reset_after_ms, named.delay_ms];
    }
  }
  if (v0 == null || v1 == null || v2 == null || v3 == null || v4 == null || v5 == null) {
    throw new TypeError(`unexpected decision reply ${JSON.stringify(reply)}`);
  }
  const head = toNumber(v0);
  const allowed = cost === null ? head > 0 : head === 1;
  return {
    allowed,
    granted: cost === null ? head : allowed ? cost : 0,
    limit: toNumber(v1),
    remaining: toNumber(v2),
    retryAfterMs: toNumber(v3),
    resetAfterMs: toNumber(v4),
    delayMs: toNumber(v5),
    source,
    shadowRejected: false,
    periodMs,
  };
}

/** CHECKALL's reply: RESP2 `[overall, ...limits]`, RESP3 the overall map with `limits`. */
export function multiDecision(reply: unknown, source: Source, periodsMs: number[], cost = 0): MultiDecision {
  let overall: unknown;
  let limits: unknown[];
  if (Array.isArray(reply) && !flatMap(reply)) {
    [overall, ...limits] = reply;
  } else {
    const named = pairs(reply);
    overall = named;
    limits = named.limits as unknown[];
  }
  if (!Array.isArray(limits) || limits.length !== periodsMs.length) {
    throw new TypeError(`unexpected CHECKALL reply ${JSON.stringify(reply)}`);
  }
  const each = limits.map((r, i) => decision(r, source, periodsMs[i], cost));
  const first = decision(overall, source, 0, cost);
  // The overall limit is the first limit showing the least remaining: its period goes with it.
  const shown = each.find((d) => d.remaining === first.remaining && d.limit === first.limit);
  return { ...first, periodMs: shown?.periodMs ?? periodsMs[0], limits: each };
}

/** What `onError: 'open'` answers: admitted (`granted`: the cost asked), nothing known. */
export function errorDecision(periodMs = 0, granted = 0): Decision {
  return {
    allowed: true,
    granted,
    limit: 0,
    remaining: 0,
    retryAfterMs: 0,
    resetAfterMs: 0,
    delayMs: 0,
    source: 'error',
    shadowRejected: false,
    periodMs,
  };
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

/** POLICY GET's reply (field/value pairs, or a map) as a definition; null for nil. */
export function policyDefinition(name: string, reply: unknown): PolicyDefinition | null {
  if (reply === null || reply === undefined) return null;
  const f = pairs(reply);
  const algorithm = text(f.algorithm);
  const definition: PolicyDefinition = {
    name,
    algorithm,
    limit: toNumber(f.limit),
    mode: text(f.mode) === 'shadow' ? 'shadow' : 'enforce',
    blockMs: f.block_ms === undefined ? 0 : toNumber(f.block_ms),
  };
  if (f.lease_ms !== undefined) definition.leaseMs = toNumber(f.lease_ms);
  if (f.period_ms !== undefined) definition.periodMs = toNumber(f.period_ms);
  if (f.burst !== undefined) definition.burst = toNumber(f.burst);
  if ((ALGORITHMS as readonly string[]).includes(algorithm) && definition.periodMs !== undefined) {
    definition.limitSpec = limit(algorithm as Algorithm, definition.limit, definition.periodMs, {
      ...(BUCKETS.includes(algorithm) && definition.burst !== undefined ? { burst: definition.burst } : {}),
      ...(definition.blockMs > 0 ? { block: definition.blockMs } : {}),
    });
  }
  return definition;
}

/** A list of strings (POLICY LIST). */
export function strings(reply: unknown): string[] {
  if (!Array.isArray(reply)) throw new TypeError(`unexpected reply ${JSON.stringify(reply)}`);
  return reply.map(text);
}

export function integerReply(reply: unknown): number {
  return toNumber(reply);
}

/** ⌈ms / 1000⌉: seconds for the headers. */
export function ceilSeconds(ms: number): number {
  return Math.ceil(ms / 1000);
}
