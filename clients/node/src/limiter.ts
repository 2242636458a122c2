// RateLimiter: the I/O runner of the engine (engine.ts). It sends what the engine plans, bounds
// every call by timeoutMs (one timer for all: Deadlines), tells the engine what came back, runs
// the batches' TAKEs and the REFUNDs that give back what a call took (none lost to a timeout:
// close() waits for them), and arms the batches' timers (their state: clientside.ts).

import { randomUUID } from 'node:crypto';

import { Batches, DenialCache, type Batch } from './clientside.js';
import { counting, transport, type Transport } from './connection.js';
import { Engine, LIBRARY_NAME, libraryAction, functionNotFound, settings, Timeout, type RateLimiterOptions } from './engine.js';
import { LIBRARY } from './generated/library.js';
import {
  checkCost,
  checkKey,
  checkSpec,
  describe,
  isLimit,
  isPolicy,
  periodMs,
  RateLimited,
  RateLimitUnavailable,
  type CallOptions,
  type Decision,
  type Limit,
  type LimitSpec,
  type MultiDecision,
  type Period,
  type PolicyDefinition,
  type Source,
  type Stats,
} from './types.js';
import { atArgs, decision, integerReply, limitArgs, policyDefinition, strings, type Command } from './wire.js';

export { LIBRARY_NAME };

/** The most close() waits for the answers of calls that timed out, by default. */
const CLOSE_WAIT_MS = 5000;

/** A call in flight, bounded by its deadline. */
interface Bounded {
  deadline: number;
  settled: boolean;
  expire(): void;
}

/** The deadlines of a limiter's calls in flight. Every call gets the same timeout, so deadlines
 * come in the order the calls start: a queue holds them, and one timer, armed at the earliest
 * deadline not yet settled, serves them all (a timer per call costs more than the rest of the
 * package's work on a call). Each call still ends at its own deadline (to the timer's ms). */
class Deadlines {
  private queue: Array<Bounded | undefined> = [];
  private head = 0;
  private timer: ReturnType<typeof setTimeout> | null = null;
  /** Whether the timer keeps the process alive: while calls are in flight, as a timer per call
   * would; not once they are all settled (it then only sweeps an empty queue). */
  private referenced = false;
  constructor(private readonly ms: number) {}

  add(call: Bounded): void {
    call.deadline = performance.now() + this.ms;
    this.queue.push(call);
    if (this.timer === null) this.arm(this.ms);
    else if (!this.referenced) {
      this.timer.ref?.();
      this.referenced = true;
    }
  }

  /** A call settled: the calls settled at the head leave the queue now (sequential calls settle
   * in order, so the queue holds only the calls in flight, and nothing outlives its call). */
  settled(): void {
    const queue = this.queue;
    let i = this.head;
    while (i < queue.length && queue[i]!.settled) queue[i++] = undefined;
    if (i === queue.length) {
      queue.length = 0;
      this.head = 0;
      if (this.referenced) {
        this.timer?.unref?.();
        this.referenced = false;
      }
    } else {
      this.head = i;
    }
  }

  private arm(ms: number): void {
    this.timer = setTimeout(this.sweep, ms);
    this.referenced = true;
  }

  private readonly sweep = (): void => {
    this.timer = null;
    this.referenced = false;
    const now = performance.now();
    const queue = this.queue;
    let i = this.head;
    for (; i < queue.length; i += 1) {
      const call = queue[i]!;
      if (!call.settled && call.deadline > now) break;
      queue[i] = undefined;
      if (!call.settled) call.expire();
    }
    if (i === queue.length) {
      queue.length = 0;
      this.head = 0;
      return;
    }
    this.head = i;
    if (i > 1024 && i * 2 > queue.length) {
      queue.splice(0, i);
      this.head = 0;
    }
    this.arm(Math.max(1, Math.ceil(queue[this.head]!.deadline - now)));
  };
}

/** Server-side policies (the module only): `RATELIMIT.POLICY SET/GET/DEL/LIST`. In a cluster,
 * set and delete apply to every primary, get and list ask one. */
export class Policies {
  constructor(private readonly rl: RateLimiter) {}

  /** Defines (or replaces) `name` as `lim`; `shadow`: admit what it would refuse, and count it. */
  async set(name: string, lim: Limit, options: { shadow?: boolean } = {}): Promise<void> {
    const spec = checkSpec(lim);
    if (isPolicy(spec)) throw new TypeError('limit must be a limit(...): a policy is defined by one, not by another policy(...)');
    const args = ['RATELIMIT.POLICY', 'SET', policyName(name), ...limitArgs(spec)];
    if (options.shadow) args.push('SHADOW');
    await this.rl._admin(args, true);
    this.rl._forget(name);
  }

