// The decisions made in this process without a round trip, and their state: the denial cache (a
// bounded LRU of refusals, each answered again until its retry_after_ms has passed on the
// limiter's monotonic clock; it only ever refuses: admissions are never cached, and a refusal is
// reused only for a request that asks at least as much), and batches (units taken ahead with
// TAKE, admitted here until their hold time ends). No I/O: the limiter sends the TAKEs and
// REFUNDs and arms the timers.

import type { Decision, Limit, Stats } from './types.js';
import { limitArgs } from './wire.js';

interface Entry {
  key: string;
  /** The cost refused (take: the MAX granted nothing). */
  cost: number;
  decision: Decision;
  /** When it was refused, on the monotonic clock. */
  since: number;
}

export class DenialCache {
  private readonly entries = new Map<string, Entry>();
  /** The entries of each key, for reset and refund. */
  private readonly byKey = new Map<string, Set<string>>();

  constructor(
    readonly size: number,
    private readonly now: () => number,
  ) {}

  /** A cached refusal for a request of `cost` (at least the one refused), counted down to now:
   * `retryAfterMs` and `resetAfterMs` are what remains of them; null when there is none.
   * `bounded`: a cost above the decision's `limit` is never admitted (a check, not a take);
   * `asked`, the request's own cost, where `cost` is compared to a take's MAX (Infinity: any). */
  get(id: string, cost: number, bounded: boolean, asked = cost): Decision | null {
    const entry = this.entries.get(id);
    if (!entry) return null;
    const elapsed = this.now() - entry.since;
    if (!(elapsed < entry.decision.retryAfterMs)) {
      this.remove(id, entry);
      return null;
    }
    // A smaller cost may pass; a cost above the limit never can (Redis says so: -1, not kept).
    if (cost < entry.cost || (bounded && asked > entry.decision.limit)) return null;
    // Most recently used last.
    this.entries.delete(id);
    this.entries.set(id, entry);
    return {
      ...entry.decision,
      granted: 0,
      retryAfterMs: Math.ceil(entry.decision.retryAfterMs - elapsed),
      resetAfterMs: Math.max(0, Math.ceil(entry.decision.resetAfterMs - elapsed)),
      delayMs: 0,
      source: 'cache',
    };
  }

  /** Keeps a refusal of `cost` with a wait. Not kept: retry_after_ms -1 (never: the caller's
   * mistake, and a limit can change), and a refusal of cost 0 (it started no block where one of
   * cost 1 or more would: answering that one here would skip the block). */
  put(id: string, key: string, cost: number, decision: Decision): void {
    if (decision.allowed || decision.granted > 0 || !(decision.retryAfterMs > 0) || cost === 0) return;
    const old = this.entries.get(id);
    if (old) this.remove(id, old);
    this.entries.set(id, { key, cost, decision, since: this.now() });
    let ids = this.byKey.get(key);
    if (!ids) this.byKey.set(key, (ids = new Set()));
    ids.add(id);
    if (this.entries.size > this.size) {
      const [oldest, entry] = this.entries.entries().next().value as [string, Entry];
      this.remove(oldest, entry);
    }
  }

  /** Drops every refusal of `key` (reset, refund, a batch's refund through this limiter). */
  dropKey(key: string): void {
    const ids = this.byKey.get(key);
    if (!ids) return;
    for (const id of ids) this.entries.delete(id);
    this.byKey.delete(key);
  }

  /** Drops every refusal whose entry id mentions `part` (a policy set or deleted here). */
  dropMatching(part: string): void {
    for (const [id, entry] of [...this.entries]) if (id.includes(part)) this.remove(id, entry);
  }

  get length(): number {
    return this.entries.size;
  }

  private remove(id: string, entry: Entry): void {
    this.entries.delete(id);
    const ids = this.byKey.get(entry.key);
    ids?.delete(id);
    if (ids && ids.size === 0) this.byKey.delete(entry.key);
  }
}

/** One key's batch of a limit: the units this process took (TAKE) and has not admitted yet. */
export interface Batch {
  id: string;
  key: string;
  lim: Limit;
  /** Units held, not admitted yet. */
  units: number;
  /** When the hold ends (the limiter's clock): the units left are then given back. */
  holdEnd: number;
  /** The limiter's clock and the call's `at` at the last TAKE (the refund's `at` follows). */
  now0: number;
  at0?: number;
  /** The last TAKE's decision: what local answers report. */
  taken: Decision | null;
  /** When (the limiter's clock) the TAKEs' delay_ms and reset_after_ms end: local answers count
   * them down. */
  delayUntil: number;
  resetUntil: number;
  /** The TAKE in flight (the limiter's): null when it granted, the refusal when it did not. */
  inFlight: Promise<Decision | null> | null;
  /** Units asked by callers waiting for it. */
  waiting: number;
  /** Units asked in the current and the previous interval of one hold time. */
  demandSince: number;
  demandNow: number;
  demandBefore: number;
  lastAsked: number;
  /** The limiter's timer: ends the hold, forgets the batch. */
  timer?: ReturnType<typeof setTimeout>;
}

