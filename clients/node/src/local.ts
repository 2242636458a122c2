// The six algorithms in process, exactly as docs/algorithms.md defines them (the module's
// core/src/algorithms/*.rs, integer for integer): what `onError: 'local'` decides with while Redis
// cannot answer. Scaled quantities (C·P reaches 3.2·10^23) are BigInts; times and counts stay
// below 2^53 and are numbers. No I/O.

import { periodMs, RateLimitError, type Algorithm, type Decision, type Limit, type Source } from './types.js';

/** The six fields of a reply, before the package's own (source, period...). */
export interface Reply {
  allowed: boolean;
  limit: number;
  remaining: number;
  retryAfterMs: number;
  resetAfterMs: number;
  delayMs: number;
}

/** `L`, `P` and `C` as BigInts (the scaled arithmetic), and as numbers. */
interface Params {
  limit: bigint;
  period: bigint;
  capacity: bigint;
  periodMs: number;
  limitN: number;
  capacityN: number;
}

function params(lim: Limit): Params {
  const capacityN = lim.burst ?? lim.limit;
  return {
    limit: BigInt(lim.limit),
    period: BigInt(lim.periodMs),
    capacity: BigInt(capacityN),
    periodMs: lim.periodMs,
    limitN: lim.limit,
    capacityN,
  };
}

const I64_MAX = 2n ** 63n - 1n;
/** A BigInt quantity as a reply integer, saturating at 2^63 − 1 as the module's replies do. */
const num = (x: bigint): number => Number(x > I64_MAX ? I64_MAX : x);
const ceilDiv = (a: bigint, b: bigint): bigint => (a + b - 1n) / b;
const big = (x: number): bigint => BigInt(x);
const windowStart = (p: Params, t: number): number => t - (t % p.periodMs);

/** A fixed-size algorithm: its state is a value, and every call works on copies. */
interface FixedSize<S> {
  fresh(p: Params, t: number): S;
  advance(s: S, p: Params, last: number, t: number): S;
  isFresh(s: S, p: Params): boolean;
  carryOver(s: S, from: Params, to: Params, t: number): S;
  decide(s: S, p: Params, cost: number, t: number): [Reply, S];
  refund(s: S, p: Params, cost: number): S;
  same(a: S, b: S): boolean;
}

const sameBig = (a: bigint, b: bigint) => a === b;

const tokenBucket: FixedSize<bigint> = {
  fresh: (p) => p.capacity * p.period,
  advance: (tokens, p, last, t) => {
    const full = p.capacity * p.period;
    const refilled = tokens + big(t - last) * p.limit;
    return refilled < full ? refilled : full;
  },
  isFresh: (tokens, p) => tokens >= p.capacity * p.period,
  carryOver: (tokens, from, to) => {
    const rescaled = from.periodMs === to.periodMs ? tokens : (tokens * to.period) / from.period;
    const full = to.capacity * to.period;
    return rescaled < full ? rescaled : full;
  },
  decide: (tokens, p, cost) => {
    const need = big(cost) * p.period;
    const allowed = tokens >= need;
    const after = allowed ? tokens - need : tokens;
    const retryAfterMs = allowed ? 0 : cost > p.capacityN ? -1 : num(ceilDiv(need - tokens, p.limit));
    const missing = p.capacity * p.period - after;
    return [
      { allowed, limit: p.capacityN, remaining: num(after / p.period), retryAfterMs, resetAfterMs: num(ceilDiv(missing > 0n ? missing : 0n, p.limit)), delayMs: 0 },
      after,
    ];
  },
  refund: (tokens, p, cost) => {
    const back = tokens + big(cost) * p.period;
    const full = p.capacity * p.period;
    return back < full ? back : full;
  },
  same: sameBig,
};