  /** The definition, or null if there is none. */
  async get(name: string): Promise<PolicyDefinition | null> {
    return policyDefinition(name, await this.rl._admin(['RATELIMIT.POLICY', 'GET', policyName(name)], false));
  }

  /** Removes it: true if it existed (on any primary). */
  async delete(name: string): Promise<boolean> {
    const replies = await this.rl._admin(['RATELIMIT.POLICY', 'DEL', policyName(name)], true);
    this.rl._forget(name);
    return (replies as unknown[]).some((r) => integerReply(r) > 0);
  }

  /** The names, sorted. */
  async list(): Promise<string[]> {
    return strings(await this.rl._admin(['RATELIMIT.POLICY', 'LIST'], false));
  }
}

function policyName(name: unknown): string {
  if (typeof name !== 'string' || name === '') throw new TypeError(`name must be a non-empty string (a policy's name), not ${describe(name)}`);
  return name;
}

/**
 * Rate limits on Redis: `check`, `peek`, `take`, `checkAll`, `refund`, `reset`, leases
 * (`acquire`, `release`, `withLease`) and `policies`, through a node-redis or ioredis client
 * (standalone or cluster), with the redis-ratelimit module or, where it is not loaded, the
 * Functions library; with a denial cache, batches (`close` gives back what they hold) and
 * counters (`stats`) where asked for.
 */
export class RateLimiter {
  readonly policies: Policies;
  readonly onError: 'open' | 'closed' | 'local';
  readonly localShare: number;
  readonly timeoutMs: number;
  readonly libraryPrefix: string;
  private readonly transport: Transport;
  /** The same, not counted: the engine's own question (how the module takes a spec). */
  private readonly uncounted: Transport;
  private readonly core: Engine;
  private readonly now: () => number;
  private libraryReady: Promise<void> | null = null;
  private readonly denials: DenialCache | null;
  private readonly batches: Batches;
  private readonly refunds = new Set<Promise<void>>();
  /** Calls whose timeout fired, until they are answered: close() waits for them. */
  private readonly late = new Set<Promise<void>>();
  private readonly deadlines: Deadlines;
  private readonly counters: Stats = {
    commands: 0,
    decisions: { module: 0, library: 0, error: 0, cache: 0, local: 0, fallback: 0 },
    batchTaken: 0,
    batchUsed: 0,
    batchRefunded: 0,
    held: 0,
    lateReplies: 0,
  };

  constructor(client: unknown, options: RateLimiterOptions = {}) {
    this.uncounted = transport(client);
    this.transport = counting(this.uncounted, () => (this.counters.commands += 1));
    const s = settings(options);
    this.onError = s.onError;
    this.localShare = s.localShare;
    this.timeoutMs = s.timeoutMs;
    this.libraryPrefix = s.libraryPrefix;
    this.now = s.now;
    this.deadlines = new Deadlines(s.timeoutMs);
    this.denials = s.denialCache > 0 ? new DenialCache(s.denialCache, s.now) : null;
    this.batches = new Batches(s.now, this.counters);
    this.core = new Engine(s);
    this.policies = new Policies(this);
  }

  /** The engine that served the last call: `'module'`, `'library'`, or null before the first. */
  get engine(): 'module' | 'library' | null {
    return this.core.inUse;
  }

  /** Whether the breaker is open (calls answer onError at once but for one probe per cool-down). */
  get breakerOpen(): boolean {
    return this.core.breaker.open;
  }

  /** Decides one request of `cost` (default 1) on `key`; consumes it if admitted. */
  check(key: string, spec: LimitSpec, options: CallOptions = {}): Promise<Decision> {
    // The common case, an inline limit without batches or a denial cache on the module, in one
    // step; the rest below. Both answer the same.
    if (this.denials === null && this.core.inUse === 'module' && isLimit(spec) && spec.batchMs === undefined) {
      let cost: number;
      try {
        cost = checkCost(options.cost ?? 1);
        checkKey(key);
        if (options.at !== undefined) atArgs(options.at);
      } catch (error) {
        return Promise.reject(error);
      }
      return this.fastCheck(key, spec, cost, options.at);
    }
    return this.checkAny(key, spec, options);
  }