/** The batches of a limiter, by key and limit, and what they count in its `stats`. */
export class Batches {
  private readonly all = new Map<string, Batch>();

  constructor(
    private readonly now: () => number,
    private readonly counters: Stats,
  ) {}

  /** The batch of a key and limit, made at its first request. */
  of(key: string, lim: Limit): Batch {
    const id = `${key}\n${limitArgs(lim).join(' ')}`;
    let b = this.all.get(id);
    if (!b) {
      const now = this.now();
      b = { id, key, lim, units: 0, holdEnd: 0, now0: now, taken: null, delayUntil: 0, resetUntil: 0, inFlight: null, waiting: 0, demandSince: now, demandNow: 0, demandBefore: 0, lastAsked: now };
      this.all.set(id, b);
    }
    return b;
  }

  /** Whether `b` is still this limiter's (close() and the timer forget batches). */
  current(b: Batch): boolean {
    return this.all.get(b.id) === b;
  }

  values(): IterableIterator<Batch> {
    return this.all.values();
  }

  clear(): void {
    this.all.clear();
  }

  /** Counts `cost` asked in the current hold-long interval of the batch's demand. */
  noteDemand(b: Batch, cost: number): void {
    const now = this.now();
    const hold = b.lim.batchMs!;
    const passed = now - b.demandSince;
    if (passed >= hold) {
      b.demandBefore = passed < 2 * hold ? b.demandNow : 0;
      b.demandNow = 0;
      b.demandSince = now - (passed % hold);
    }
    b.demandNow += cost;
    b.lastAsked = now;
  }

  /** Units asked over the last hold time: the current interval's, and the previous one's
   * weighted by how much of it is still within the last hold time. */
  demand(b: Batch): number {
    const hold = b.lim.batchMs!;
    const into = Math.min(hold, Math.max(0, this.now() - b.demandSince));
    return Math.ceil(b.demandNow + (b.demandBefore * (hold - into)) / hold);
  }

  /** The MAX of the TAKE for a request of `cost` the units held do not cover: the demand of the
   * last hold time and the callers waiting, at least `cost`, at most `batchMax`. */
  wanted(b: Batch, cost: number): number {
    return Math.max(cost, Math.min(b.lim.batchMax ?? b.lim.limit, Math.max(this.demand(b), cost + b.waiting)));
  }

  /** Whether the hold has ended with units left (to be given back). */
  expired(b: Batch, now = this.now()): boolean {
    return b.units > 0 && now >= b.holdEnd;
  }

  /** Holds a TAKE's grant in the batch, for one hold time from now (the limiter arms its timer). */
  hold(b: Batch, d: Decision, at: number | undefined): void {
    const now = this.now();
    b.units += d.granted;
    b.taken = d;
    // Counted down from now: the most of what the batch's TAKEs said (a late grant joining units
    // held).
    b.delayUntil = Math.max(b.units > d.granted ? b.delayUntil : 0, now + d.delayMs);
    b.resetUntil = Math.max(b.units > d.granted ? b.resetUntil : 0, now + d.resetAfterMs);
    b.holdEnd = now + b.lim.batchMs!;
    b.now0 = now;
    b.at0 = at;
    this.counters.held += d.granted;
    this.counters.batchTaken += d.granted;
  }

  /** Admits `cost` from the units held. The numbers: the TAKE's, with `remaining` the units
   * still held, and the times counted down since. */
  admit(b: Batch, cost: number): Decision {
    b.units -= cost;
    this.counters.held -= cost;
    this.counters.batchUsed += cost;
    const taken = b.taken!;
    const now = this.now();
    return {
      allowed: true,
      granted: cost,
      limit: taken.limit,
      remaining: b.units,
      retryAfterMs: 0,
      resetAfterMs: Math.max(0, Math.ceil(b.resetUntil - now)),
      delayMs: Math.max(0, Math.ceil(b.delayUntil - now)),
      source: 'local',
      shadowRejected: false,
      periodMs: taken.periodMs,
    };
  }

  /** The hold ends: the units left, to give back (REFUND) at the batch's own time when it was
   * taken `at` one; null when there are none. */
  release(b: Batch): { units: number; at: number | undefined } | null {
    const units = b.units;
    b.units = 0;
    b.holdEnd = 0;
    if (units === 0) return null;
    this.counters.held -= units;
    return { units, at: b.at0 === undefined ? undefined : b.at0 + Math.floor(this.now() - b.now0) };
  }

  /** After the timer ended a hold that was over: the ms until it should fire again, or null when
   * the batch is forgotten (two hold times without a request, nothing held or in flight). */
  next(b: Batch, now: number): number | null {
    const hold = b.lim.batchMs!;
    if (b.units === 0 && b.inFlight === null && now - b.lastAsked >= 2 * hold) {
      if (this.all.get(b.id) === b) this.all.delete(b.id);
      return null;
    }
    return b.units > 0 ? Math.max(1, Math.ceil(b.holdEnd - now)) : hold;
  }
}