const leakyBucket: FixedSize<bigint> = {
  fresh: () => 0n,
  advance: (level, p, last, t) => {
    const drained = big(t - last) * p.limit;
    return level > drained ? level - drained : 0n;
  },
  isFresh: (level) => level === 0n,
  carryOver: (level, from, to) => {
    const rescaled = from.periodMs === to.periodMs ? level : ceilDiv(level * to.period, from.period);
    const full = to.capacity * to.period;
    return rescaled < full ? rescaled : full;
  },
  decide: (level, p, cost) => {
    const work = big(cost) * p.period;
    const capacity = p.capacity * p.period;
    const allowed = level + work <= capacity;
    let after = level;
    let delayMs = 0;
    let retryAfterMs = 0;
    if (allowed) {
      after = level + work;
      delayMs = num(ceilDiv(level, p.limit));
    } else if (cost > p.capacityN) {
      retryAfterMs = -1;
    } else {
      retryAfterMs = num(ceilDiv(level + work - capacity, p.limit));
    }
    const free = capacity > after ? capacity - after : 0n;
    return [{ allowed, limit: p.capacityN, remaining: num(free / p.period), retryAfterMs, resetAfterMs: num(ceilDiv(after, p.limit)), delayMs }, after];
  },
  refund: (level, p, cost) => {
    const back = big(cost) * p.period;
    return level > back ? level - back : 0n;
  },
  same: sameBig,
};

interface Counter {
  windowStart: number;
  count: number;
}

const fixedWindow: FixedSize<Counter> = {
  fresh: (p, t) => ({ windowStart: windowStart(p, t), count: 0 }),
  advance: (c, p, _last, t) => (windowStart(p, t) === c.windowStart ? c : fixedWindow.fresh(p, t)),
  isFresh: (c) => c.count === 0,
  carryOver: (c, from, to, t) => (from.periodMs === to.periodMs ? c : fixedWindow.fresh(to, t)),
  decide: (c, p, cost, t) => {
    const allowed = c.count + cost <= p.limitN;
    const after = { windowStart: c.windowStart, count: allowed ? c.count + cost : c.count };
    const left = c.windowStart + p.periodMs - t;
    return [
      {
        allowed,
        limit: p.limitN,
        remaining: Math.max(0, p.limitN - after.count),
        retryAfterMs: allowed ? 0 : cost > p.limitN ? -1 : left,
        resetAfterMs: after.count === 0 ? 0 : Math.max(0, after.windowStart + p.periodMs - t),
        delayMs: 0,
      },
      after,
    ];
  },
  refund: (c, _p, cost) => ({ windowStart: c.windowStart, count: Math.max(0, c.count - cost) }),
  same: (a, b) => a.windowStart === b.windowStart && a.count === b.count,
};

interface Counters {
  windowStart: number;
  current: number;
  previous: number;
}

function slidingReset(p: Params, c: Counters, t: number): number {
  const end = c.current > 0 ? c.windowStart + 2 * p.periodMs : c.previous > 0 ? c.windowStart + p.periodMs : null;
  return end === null ? 0 : Math.max(0, end - t);
}

/** The least `d ≥ 1` after which a rejected request of `cost ≤ L` is admitted. */
function slidingRetry(c: Counters, p: Params, cost: number, t: number): number {
  const period = p.period;
  const limit = p.limit;
  const costB = big(cost);
  const current = big(c.current);
  const previous = big(c.previous);
  const left = period - big(t - c.windowStart);
  if (previous > 0n && current + costB <= limit) {
    const room = (limit - current - costB) * period;
    const fit = room / previous;
    let wait = left > fit ? left - fit : 0n;
    if (wait < 1n) wait = 1n;
    if (wait < left) return Number(wait);
  }
  if (current === 0n) return Number(left);
  const kept = ((limit - costB) * period) / current;
  const intoNext = period > kept ? period - kept : 0n;
  return Number(intoNext < period ? left + intoNext : left + period);
}