  /** `check` of an inline limit on the module, without batches or a denial cache: what single()
   * and decide() do, with one promise and no intermediate steps (the package's own work is then
   * a few µs of a call). */
  private fastCheck(key: string, lim: Limit, cost: number, at: number | undefined): Promise<Decision> {
    const core = this.core;
    const args = core.inlineArgs('check', key, lim, cost, at);
    return new Promise<Decision>((resolve, reject) => {
      // Redis unavailable (onError), or the caller's mistake (rejects).
      const fallBack = (error: unknown) => {
        try {
          resolve(this.counted(core.unavailable(core.failed(error), lim.periodMs, cost, () => this.decideLocally('check', key, lim, cost, at))));
        } catch (failure) {
          reject(failure);
        }
      };
      if (!core.breaker.allow()) {
        fallBack(new RateLimitUnavailable('Redis unavailable: the breaker is open (recent calls failed)'));
        return;
      }
      if (core.formUnknown) this.askForm();
      let sent: Promise<unknown>;
      try {
        sent = this.transport.send(args, key, false);
      } catch (error) {
        fallBack(error);
        return;
      }
      const call: Bounded = {
        deadline: 0,
        settled: false,
        expire: () => {
          call.settled = true;
          fallBack(new Timeout(`Redis did not answer within ${this.timeoutMs} ms`));
          const after = sent.then(
            () => {},
            () => {},
          );
          this.late.add(after);
          void after.finally(() => this.late.delete(after));
        },
      };
      sent.then(
        (reply) => {
          if (call.settled) {
            // Answered after its timeout: what it consumed goes back.
            this.counters.lateReplies += 1;
            try {
              this.lateGrant(key, lim, decision(reply, 'module', lim.periodMs, cost), at);
            } catch {
              // not a decision: nothing known to give back
            }
            return;
          }
          call.settled = true;
          this.deadlines.settled();
          let d: Decision;
          try {
            d = decision(reply, 'module', lim.periodMs, cost);
          } catch (error) {
            reject(error);
            return;
          }
          core.answered();
          resolve(this.counted(d));
        },
        (error) => {
          if (call.settled) return;
          call.settled = true;
          this.deadlines.settled();
          if (core.oneArgRefused(error) || core.moduleFailed(error)) {
            this.checkAny(key, lim, { cost, at }).then(resolve, reject);
            return;
          }
          fallBack(error);
        },
      );
      this.deadlines.add(call);
    });
  }

  /** `check` in general: the denial cache, batches, policies, either engine. */
  private async checkAny(key: string, spec: LimitSpec, options: CallOptions): Promise<Decision> {
    const cost = checkCost(options.cost ?? 1);
    const id = this.denialId('check', key, spec, options.at);
    // A TAKE that granted nothing refused one unit: every cost from 1 is refused meanwhile.
    const cached = id && (this.denials!.get(id, cost, true) ?? (cost > 0 ? this.denials!.get(`take${id.slice(5)}`, Infinity, true, cost) : null));
    if (cached) return this.counted(cached);
    // A cost of 0 or above batchMax is a check of its own.
    const batched = isLimit(spec) && spec.batchMs !== undefined && cost > 0 && cost <= spec.batchMax!;
    const d = batched ? await this.batchCheck(key, spec, cost, options.at) : await this.single('check', key, spec, cost, options.at);
    if (id) this.remember(id, key, spec, cost, d);
    return this.counted(d);
  }

  /** What `check` would answer now, changing nothing (never answered from the denial cache). */
  async peek(key: string, spec: LimitSpec, options: CallOptions = {}): Promise<Decision> {
    return this.counted(await this.single('peek', key, spec, checkCost(options.cost ?? 1), options.at));
  }

  /** Gives back `cost` that admitted requests consumed (a request not served); the decision
   * right after (what a peek of cost 0 answers). */
  async refund(key: string, spec: LimitSpec, cost: number, options: { at?: number } = {}): Promise<Decision> {
    checkKey(key);
    this.denials?.dropKey(key);
    return this.counted(await this.single('refund', key, spec, checkCost(cost), options?.at));
  }

  /** A partial grant (`RATELIMIT.TAKE`): takes the largest cost from 0 to `max` that `check`
   * would admit now, and consumes it; `granted` says how much (`allowed` is `granted > 0`). */
  async take(key: string, spec: LimitSpec, max: number, options: { at?: number } = {}): Promise<Decision> {
    const most = checkCost(max, 1, 'max');
    const id = this.denialId('take', key, spec, options?.at);
    const cached = id && this.denials!.get(id, most, false);
    if (cached) return this.counted(cached);
    const d = await this.single('take', key, spec, most, options?.at);
    if (id) this.remember(id, key, spec, most, d);
    return this.counted(d);
  }

  /** What this limiter has done: commands sent, decisions by source, batches' units. */
  get stats(): Stats {
    return { ...this.counters, decisions: { ...this.counters.decisions } };
  }