const slidingWindow: FixedSize<Counters> = {
  fresh: (p, t) => ({ windowStart: windowStart(p, t), current: 0, previous: 0 }),
  advance: (c, p, _last, t) => {
    const w = windowStart(p, t);
    if (w === c.windowStart) return c;
    if (w === c.windowStart + p.periodMs) return { windowStart: w, current: 0, previous: c.current };
    return slidingWindow.fresh(p, t);
  },
  isFresh: (c) => c.current === 0 && c.previous === 0,
  carryOver: (c, from, to, t) => (from.periodMs === to.periodMs ? c : slidingWindow.fresh(to, t)),
  decide: (c, p, cost, t) => {
    const ceiling = p.limit * p.period;
    const elapsed = big(t - c.windowStart);
    const est = big(c.previous) * (p.period - elapsed) + big(c.current) * p.period;
    const need = big(cost) * p.period;
    const allowed = est + need <= ceiling;
    const after = allowed ? { ...c, current: c.current + cost } : c;
    const estAfter = allowed ? est + need : est;
    return [
      {
        allowed,
        limit: p.limitN,
        remaining: num((ceiling > estAfter ? ceiling - estAfter : 0n) / p.period),
        retryAfterMs: allowed ? 0 : cost > p.limitN ? -1 : slidingRetry(c, p, cost, t),
        resetAfterMs: slidingReset(p, after, t),
        delayMs: 0,
      },
      after,
    ];
  },
  refund: (c, _p, cost) => ({ ...c, current: Math.max(0, c.current - cost) }),
  same: (a, b) => a.windowStart === b.windowStart && a.current === b.current && a.previous === b.previous,
};

const gcra: FixedSize<bigint> = {
  fresh: () => 0n,
  advance: (ahead, p, last, t) => {
    const passed = big(t - last) * p.limit;
    return ahead > passed ? ahead - passed : 0n;
  },
  isFresh: (ahead) => ahead === 0n,
  carryOver: (ahead, from, to) => (from.limitN === to.limitN ? ahead : ceilDiv(ahead * to.limit, from.limit)),
  decide: (ahead, p, cost) => {
    const tolerance = p.capacity * p.period;
    const next = ahead + big(cost) * p.period;
    const allowed = next <= tolerance;
    const after = allowed ? next : ahead;
    const retryAfterMs = allowed ? 0 : cost > p.capacityN ? -1 : num(ceilDiv(next - tolerance, p.limit));
    return [
      {
        allowed,
        limit: p.capacityN,
        remaining: num((tolerance > after ? tolerance - after : 0n) / p.period),
        retryAfterMs,
        resetAfterMs: num(ceilDiv(after, p.limit)),
        delayMs: 0,
      },
      after,
    ];
  },
  refund: (ahead, p, cost) => {
    const back = big(cost) * p.period;
    return ahead > back ? ahead - back : 0n;
  },
  same: sameBig,
};

/** A sliding log: runs `[timestamp, count]`, oldest first. */
interface Log {
  runs: Array<[number, number]>;
  total: number;
}

type State = bigint | Counter | Counters | Log;

// Each entry works on its own state, held here as a FixedSize<State> (method parameters are
// bivariant); each is only ever given the states it made.
const FIXED: Partial<Record<Algorithm, FixedSize<State>>> = {
  'token-bucket': tokenBucket,
  'leaky-bucket': leakyBucket,
  'fixed-window': fixedWindow,
  'sliding-window': slidingWindow,
  gcra,
};

/** One key's stored limiter: its algorithm and parameters (those of its last consuming call),
 * `last`, its state at `last`, the end of a block, and when the module's key would expire. */
interface Stored {
  algorithm: Algorithm;
  params: Params;
  last: number;
  state: State;
  blockedUntil: number;
  expiresAt: number;
}

interface Request {
  algorithm: Algorithm;
  params: Params;
  cost: number;
  now: number;
}

interface Outcome {
  reply: Reply;
  t: number;
}

function cloneState(state: State): State {
  if (typeof state === 'bigint') return state;
  if ('runs' in state) return { runs: state.runs.map(([ts, n]) => [ts, n] as [number, number]), total: state.total };
  return { ...state };
}

/** Where the stored log starts to count at `t` (the index of the first counted run and the
 * entries before it), or null when the whole log has slid out of its own window. */
function slidOut(stored: Stored, p: Params, t: number): { index: number; entries: number } | null {
  if (stored.last + stored.params.periodMs <= t) return null;
  const cutoff = Math.max(t - stored.params.periodMs, t - p.periodMs);
  const log = stored.state as Log;
  let index = 0;
  let entries = 0;
  while (index < log.runs.length && log.runs[index][0] <= cutoff) {
    entries += log.runs[index][1];
    index += 1;
  }
  return { index, entries };
}

function pushRun(log: Log, t: number, count: number): void {
  const newest = log.runs[log.runs.length - 1];
  if (newest && newest[0] === t) newest[1] += count;
  else log.runs.push([t, count]);
  log.total += count;
}

function logCheck(stored: Stored | undefined, req: Request, commit: boolean): [Outcome, Stored | undefined] {
  const p = req.params;
  const t = stored ? Math.max(req.now, stored.last) : req.now;
  const mark = stored ? slidOut(stored, p, t) : null;
  const log: Log = mark && stored ? (stored.state as Log) : { runs: [], total: 0 };
  const from = mark ?? { index: 0, entries: 0 };
  const count = log.total - from.entries;
  const cost = req.cost;
  const allowed = count + cost <= p.limitN;
  const newest = allowed && cost > 0 ? t : count > 0 ? log.runs[log.runs.length - 1][0] : null;
  let retryAfterMs = 0;
  if (!allowed) {
    if (cost > p.limitN) {
      retryAfterMs = -1;
    } else {
      const k = count + cost - p.limitN;
      let seen = 0;
      for (let i = from.index; i < log.runs.length; i += 1) {
        seen += log.runs[i][1];
        if (seen >= k) {
          retryAfterMs = log.runs[i][0] + p.periodMs - t;
          break;
        }
      }
    }
  }
  const reply: Reply = {
    allowed,
    limit: p.limitN,
    remaining: Math.max(0, p.limitN - (allowed ? count + cost : count)),
    retryAfterMs,
    resetAfterMs: newest === null ? 0 : newest + p.periodMs - t,
    delayMs: 0,
  };
  if (!(commit && allowed && cost > 0)) return [{ reply, t }, stored];
  const runs = mark ? log.runs.slice(mark.index) : [];
  const next: Log = { runs, total: count };
  pushRun(next, t, cost);
  return [{ reply, t }, { algorithm: 'sliding-log', params: p, last: t, state: next, blockedUntil: 0, expiresAt: 0 }];
}

/** The call without blocks: the reply, and the stored limiter after it (the same object when
 * nothing changed; undefined when there is none). */
function plainCheck(stored: Stored | undefined, req: Request, commit: boolean): [Outcome, Stored | undefined] {
  if (req.algorithm === 'sliding-log') return logCheck(stored, req, commit);
  const a = FIXED[req.algorithm] as FixedSize<State>;
  const p = req.params;
  let t = req.now;
  let carried: State;
  if (stored) {
    t = Math.max(req.now, stored.last);
    const advanced = a.advance(stored.state, stored.params, stored.last, t);
    carried = a.isFresh(advanced, stored.params) ? a.fresh(p, t) : a.carryOver(advanced, stored.params, p, t);
  } else {
    carried = a.fresh(p, t);
  }
  const [reply, after] = a.decide(carried, p, req.cost, t);
  if (!(commit && reply.allowed && req.cost > 0)) return [{ reply, t }, stored];
  return [{ reply, t }, { algorithm: req.algorithm, params: p, last: t, state: after, blockedUntil: 0, expiresAt: 0 }];
}