  /** Ends every batch, giving back (REFUND) the units they hold, and waits for the refunds.
   * Calls that timed out and are not answered yet are waited for first (what they took is then
   * given back), up to `waitMs` (default 5000) in all; what answers after that is given back when
   * it does. The client stays open (close it yourself); later calls start new batches. */
  async close(options: { waitMs?: number } = {}): Promise<void> {
    const waitMs = options?.waitMs ?? CLOSE_WAIT_MS;
    if (!(Number.isFinite(waitMs) && waitMs >= 0)) throw new TypeError(`waitMs must be a number of ms, not ${describe(waitMs)}`);
    const end = performance.now() + waitMs;
    const within = async (promises: Array<Promise<unknown>>) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const cap = new Promise((resolve) => (timer = setTimeout(resolve, Math.max(0, end - performance.now()))));
      await Promise.race([Promise.allSettled(promises), cap]);
      clearTimeout(timer);
    };
    const inFlight = [...this.batches.values()].map((b) => b.inFlight).filter((p) => p !== null);
    await within([...inFlight, ...this.late]);
    for (const b of this.batches.values()) {
      clearTimeout(b.timer);
      this.endHold(b);
    }
    this.batches.clear();
    // The refunds, until answered: one that timed out is still waited for (in `late`), and what
    // answers meanwhile may give back more.
    while ((this.refunds.size > 0 || this.late.size > 0) && performance.now() < end) await within([...this.refunds, ...this.late]);
  }

  // ---- batches ----

  /** A check of a batched limit: from the units this process holds when they cover `cost`; else
   * a TAKE (one in flight per key and limit, shared by the callers waiting for it). */
  private async batchCheck(key: string, lim: Limit, cost: number, at: number | undefined): Promise<Decision> {
    atArgs(at);
    const batches = this.batches;
    const b = batches.of(key, lim);
    batches.noteDemand(b, cost);
    for (let round = 0; round < 4; round += 1) {
      if (batches.expired(b)) this.endHold(b);
      if (b.units >= cost) return batches.admit(b, cost);
      let refusal: Decision | null;
      const own = !b.inFlight;
      if (b.inFlight) {
        b.waiting += cost;
        try {
          refusal = await b.inFlight;
        } catch (error) {
          return this.core.unavailable(error, lim.periodMs, cost, () => this.decideLocally('check', key, lim, cost, at));
        } finally {
          b.waiting -= cost;
        }
      } else {
        // Fewer units than this request: given back, and a batch of at least its cost taken.
        if (b.units > 0) this.endHold(b);
        const taking = this.takeBatch(b, batches.wanted(b, cost), at);
        b.inFlight = taking;
        try {
          refusal = await taking;
        } catch (error) {
          return this.core.unavailable(error, lim.periodMs, cost, () => this.decideLocally('check', key, lim, cost, at));
        } finally {
          if (b.inFlight === taking) b.inFlight = null;
        }
      }
      // A TAKE that granted nothing refuses a request of one unit exactly (its wait is until one
      // unit can be granted); a larger request, or one its own TAKE did not cover, is asked of
      // Redis for its own answer (the units granted stay in the batch).
      if (refusal) return cost === 1 ? { ...refusal } : this.single('check', key, lim, cost, at);
      if (own && b.units < cost) return this.single('check', key, lim, cost, at);
    }
    return this.single('check', key, lim, cost, at);
  }

  /** One TAKE for the batch: null when it granted units (held now), the refusal when none. A
   * grant that arrives after the TAKE timed out is held all the same (given back when its hold
   * ends, or at once when the batch is gone: close()). */
  private async takeBatch(b: Batch, wanted: number, at: number | undefined): Promise<Decision | null> {
    const d = await this.guard(() => this.request('take', b.key, b.lim, wanted, at), (late) => {
      if (late.granted === 0) return;
      this.hold(b, late, at);
      if (!this.batches.current(b)) this.endHold(b);
    });
    if (d.granted === 0) return d;
    this.hold(b, d, at);
    return null;
  }

  /** Holds a TAKE's grant in the batch, for one hold time from now. */
  private hold(b: Batch, d: Decision, at: number | undefined): void {
    this.batches.hold(b, d, at);
    this.arm(b, b.lim.batchMs!);
  }

  /** The hold ends: the units left are given back (REFUND, at the batch's own time when it was
   * taken `at` one), a failure logged. */
  private endHold(b: Batch): void {
    const left = this.batches.release(b);
    if (left === null) return;
    this.denials?.dropKey(b.key);
    this.giveBack(`${left.units} unused units of a batch on ${b.key}`, () => this.request('refund', b.key, b.lim, left.units, left.at), () => {
      this.counters.batchRefunded += left.units;
    });
  }

  /** The batch's timer: ends the hold when it is over (requests may not come to end it), and
   * forgets the batch after two hold times without a request. */
  private arm(b: Batch, ms: number): void {
    clearTimeout(b.timer);
    b.timer = setTimeout(() => {
      const now = this.now();
      if (this.batches.expired(b, now)) this.endHold(b);
      const next = this.batches.next(b, now);
      if (next !== null) this.arm(b, next);
    }, ms);
    b.timer.unref?.();
  }

  /** The denial cache's entry for a call, after its arguments are checked; null without a cache. */
  private denialId(kind: 'check' | 'take', key: string, spec: LimitSpec, at: number | undefined): string | null {
    checkKey(key);
    checkSpec(spec);
    atArgs(at);
    if (!this.denials || !this.core.cacheable(spec)) return null;
    return `${kind}\n${key}\n${isPolicy(spec) ? `POLICY ${spec.name}` : limitArgs(spec).join(' ')}`;
  }

  /** Keeps a refusal Redis answered (not one of onError's). */
  private remember(id: string, key: string, spec: LimitSpec, cost: number, d: Decision): void {
    if ((d.source === 'module' || d.source === 'library') && this.core.cacheable(spec)) this.denials!.put(id, key, cost, d);
  }

  private counted<D extends Decision>(d: D): D {
    this.counters.decisions[d.source] += 1;
    return d;
  }

  /** One request against several limits, all or nothing (in a cluster, give the keys one hash
   * tag). The overall decision, and each limit's in `limits`. */
  async checkAll(limits: Array<[string, LimitSpec]>, options: CallOptions = {}): Promise<MultiDecision> {
    if (!Array.isArray(limits) || limits.length === 0) throw new TypeError('limits must be a non-empty array of [key, limit] pairs');
    const pairs = limits.map((pair, i) => {
      if (!Array.isArray(pair) || pair.length !== 2) throw new TypeError(`limits[${i}] must be a [key, limit] pair`);
      return [checkKey(pair[0], `limits[${i}][0] (a key)`), checkSpec(pair[1], `limits[${i}][1]`)] as [string, LimitSpec];
    });
    const cost = checkCost(options.cost ?? 1);
    const at = atArgs(options.at);
    const keys = pairs.map(([key]) => key);
    const core = this.core;
    return this.counted(await this.decide(0, async () => {
      const { reply, source, periods, peeked } = await this.run(
        async () => {
          const resolved = await Promise.all(pairs.map(([key, spec]) => this.resolveForModule(key, spec)));
          const plan = core.moduleCheckAll(keys, resolved, cost, at);
          // What enforcement would answer for each shadow policy, in the same round trip.
          const enforced = plan.peeks.map((peek, i) => (peek ? this.transport.send(peek, keys[i], true) : null));
          const [reply, ...peeked] = await Promise.all([this.transport.send(plan.args, keys[0]), ...enforced]);
          return { reply, periods: resolved.map((r) => r.periodMs), peeked };
        },
        async () => {
          const plan = core.libraryCheckAll(keys, pairs.map(([, spec]) => spec), cost, at);
          return { reply: await this.transport.send(plan.args, plan.key), periods: plan.periods, peeked: [] as unknown[] };
        },
      );
      return core.readCheckAll(reply, source, periods, cost, peeked);
    }, cost, () => core.checkAllLocally(pairs, cost, options.at ?? Date.now()), true, (late) => {
      // Admitted after the call timed out: its cost goes back on every limit.
      if (!late.allowed || cost === 0) return;
      for (const [key, spec] of pairs) {
        this.giveBack(`${cost} units admitted on ${key} after the call timed out`, () => this.request('refund', key, spec, cost, options.at));
      }
    }));
  }

  /** Deletes limiters: how many it removed (in a cluster, keys of one slot). */
  async reset(...keys: string[]): Promise<number> {
    if (keys.length === 0) throw new TypeError('reset needs at least one key');
    keys.forEach((key, i) => checkKey(key, keys.length === 1 ? 'key' : `keys[${i}]`));
    keys.forEach((key) => this.denials?.dropKey(key));
    return this.strict(async () => {
      const { reply } = await this.run(
        () => this.sendPlan(this.core.reset(keys, false)),
        () => this.sendPlan(this.core.reset(keys, true)),
      );
      return integerReply(reply);
    });
  }

  /** Takes (or renews) the lease `id` on a concurrency limit of `n` in flight on `key`, for
   * `lease` (the period's syntax) or until released. */
  async acquire(key: string, n: number, lease: Period, options: { id: string; cost?: number; at?: number }): Promise<Decision> {
    checkKey(key);
    const limitN = checkCost(n, 1, 'n');
    const leaseMs = periodMs(lease, 'lease');
    const id = options?.id;
    if (typeof id !== 'string' || id === '') throw new TypeError(`id must be a non-empty string, the id the lease is held under (release it with the same), not ${describe(id)}`);
    const cost = checkCost(options.cost ?? 1, 1);
    const rest = [String(limitN), String(lease), 'ID', id, 'COST', String(cost), ...atArgs(options.at)];
    const core = this.core;
    return this.counted(await this.decide(leaseMs, async () => {
      const { reply, source } = await this.run(
        () => this.sendPlan(core.acquire(key, rest, false)),
        () => this.sendPlan(core.acquire(key, rest, true)),
      );
      return decision(reply, source, leaseMs, cost);
    }, cost, null, false, (late) => {
      // A lease granted after the call timed out: nobody holds it, it is released.
      if (!late.allowed) return;
      const at = atArgs(options.at);
      this.giveBack(`the lease ${id} on ${key}, granted after the call timed out`, () => this.run(
        () => this.sendPlan(core.release(key, id, at, false)),
        () => this.sendPlan(core.release(key, id, at, true)),
      ));
    }));
  }

  /** Gives the lease `id` back: 1 if it held a live lease, else 0. */
  async release(key: string, id: string, options: { at?: number } = {}): Promise<number> {
    checkKey(key);
    if (typeof id !== 'string' || id === '') throw new TypeError(`id must be a non-empty string, the one the lease was acquired with, not ${describe(id)}`);
    const at = atArgs(options.at);
    return this.strict(async () => {
      const { reply } = await this.run(
        () => this.sendPlan(this.core.release(key, id, at, false)),
        () => this.sendPlan(this.core.release(key, id, at, true)),
      );
      return integerReply(reply);
    });
  }

  /** Runs `work` holding a lease (a random id) on `key`'s concurrency limit of `n`, released in a
   * `finally` however `work` ends; rejects with RateLimited if there is no room. Where Redis is
   * unavailable and onError is `'open'`, `work` runs without a lease. */
  async withLease<T>(
    key: string,
    n: number,
    lease: Period,
    work: (decision: Decision) => Promise<T> | T,
    options: { cost?: number; id?: string } = {},
  ): Promise<T> {
    if (typeof work !== 'function') throw new TypeError(`work must be a function to run holding the lease, not ${describe(work)}`);
    const id = options.id ?? randomUUID();
    const acquired = await this.acquire(key, n, lease, { id, cost: options.cost ?? 1 });
    if (!acquired.allowed) throw new RateLimited(acquired, `no lease on ${key}: ${n} in flight; retry in ${acquired.retryAfterMs} ms`);
    try {
      return await work(acquired);
    } finally {
      if (acquired.source !== 'error') {
        try {
          await this.release(key, id);
        } catch (error) {
          // eslint-disable-next-line no-unsafe-finally -- a release failing for another reason than Redis is the caller's to see, over work's outcome
          if (!(error instanceof RateLimitUnavailable)) throw error;
          this.core.warnOnce(`release:${error.message}`, `ratelimit: the lease ${id} on ${key} was not released (${error.message}); it expires by itself`);
        }
      }
    }
  }

  // ---- the engines ----

  private single(command: Command, key: string, spec: LimitSpec, cost: number, atMs: number | undefined): Promise<Decision> {
    checkKey(key);
    checkSpec(spec);
    atArgs(atMs);
    // What a CHECK or TAKE answered after its timeout consumed goes back: its caller has had
    // onError's answer.
    const late = command === 'check' || command === 'take' ? (d: Decision) => this.lateGrant(key, spec, d, atMs) : undefined;
    return this.decide(this.core.knownPeriodMs(spec), () => this.request(command, key, spec, cost, atMs),
      command === 'refund' ? 0 : cost, () => this.decideLocally(command, key, spec, cost, atMs), false, late);
  }

  /** onError 'local' for a call on one limit, at `at` or the machine's clock. */
  private decideLocally(command: Command, key: string, spec: LimitSpec, cost: number, at: number | undefined): Decision | null {
    return this.core.decideLocally(command, key, spec, cost, at ?? Date.now());
  }

  /** A decision whose caller went away (its call timed out): what it consumed is given back. */
  private lateGrant(key: string, spec: LimitSpec, d: Decision, at: number | undefined): void {
    if (!d.allowed || d.granted === 0 || d.shadowRejected) return;
    this.giveBack(`${d.granted} units granted on ${key} after the call timed out`, () => this.request('refund', key, spec, d.granted, at));
  }

  /** One call on one limit, sent to the engine in use (no onError: RateLimitUnavailable as the
   * guard raises it). */
  private request(command: Command, key: string, spec: LimitSpec, cost: number, atMs: number | undefined): Promise<Decision> {
    if (this.core.inUse === 'module' && !isPolicy(spec)) {
      // The module serves and the limit is inline: the command straight away, its arguments from
      // the limit's cached ones (the general path below resolves, in more steps, to the same).
      if (this.core.formUnknown) this.askForm();
      const args = this.core.inlineArgs(command, key, spec, cost, atMs);
      return this.transport.send(args, key, command === 'peek').then(
        (reply) => this.core.read(command, reply, 'module', spec.periodMs, cost),
        (error) => {
          if (!this.core.oneArgRefused(error) && !this.core.moduleFailed(error)) throw error;
          return this.requestResolved(command, key, spec, cost, atMs);
        },
      );
    }
    return this.requestResolved(command, key, spec, cost, atMs);
  }

  private async requestResolved(command: Command, key: string, spec: LimitSpec, cost: number, atMs: number | undefined): Promise<Decision> {
    const at = atArgs(atMs);
    const core = this.core;
    const { reply, source, periodMs: period, peeked } = await this.run(
      async () => {
        const plan = core.moduleCall(command, key, await this.resolveForModule(key, spec), cost, at);
        if (plan.peek) {
          // What enforcement would answer, sent in the same round trip (pipelined).
          const enforced = this.transport.send(plan.peek, key, true);
          const [peeked, reply] = await Promise.all([enforced, this.transport.send(plan.args, key, plan.readonly)]);
          return { reply, periodMs: plan.periodMs, peeked };
        }
        return { reply: await this.transport.send(plan.args, key, plan.readonly), periodMs: plan.periodMs, peeked: undefined as unknown };
      },
      async () => {
        const plan = core.libraryCall(command, key, spec, cost, at);
        return { reply: await this.transport.send(plan.args, plan.key, plan.readonly), periodMs: plan.periodMs, peeked: undefined as unknown };
      },
    );
    return core.read(command, reply, source, period, cost, peeked);
  }

  /** A spec's module arguments: the engine resolves it, with a policy's definition read first
   * (at its first use, then again in the background every policyRefreshMs). */
  private async resolveForModule(key: string, spec: LimitSpec): Promise<ReturnType<Engine['resolve']>> {
    if (!isPolicy(spec)) return this.core.resolve(spec, null);
    return this.core.resolve(spec, await this.definition(spec.name, key));
  }

  private async definition(name: string, key: string): Promise<PolicyDefinition | null> {
    const core = this.core;
    const fetch = async () => {
      const definition = policyDefinition(name, await this.transport.send(core.policyGet(name), key, true));
      core.learned(name, definition);
      return definition;
    };
    const { definition, fetch: read } = core.definitionOf(name);
    if (read === 'wait') return fetch();
    if (read === 'refresh') fetch().catch(() => core.refreshFailed(name));
    return definition;
  }

  /** @internal a policy changed here: read it again at its next use; its refusals are void. */
  _forget(name: string): void {
    this.core.forget(name);
    this.denials?.dropMatching(`\nPOLICY ${name}`);
  }

  /** Sends a planned command (its key routes it). */
  private async sendPlan(plan: { args: string[]; key: string }): Promise<{ reply: unknown }> {
    return { reply: await this.transport.send(plan.args, plan.key) };
  }

  /** Runs a call on the engine in use: the module's command, or, where the server does not know
   * it, the library's function (loaded first when needed). */
  private async run<T extends object>(onModule: () => Promise<T>, onLibrary: () => Promise<T>): Promise<T & { source: Source }> {
    const core = this.core;
    if (core.inUse !== 'library') {
      if (core.formUnknown) this.askForm();
      try {
        const result = await onModule();
        core.moduleAnswered();
        return { ...result, source: 'module' };
      } catch (error) {
        if (core.oneArgRefused(error)) {
          const result = await onModule(); // (its specs as words now)
          core.moduleAnswered();
          return { ...result, source: 'module' };
        }
        if (!core.moduleFailed(error)) throw error;
      }
    }
    await this.ensureLibrary();
    core.libraryServes();
    try {
      return { ...(await onLibrary()), source: 'library' };
    } catch (error) {
      if (!functionNotFound(error) || !core.loadLibrary) throw error;
      // Flushed, or a primary added since: load it again, once.
      this.libraryReady = null;
      await this.ensureLibrary();
      return { ...(await onLibrary()), source: 'library' };
    }
  }

  /** Asks how the module takes a limit spec (`COMMAND INFO`, any node of a cluster), once, beside
   * the module call about to be sent (pipelined: no round trip of its own; not in `stats`): the
   * calls after its answer send the form it says. */
  private askForm(): void {
    const core = this.core;
    const args = core.formToAsk();
    if (args === null) return;
    try {
      this.uncounted.send(args, undefined, true).then(
        (reply) => core.formFound(reply),
        (error: unknown) => core.formFailed(error),
      );
    } catch (error) {
      core.formFailed(error);
    }
  }

  private ensureLibrary(): Promise<void> {
    if (!this.core.loadLibrary) return Promise.resolve();
    if (!this.libraryReady) {
      this.libraryReady = this.loadLibrary().catch((error) => {
        this.libraryReady = null;
        throw error;
      });
    }
    return this.libraryReady;
  }

  /** On every primary: load the library if it is missing, replace it if it lacks functions the
   * package's has (older), leave it if it is the package's or another with all of them. */
  private async loadLibrary(): Promise<void> {
    const primaries = await this.transport.primaries();
    await Promise.all(
      primaries.map(async (send) => {
        const action = libraryAction(await send(['FUNCTION', 'LIST', 'LIBRARYNAME', LIBRARY_NAME, 'WITHCODE']));
        if (action === 'load') {
          try {
            await send(['FUNCTION', 'LOAD', LIBRARY]);
          } catch (error) {
            if (!this.core.loadedMeanwhile(error)) throw error;
            return;
          }
        } else if (action === 'replace') {
          await send(['FUNCTION', 'LOAD', 'REPLACE', LIBRARY]);
        }
        if (action !== 'keep') this.core.libraryLoaded(action);
      }),
    );
  }

  // ---- bounds, breaker, onError ----

  /** A call that goes to Redis: refused at once while the breaker is open; bounded by timeoutMs;
   * RateLimitUnavailable when Redis is unavailable; the client's error as is otherwise. `late`
   * receives the result of a call that answered after its timeout fired (its caller has had
   * onError's answer): what it consumed is given back there. */
  private guard<T>(work: () => Promise<T>, late?: (value: T) => void): Promise<T> {
    const core = this.core;
    if (!core.breaker.allow()) return Promise.reject(new RateLimitUnavailable('Redis unavailable: the breaker is open (recent calls failed)'));
    return this.bound(work, late).then(
      (result) => {
        core.answered();
        return result;
      },
      (error) => {
        throw core.failed(error);
      },
    );
  }

  /** `work()` raced against the limiter's deadline (a Timeout); `late` as for guard; `counted`:
   * a late answer counts in `stats.lateReplies` (a call's, not a refund's). */
  private bound<T>(work: () => Promise<T>, late?: (value: T) => void, counted = true): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      let running: Promise<T>;
      try {
        running = work();
      } catch (error) {
        reject(error);
        return;
      }
      const call: Bounded = {
        deadline: 0,
        settled: false,
        expire: () => {
          call.settled = true;
          reject(new Timeout(`Redis did not answer within ${this.timeoutMs} ms`));
          // Whatever it answers now, nobody waits for it: what it took goes back (`late`), and
          // close() waits for it.
          const after = running.then(
            (value) => {
              if (counted) this.counters.lateReplies += 1;
              late?.(value);
            },
            () => {},
          );
          this.late.add(after);
          void after.finally(() => this.late.delete(after));
        },
      };
      running.then(
        (value) => {
          if (call.settled) return;
          call.settled = true;
          this.deadlines.settled();
          resolve(value);
        },
        (error: unknown) => {
          if (call.settled) return;
          call.settled = true;
          this.deadlines.settled();
          reject(error);
        },
      );
      this.deadlines.add(call);
    });
  }

  /** A decision, with onError applied (`late` as for guard). */
  private decide<D extends Decision>(
    periodMs: number,
    work: () => Promise<D>,
    granted: number,
    local: (() => D | null) | null = null,
    multi = false,
    late?: (value: D) => void,
  ): Promise<D> {
    return this.guard(work, late).catch((error) => this.core.unavailable(error, periodMs, granted, local, multi));
  }

  /** Gives back in the background what a call took (a batch's unused units, a grant whose caller
   * went away): `send` bounded by timeoutMs, `done` when it is answered (even after its timeout),
   * a failure logged. close() waits for it. */
  private giveBack(what: string, send: () => Promise<unknown>, done?: () => void): void {
    let counted = false;
    const count = () => {
      if (!counted) done?.();
      counted = true;
    };
    const back = this.bound(send, count, false).then(count, (error) => {
      this.core.giveBackFailed(what, error);
    });
    this.refunds.add(back);
    void back.finally(() => this.refunds.delete(back));
  }

  /** A call without a decision to fall back to: RateLimitUnavailable whatever onError says. */
  private strict<T>(work: () => Promise<T>): Promise<T> {
    return this.guard(work);
  }

  /** @internal policies: on one server, or every primary for writes (the replies, one each). */
  async _admin(args: string[], everywhere: boolean): Promise<unknown> {
    return this.strict(async () => {
      try {
        if (!everywhere) return await this.transport.send(args, undefined, true);
        const primaries = await this.transport.primaries();
        return await Promise.all(primaries.map((send) => send(args)));
      } catch (error) {
        throw this.core.adminError(error);
      }
    });
  }
}