/** A blocked key's answer at `t`, given what the algorithm alone answers. */
function blockedAnswer(own: Reply, until: number, t: number): Reply {
  const left = Math.max(0, until - t);
  return {
    allowed: false,
    limit: own.limit,
    remaining: 0,
    retryAfterMs: own.retryAfterMs < 0 ? -1 : Math.max(own.retryAfterMs, left),
    resetAfterMs: Math.max(own.resetAfterMs, left),
    delayMs: 0,
  };
}

/** ms after `last` until the stored state is fresh (the key's expiry is `last` plus this). */
function resetAfter(stored: Stored): number {
  if (stored.algorithm === 'sliding-log') {
    const log = stored.state as Log;
    return log.total === 0 ? 0 : Math.max(0, log.runs[log.runs.length - 1][0] + stored.params.periodMs - stored.last);
  }
  const a = FIXED[stored.algorithm] as FixedSize<State>;
  return a.decide(stored.state, stored.params, 0, stored.last)[0].resetAfterMs;
}

export interface LocalOptions {
  /** The most keys held (least recently used dropped first). */
  maxKeys: number;
  /** The machine's clock (ms since the epoch): a key is dropped when it passes the time the
   * module's key would expire at, as Redis expires it by its own clock whatever `AT` says. */
  clock?: () => number;
}

/**
 * The exact in-process limiter: per key, the state the module would store, bounded (a key is
 * dropped when the module's key would have expired, that is when its state is as good as fresh,
 * and the least recently used beyond `maxKeys`).
 */
export class LocalLimiter {
  private readonly keys = new Map<string, Stored>();
  constructor(private readonly options: LocalOptions = { maxKeys: 10000 }) {}

  /** The number of keys held. */
  get size(): number {
    return this.keys.size;
  }

  /** `RATELIMIT.CHECK` (commit) or `PEEK`. */
  check(key: string, lim: Limit, cost: number, now: number, commit: boolean): Reply {
    return this.decide(key, lim, cost, now, commit).reply;
  }

  /** `RATELIMIT.TAKE ... MAX max`: the reply with the grant in `granted`. */
  take(key: string, lim: Limit, max: number, now: number): Reply & { granted: number } {
    const stored = this.load(key, lim.algorithm);
    const req = (cost: number) => ({ algorithm: lim.algorithm, params: params(lim), cost, now });
    const block = lim.block === undefined ? null : periodMs(lim.block, 'block');
    const admits = (cost: number) => checkBlocking(stored && copy(stored), req(cost), false, block)[0].reply.allowed;
    let granted = max;
    if (!admits(max)) {
      // The largest admitted cost: admission is monotone in the cost.
      let low = 0;
      let high = max;
      while (high - low > 1) {
        const middle = low + Math.floor((high - low) / 2);
        if (admits(middle)) low = middle;
        else high = middle;
      }
      granted = low;
    }
    // A leaky bucket's delay_ms is the wait of the last unit granted: what a CHECK of one unit
    // would answer after the first granted - 1 (the module's TAKE, docs/commands.md).
    let lastDelayMs: number | null = null;
    if (lim.algorithm === 'leaky-bucket' && granted > 1) {
      const [, before] = checkBlocking(stored && copy(stored), req(granted - 1), true, block);
      lastDelayMs = checkBlocking(before && copy(before), req(1), false, block)[0].reply.delayMs;
    }
    const reply = this.decide(key, lim, Math.max(granted, 1), now, true).reply;
    return { ...reply, ...(lastDelayMs === null ? {} : { delayMs: lastDelayMs }), granted };
  }

  /** `RATELIMIT.REFUND`: gives back up to `cost`; the reply is the peek of cost 0 right after. */
  refund(key: string, lim: Limit, cost: number, now: number): Reply {
    const stored = this.load(key, lim.algorithm);
    const peek = (t: number) => ({ algorithm: lim.algorithm, params: params(lim), cost: 0, now: t });
    if (!stored) return plainCheck(undefined, peek(now), false)[0].reply;
    const t = Math.max(now, stored.last);
    const blocked = t < stored.blockedUntil;
    let after: Stored | undefined = stored;
    if (stored.algorithm === 'sliding-log') {
      const mark = slidOut(stored, stored.params, t);
      const log = stored.state as Log;
      const live = mark ? log.total - mark.entries : 0;
      const take = Math.min(cost, live);
      if (mark && take > 0) {
        if (take === live && !blocked) {
          after = undefined;
        } else {
          const runs = log.runs.slice(mark.index).map(([ts, n]) => [ts, n] as [number, number]);
          let left = take;
          while (left > 0) {
            const newest = runs[runs.length - 1];
            const out = Math.min(left, newest[1]);
            newest[1] -= out;
            left -= out;
            if (newest[1] === 0) runs.pop();
          }
          after = { ...stored, last: t, state: { runs, total: live - take } };
        }
      }
    } else {
      const a = FIXED[stored.algorithm] as FixedSize<State>;
      const advanced = a.advance(stored.state, stored.params, stored.last, t);
      if (!a.isFresh(advanced, stored.params)) {
        const refunded = a.refund(advanced, stored.params, cost);
        if (!a.same(refunded, advanced)) {
          after = a.isFresh(refunded, stored.params) && !blocked ? undefined : { ...stored, last: t, state: refunded };
        }
      }
    }
    this.save(key, after);
    return checkBlocking(after && copy(after), peek(t), false, null)[0].reply;
  }

  /** `RATELIMIT.CHECKALL`: one request of `cost` against several limits, all or nothing (see
   * docs/algorithms.md, CHECKALL): each limit's reply, and the overall one. */
  checkAll(items: Array<[string, Limit]>, cost: number, now: number): { overall: Reply; each: Reply[] } {
    const requests = items.map(([, lim]) => ({ algorithm: lim.algorithm, params: params(lim), cost, now }));
    const occurrences = new Map<string, number>();
    for (const [key] of items) occurrences.set(key, (occurrences.get(key) ?? 0) + 1);
    const stored = new Map<string, Stored | undefined>();
    for (const [key, lim] of items) if (!stored.has(key)) stored.set(key, this.load(key, lim.algorithm));
    // First pass, writing nothing: a key named more than once is decided on a copy, each limit
    // seeing what the ones before it consumed.
    const copies = new Map<string, Stored | undefined>();
    const outcomes: Outcome[] = [];
    const byBlock: boolean[] = [];
    items.forEach(([key, lim], i) => {
      const req = requests[i];
      let state = stored.get(key);
      if (occurrences.get(key)! > 1) {
        state = copies.has(key) ? copies.get(key) : state && copy(state);
        if (state && state.algorithm !== lim.algorithm) throw new RateLimitError(`key holds a ${state.algorithm} limiter, not ${lim.algorithm} (reset it first)`);
      }
      byBlock.push(state !== undefined && Math.max(now, state.last) < state.blockedUntil);
      const [outcome, after] = checkBlocking(state, req, occurrences.get(key)! > 1, null);
      if (occurrences.get(key)! > 1) copies.set(key, after);
      outcomes.push(outcome);
    });
    const admitted = outcomes.every((o) => o.reply.allowed);
    if (admitted) {
      items.forEach(([key, lim], i) => {
        const [outcome, after] = checkBlocking(this.load(key, lim.algorithm), requests[i], true, null);
        this.save(key, after);
        outcomes[i] = outcome;
      });
    }
    // A limit with BLOCK its algorithm rejected blocks its key, once per key, admitted or not.
    const blocked = new Set<string>();
    items.forEach(([key, lim], i) => {
      const { reply, t } = outcomes[i];
      const starts = cost > 0 && !reply.allowed && reply.retryAfterMs >= 0 && !byBlock[i] && !blocked.has(key);
      if (!starts || lim.block === undefined) return;
      const state = this.load(key, lim.algorithm);
      if (!state) return;
      const until = t + periodMs(lim.block, 'block');
      this.save(key, { ...state, blockedUntil: until });
      blocked.add(key);
      outcomes[i] = { reply: blockedAnswer(reply, until, t), t };
    });
    const each = outcomes.map((o) => o.reply);
    return { overall: combine(each), each };
  }

  /** `RATELIMIT.RESET`: whether the key was held. */
  reset(key: string): boolean {
    return this.keys.delete(key);
  }

  private decide(key: string, lim: Limit, cost: number, now: number, commit: boolean): Outcome {
    const stored = this.load(key, lim.algorithm);
    const block = lim.block === undefined ? null : periodMs(lim.block, 'block');
    const [outcome, after] = checkBlocking(stored, { algorithm: lim.algorithm, params: params(lim), cost, now }, commit, block);
    if (commit && after !== stored) this.save(key, after);
    return outcome;
  }

  /** The key's limiter, unless the module's key would have expired by now (its state is then
   * as good as fresh and its block over); another algorithm's is the caller's mistake. */
  private load(key: string, algorithm: Algorithm): Stored | undefined {
    const stored = this.keys.get(key);
    if (!stored) return undefined;
    if (stored.expiresAt <= (this.options.clock ?? Date.now)()) {
      this.keys.delete(key);
      return undefined;
    }
    if (stored.algorithm !== algorithm) throw new RateLimitError(`key holds a ${stored.algorithm} limiter, not ${algorithm} (reset it first)`);
    return stored;
  }

  private save(key: string, stored: Stored | undefined): void {
    this.keys.delete(key);
    if (!stored) return;
    stored.expiresAt = Math.max(stored.last + resetAfter(stored), stored.blockedUntil);
    this.keys.set(key, stored);
    if (this.keys.size > this.options.maxKeys) this.keys.delete(this.keys.keys().next().value as string);
  }
}

/** CHECKALL's overall reply: allowed if all are; the least `remaining` (and the `limit` of the
 * first showing it); `retry_after_ms` -1 if any is, else the greatest; the greatest reset and delay. */
function combine(replies: Reply[]): Reply {
  const least = replies.reduce((a, b) => (b.remaining < a.remaining ? b : a));
  return {
    allowed: replies.every((r) => r.allowed),
    limit: least.limit,
    remaining: least.remaining,
    retryAfterMs: replies.some((r) => r.retryAfterMs === -1) ? -1 : Math.max(...replies.map((r) => r.retryAfterMs)),
    resetAfterMs: Math.max(...replies.map((r) => r.resetAfterMs)),
    delayMs: Math.max(...replies.map((r) => r.delayMs)),
  };
}

function copy(stored: Stored): Stored {
  return { ...stored, state: cloneState(stored.state) };
}

/** The call with the key's block and the limit's `BLOCK`: the outcome and the stored limiter
 * after it (a new object when it changed). */
function checkBlocking(stored: Stored | undefined, req: Request, commit: boolean, blockMs: number | null): [Outcome, Stored | undefined] {
  if (stored) {
    const t = Math.max(req.now, stored.last);
    if (t < stored.blockedUntil) {
      const [own] = plainCheck(copy(stored), req, false);
      return [{ reply: blockedAnswer(own.reply, stored.blockedUntil, t), t }, stored];
    }
  }
  const [outcome, after] = plainCheck(stored, req, commit);
  const starts = commit && req.cost > 0 && !outcome.reply.allowed && outcome.reply.retryAfterMs >= 0;
  if (blockMs !== null && stored && starts) {
    const until = outcome.t + blockMs;
    return [{ reply: blockedAnswer(outcome.reply, until, outcome.t), t: outcome.t }, { ...stored, blockedUntil: until }];
  }
  return [outcome, after];
}

/** A local reply as a Decision of `source`. */
export function localDecision(reply: Reply, source: Source, periodMsOf: number, granted: number): Decision {
  return { ...reply, granted, source, shadowRejected: false, periodMs: periodMsOf };
}
