// RateLimiter: the engines (the module, else the Functions library it loads), the bound on every
// call (timeoutMs), the breaker, and onError (the in-process limiter of local.ts for 'local'); the
// decisions without a round trip: the denial cache (cache.ts) and batches. It sends what the core
// builds and returns what the core reads.

import { randomUUID } from 'node:crypto';

import {
  atArgs,
  checkCost,
  checkKey,
  checkSpec,
  decision,
  errorDecision,
  integerReply,
  isLimit,
  isPolicy,
  limit,
  limitArgs,
  multiDecision,
  pairs,
  periodMs,
  policyDefinition,
  strings,
  type Decision,
  type Limit,
  type LimitSpec,
  type MultiDecision,
  type Period,
  type Policy,
  type PolicyDefinition,
  type Source,
} from './core.js';
import { isReplyError, isUnavailable, replyMessage, transport, type Transport } from './client.js';
import { RateLimited, RateLimitError, RateLimitUnavailable } from './errors.js';
import { LIBRARY } from './generated/library.js';
import { LocalLimiter, localDecision, type Reply } from './local.js';
import { DenialCache } from './cache.js';

/** The default bound on every call: a limiter in front of a request must not add more. */
export const DEFAULT_TIMEOUT_MS = 100;
/** The most close() waits for the answers of calls that timed out, by default. */
const CLOSE_WAIT_MS = 5000;

/** The most keys the in-process limiter of `onError: 'local'` holds. */
const LOCAL_KEYS = 10000;

/** ⌊x · share⌋, at least 1, exactly: the share read as the decimal it prints as. */
function share(x: number, fraction: number): number {
  const [digits, exponent = '0'] = fraction.toExponential().split('e');
  const [whole, decimals = ''] = digits.split('.');
  const numerator = BigInt(whole + decimals);
  const power = Number(exponent) - decimals.length;
  const scaled = power >= 0 ? BigInt(x) * numerator * 10n ** BigInt(power) : (BigInt(x) * numerator) / 10n ** BigInt(-power);
  return Math.max(1, Number(scaled));
}

/** The transport with every command counted (`rl.stats.commands`). */
function counting(inner: Transport, count: () => void): Transport {
  return {
    kind: inner.kind,
    cluster: inner.cluster,
    send: (args, key, readonly) => {
      count();
      return inner.send(args, key, readonly);
    },
    primaries: async () =>
      (await inner.primaries()).map((send) => (args: string[]) => {
        count();
        return send(args);
      }),
  };
}

function describeValue(value: unknown): string {
  return typeof value === 'string' ? `'${value}'` : String(value);
}

/** The Functions library's name, as `#!lua name=ratelimit` declares it. */
export const LIBRARY_NAME = 'ratelimit';
/** The functions the shipped library registers. */
const LIBRARY_FUNCTIONS = [...LIBRARY.matchAll(/function_name\s*=\s*'([a-z_]+)'/g)].map((m) => m[1]);

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
}

export interface RateLimiterOptions {
  /** Redis down, refusing, not answering within `timeoutMs`, or the breaker open: `'open'`
   * (default) answers admitted decisions with `source: 'error'`; `'closed'` rejects with
   * RateLimitUnavailable; `'local'` decides with an exact in-process limiter of the same
   * algorithm and parameters (`source: 'fallback'`), scaled by `localShare`. */
  onError?: 'open' | 'closed' | 'local';
  /** With `onError: 'local'`: the share of each limit this process may admit on its own while
   * Redis is unavailable, more than 0 and at most 1 (default 1): the local limit and burst are
   * ⌊x · localShare⌋, at least 1. */
  localShare?: number;
  /** The most any call may take, whatever the client's own settings (default 100 ms). */
  timeoutMs?: number;
  /** `'auto'` (default): the module's commands, else the Functions library; or only one. */
  engine?: 'auto' | 'module' | 'library';
  /** The prefix of the library's keys (default `'fn:'`): the engines never share a key. */
  libraryPrefix?: string;
  /** Load the library when it is missing or older than the package's (default true). */
  loadLibrary?: boolean;
  /** After `failures` consecutive calls that found Redis unavailable (default 3), apply onError
   * at once for `cooldownMs` (default 1000), letting one probe through per cool-down. */
  breaker?: { failures?: number; cooldownMs?: number };
  /** How long a policy's definition (its mode, its period) is used before it is read again
   * (default 10000 ms). */
  policyRefreshMs?: number;
  /** Where the limiter says which engine serves and what it did (default: console). */
  logger?: Logger;
  /** A bounded LRU of this many refusals, each answered again locally (`source: 'cache'`) until
   * its `retryAfterMs` has passed, for a request of the same key and limit asking at least as
   * much; 0 (default): off. */
  denialCache?: number;
  /** The limiter's monotonic clock in ms (default `performance.now`): the breaker, the policy
   * cache, the denial cache and batches' hold times; tests give their own. */
  now?: () => number;
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

class Breaker {
  private failures = 0;
  private openUntil = 0;
  private probing = false;
  constructor(
    private readonly threshold: number,
    private readonly cooldownMs: number,
    private readonly now: () => number,
  ) {}

  /** Whether a call may go to Redis now: always while closed; one probe per cool-down while open. */
  allow(): boolean {
    if (this.failures < this.threshold) return true;
    if (this.probing || this.now() < this.openUntil) return false;
    this.probing = true;
    return true;
  }

  success(): void {
    this.failures = 0;
    this.probing = false;
  }

  failure(): void {
    this.failures += 1;
    this.probing = false;
    if (this.failures >= this.threshold) this.openUntil = this.now() + this.cooldownMs;
  }

  get open(): boolean {
    return this.failures >= this.threshold;
  }
}

class Timeout extends Error {}

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

/** The calls on one limit, and the module's command for each. */
type Command = 'check' | 'peek' | 'refund' | 'take';
const COMMANDS: Record<Command, string> = { check: 'RATELIMIT.CHECK', peek: 'RATELIMIT.PEEK', refund: 'RATELIMIT.REFUND', take: 'RATELIMIT.TAKE' };

const unknownCommand = (error: unknown) => isReplyError(error) && /^ERR unknown command/i.test(error.message);
const functionNotFound = (error: unknown) => isReplyError(error) && /Function not found/i.test(error.message);
const noSuchPolicy = (error: unknown) => isReplyError(error) && /^ERR no such policy/.test(error.message);

interface CachedPolicy {
  definition: PolicyDefinition | null;
  fetchedAt: number;
  refreshing?: Promise<unknown>;
}

/** One key's batch of a limit: the units this process took (TAKE) and has not admitted yet. */
interface Batch {
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
  /** The TAKE in flight: null when it granted, the refusal when it did not. */
  inFlight: Promise<Decision | null> | null;
  /** Units asked by callers waiting for it. */
  waiting: number;
  /** Units asked in the current and the previous interval of one hold time. */
  demandSince: number;
  demandNow: number;
  demandBefore: number;
  lastAsked: number;
  timer?: ReturnType<typeof setTimeout>;
}

/** A spec resolved for the engine in use: the arguments to send and what goes with them. */
interface Resolved {
  args: string[];
  periodMs: number;
  /** A shadow policy's definition inline, to learn what enforcement would answer. */
  shadowAs?: Limit;
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
  if (typeof name !== 'string' || name === '') throw new TypeError(`name must be a non-empty string (a policy's name), not ${describeValue(name)}`);
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
  private readonly engineOption: 'auto' | 'module' | 'library';
  private readonly loadLibraryOption: boolean;
  private readonly breaker: Breaker;
  private readonly policyRefreshMs: number;
  private readonly logger: Logger;
  private readonly now: () => number;
  private engineInUse: 'module' | 'library' | null = null;
  private libraryReady: Promise<void> | null = null;
  private readonly cache = new Map<string, CachedPolicy>();
  private readonly local = new LocalLimiter({ maxKeys: LOCAL_KEYS });
  private readonly denials: DenialCache | null;
  private readonly batches = new Map<string, Batch>();
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
  private readonly scaledLimits = new WeakMap<Limit, Limit>();
  private readonly limitArgsCache = new WeakMap<Limit, string[]>();
  private readonly warned = new Set<string>();
  private down = false;
  private libraryAnnounced = false;

  constructor(client: unknown, options: RateLimiterOptions = {}) {
    this.transport = counting(transport(client), () => (this.counters.commands += 1));
    const { onError = 'open', timeoutMs = DEFAULT_TIMEOUT_MS, engine = 'auto', libraryPrefix = 'fn:', loadLibrary = true } = options;
    if (!['open', 'closed', 'local'].includes(onError)) throw new TypeError(`onError must be 'open', 'closed' or 'local', not ${describeValue(onError)}`);
    const localShare = options.localShare ?? 1;
    if (typeof localShare !== 'number' || Number.isNaN(localShare)) throw new TypeError(`localShare must be a number, not ${describeValue(localShare)}`);
    if (!(localShare > 0 && localShare <= 1)) throw new RangeError(`localShare must be more than 0 and at most 1, not ${localShare}`);
    this.localShare = localShare;
    if (!['auto', 'module', 'library'].includes(engine)) throw new TypeError(`engine must be 'auto', 'module' or 'library', not ${describeValue(engine)}`);
    if (!(typeof timeoutMs === 'number' && Number.isFinite(timeoutMs) && timeoutMs > 0)) throw new TypeError(`timeoutMs must be a positive number of ms, not ${describeValue(timeoutMs)}`);
    if (typeof libraryPrefix !== 'string') throw new TypeError(`libraryPrefix must be a string, not ${describeValue(libraryPrefix)}`);
    if (typeof loadLibrary !== 'boolean') throw new TypeError(`loadLibrary must be true or false, not ${describeValue(loadLibrary)}`);
    const failures = options.breaker?.failures ?? 3;
    const cooldownMs = options.breaker?.cooldownMs ?? 1000;
    if (!(Number.isInteger(failures) && failures >= 1)) throw new TypeError(`breaker.failures must be an integer of at least 1, not ${describeValue(failures)}`);
    if (!(typeof cooldownMs === 'number' && Number.isFinite(cooldownMs) && cooldownMs >= 0)) throw new TypeError(`breaker.cooldownMs must be a number of ms, not ${describeValue(cooldownMs)}`);
    this.onError = onError;
    this.timeoutMs = timeoutMs;
    this.deadlines = new Deadlines(timeoutMs);
    this.engineOption = engine;
    this.libraryPrefix = libraryPrefix;
    this.loadLibraryOption = loadLibrary;
    if (options.now !== undefined && typeof options.now !== 'function') throw new TypeError(`now must be a function answering ms (a monotonic clock), not ${describeValue(options.now)}`);
    this.now = options.now ?? (() => performance.now());
    const denials = options.denialCache ?? 0;
    if (typeof denials !== 'number' || !Number.isInteger(denials)) throw new TypeError(`denialCache must be an integer (a number of refusals), not ${describeValue(denials)}`);
    if (denials < 0) throw new RangeError(`denialCache must be 0 (off) or more, not ${denials}`);
    this.denials = denials > 0 ? new DenialCache(denials, this.now) : null;
    this.breaker = new Breaker(failures, cooldownMs, this.now);
    const policyRefreshMs = options.policyRefreshMs ?? 10000;
    if (!(typeof policyRefreshMs === 'number' && Number.isFinite(policyRefreshMs) && policyRefreshMs >= 0)) {
      throw new TypeError(`policyRefreshMs must be a number of ms, not ${describeValue(policyRefreshMs)}`);
    }
    this.policyRefreshMs = policyRefreshMs;
    const logger = options.logger ?? console;
    if (typeof logger?.info !== 'function' || typeof logger?.warn !== 'function') throw new TypeError('logger must have info(message) and warn(message)');
    this.logger = logger;
    this.policies = new Policies(this);
    if (engine !== 'auto') this.engineInUse = engine;
  }

  /** The engine that served the last call: `'module'`, `'library'`, or null before the first. */
  get engine(): 'module' | 'library' | null {
    return this.engineInUse;
  }

  /** Whether the breaker is open (calls answer onError at once but for one probe per cool-down). */
  get breakerOpen(): boolean {
    return this.breaker.open;
  }

  /** Decides one request of `cost` (default 1) on `key`; consumes it if admitted. */
  check(key: string, spec: LimitSpec, options: CallOptions = {}): Promise<Decision> {
    // The common case, an inline limit without batches or a denial cache on the module, in one
    // step; the rest below. Both answer the same.
    if (this.denials === null && this.engineInUse === 'module' && isLimit(spec) && spec.batchMs === undefined) {
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
    const args = [COMMANDS.check, key, ...this.argsOf(lim), 'COST', String(cost)];
    if (at !== undefined) args.push('AT', String(at));
    return new Promise<Decision>((resolve, reject) => {
      // Redis unavailable (onError), or the caller's mistake (rejects).
      const fallBack = (error: unknown) => {
        try {
          resolve(this.counted(this.unavailable(this.failed(error), lim.periodMs, cost, () => this.decideLocally('check', key, lim, cost, at))));
        } catch (failure) {
          reject(failure);
        }
      };
      if (!this.breaker.allow()) {
        fallBack(new RateLimitUnavailable('Redis unavailable: the breaker is open (recent calls failed)'));
        return;
      }
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
          this.answered();
          resolve(this.counted(d));
        },
        (error) => {
          if (call.settled) return;
          call.settled = true;
          this.deadlines.settled();
          if (this.engineOption === 'auto' && unknownCommand(error)) {
            this.engineInUse = 'library'; // the module is gone: the library from now on
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
    if (!(Number.isFinite(waitMs) && waitMs >= 0)) throw new TypeError(`waitMs must be a number of ms, not ${describeValue(waitMs)}`);
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
    const b = this.batchFor(key, lim);
    this.noteDemand(b, cost);
    for (let round = 0; round < 4; round += 1) {
      if (b.units > 0 && this.now() >= b.holdEnd) this.endHold(b);
      if (b.units >= cost) return this.fromBatch(b, cost);
      let refusal: Decision | null;
      const own = !b.inFlight;
      if (b.inFlight) {
        b.waiting += cost;
        try {
          refusal = await b.inFlight;
        } catch (error) {
          return this.unavailable(error, lim.periodMs, cost, () => this.decideLocally('check', key, lim, cost, at));
        } finally {
          b.waiting -= cost;
        }
      } else {
        // Fewer units than this request: given back, and a batch of at least its cost taken.
        if (b.units > 0) this.endHold(b);
        const wanted = Math.max(cost, Math.min(lim.batchMax ?? lim.limit, Math.max(this.demand(b), cost + b.waiting)));
        const taking = this.takeBatch(b, wanted, at);
        b.inFlight = taking;
        try {
          refusal = await taking;
        } catch (error) {
          return this.unavailable(error, lim.periodMs, cost, () => this.decideLocally('check', key, lim, cost, at));
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

  /** The batch of a key and limit, made at its first request. */
  private batchFor(key: string, lim: Limit): Batch {
    const id = `${key}\n${limitArgs(lim).join(' ')}`;
    let b = this.batches.get(id);
    if (!b) {
      const now = this.now();
      b = { id, key, lim, units: 0, holdEnd: 0, now0: now, taken: null, delayUntil: 0, resetUntil: 0, inFlight: null, waiting: 0, demandSince: now, demandNow: 0, demandBefore: 0, lastAsked: now };
      this.batches.set(id, b);
    }
    return b;
  }

  /** Counts `cost` asked in the current hold-long interval of the batch's demand. */
  private noteDemand(b: Batch, cost: number): void {
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
  private demand(b: Batch): number {
    const hold = b.lim.batchMs!;
    const into = Math.min(hold, Math.max(0, this.now() - b.demandSince));
    return Math.ceil(b.demandNow + (b.demandBefore * (hold - into)) / hold);
  }

  /** One TAKE for the batch: null when it granted units (held now), the refusal when none. A
   * grant that arrives after the TAKE timed out is held all the same (given back when its hold
   * ends, or at once when the batch is gone: close()). */
  private async takeBatch(b: Batch, wanted: number, at: number | undefined): Promise<Decision | null> {
    const d = await this.guard(() => this.request('take', b.key, b.lim, wanted, at), (late) => {
      if (late.granted === 0) return;
      this.hold(b, late, at);
      if (this.batches.get(b.id) !== b) this.endHold(b);
    });
    if (d.granted === 0) return d;
    this.hold(b, d, at);
    return null;
  }

  /** Holds a TAKE's grant in the batch, for one hold time from now. */
  private hold(b: Batch, d: Decision, at: number | undefined): void {
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
    this.arm(b, b.lim.batchMs!);
  }

  /** Admits `cost` from the units held. The numbers: the TAKE's, with `remaining` the units
   * still held, and the times counted down since. */
  private fromBatch(b: Batch, cost: number): Decision {
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

  /** The hold ends: the units left are given back (REFUND, at the batch's own time when it was
   * taken `at` one), a failure logged. */
  private endHold(b: Batch): void {
    const units = b.units;
    b.units = 0;
    b.holdEnd = 0;
    if (units === 0) return;
    this.counters.held -= units;
    this.denials?.dropKey(b.key);
    const at = b.at0 === undefined ? undefined : b.at0 + Math.floor(this.now() - b.now0);
    this.giveBack(`${units} unused units of a batch on ${b.key}`, () => this.request('refund', b.key, b.lim, units, at), () => {
      this.counters.batchRefunded += units;
    });
  }

  /** The batch's timer: ends the hold when it is over (requests may not come to end it), and
   * forgets the batch after two hold times without a request. */
  private arm(b: Batch, ms: number): void {
    clearTimeout(b.timer);
    b.timer = setTimeout(() => {
      const now = this.now();
      const hold = b.lim.batchMs!;
      if (b.units > 0 && now >= b.holdEnd) this.endHold(b);
      if (b.units === 0 && b.inFlight === null && now - b.lastAsked >= 2 * hold) {
        if (this.batches.get(b.id) === b) this.batches.delete(b.id);
        return;
      }
      this.arm(b, b.units > 0 ? Math.max(1, Math.ceil(b.holdEnd - now)) : hold);
    }, ms);
    b.timer.unref?.();
  }

  /** The denial cache's entry for a call, after its arguments are checked; null without a cache. */
  private denialId(kind: 'check' | 'take', key: string, spec: LimitSpec, at: number | undefined): string | null {
    checkKey(key);
    checkSpec(spec);
    atArgs(at);
    if (!this.denials || !this.cacheable(spec)) return null;
    return `${kind}\n${key}\n${isPolicy(spec) ? `POLICY ${spec.name}` : limitArgs(spec).join(' ')}`;
  }

  /** Whether refusals of a limit may be answered again here: not with a BLOCK (a refusal after
   * a block ends starts another, which an answer from here would skip). A policy's block is
   * known from its definition once read (else its fallback's applies: the library, or the
   * server without it). */
  private cacheable(spec: LimitSpec): boolean {
    if (!isPolicy(spec)) return spec.block === undefined;
    const definition = this.cache.get(spec.name)?.definition;
    if (definition) return definition.blockMs === 0;
    return spec.fallback === undefined || spec.fallback.block === undefined;
  }

  /** Keeps a refusal Redis answered (not one of onError's). */
  private remember(id: string, key: string, spec: LimitSpec, cost: number, d: Decision): void {
    if ((d.source === 'module' || d.source === 'library') && this.cacheable(spec)) this.denials!.put(id, key, cost, d);
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
    return this.counted(await this.decide(0, async () => {
      const { reply, source, periods, peeked } = await this.run(
        async () => {
          const resolved = await Promise.all(pairs.map(([key, spec]) => this.resolveForModule(key, spec)));
          const args = ['RATELIMIT.CHECKALL', String(keys.length), ...keys, ...resolved.flatMap((r) => r.args), 'COST', String(cost), ...at];
          // What enforcement would answer for each shadow policy, in the same round trip.
          const enforced = resolved.map((r, i) => r.shadowAs
            ? this.transport.send(['RATELIMIT.PEEK', keys[i], ...limitArgs(r.shadowAs), 'COST', String(cost), ...at], keys[i], true)
            : null);
          const [reply, ...peeked] = await Promise.all([this.transport.send(args, keys[0]), ...enforced]);
          return { reply, periods: resolved.map((r) => r.periodMs), peeked };
        },
        async () => {
          const inline = pairs.map(([, spec]) => this.fallback(spec));
          const prefixed = keys.map((key) => this.libraryPrefix + key);
          const args = ['FCALL', 'ratelimit_checkall', String(keys.length), ...prefixed, ...inline.flatMap((l) => limitArgs(l)), 'COST', String(cost), ...at];
          return { reply: await this.transport.send(args, prefixed[0]), periods: inline.map((l) => l.periodMs), peeked: [] as unknown[] };
        },
      );
      const d = multiDecision(reply, source, periods, cost);
      d.limits.forEach((limitDecision, i) => {
        const peek = peeked[i];
        if (peek !== null && peek !== undefined) limitDecision.shadowRejected = limitDecision.allowed && !decision(peek, source, 0).allowed;
      });
      d.shadowRejected = d.allowed && d.limits.some((l) => l.shadowRejected);
      return d;
    }, cost, () => this.checkAllLocally(pairs, cost, options.at), true, (late) => {
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
        async () => ({ reply: await this.transport.send(['RATELIMIT.RESET', ...keys], keys[0]) }),
        async () => {
          const prefixed = keys.map((key) => this.libraryPrefix + key);
          return { reply: await this.transport.send(['FCALL', 'ratelimit_reset', String(keys.length), ...prefixed], prefixed[0]) };
        },
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
    if (typeof id !== 'string' || id === '') throw new TypeError(`id must be a non-empty string, the id the lease is held under (release it with the same), not ${describeValue(id)}`);
    const cost = checkCost(options.cost ?? 1, 1);
    const rest = [String(limitN), String(lease), 'ID', id, 'COST', String(cost), ...atArgs(options.at)];
    return this.counted(await this.decide(leaseMs, async () => {
      const { reply, source } = await this.run(
        async () => ({ reply: await this.transport.send(['RATELIMIT.ACQUIRE', key, ...rest], key) }),
        async () => {
          const k = this.libraryPrefix + key;
          return { reply: await this.transport.send(['FCALL', 'ratelimit_acquire', '1', k, ...rest], k) };
        },
      );
      return decision(reply, source, leaseMs, cost);
    }, cost, null, false, (late) => {
      // A lease granted after the call timed out: nobody holds it, it is released.
      if (!late.allowed) return;
      this.giveBack(`the lease ${id} on ${key}, granted after the call timed out`, () => this.run(
        async () => ({ reply: await this.transport.send(['RATELIMIT.RELEASE', key, 'ID', id, ...atArgs(options.at)], key) }),
        async () => {
          const k = this.libraryPrefix + key;
          return { reply: await this.transport.send(['FCALL', 'ratelimit_release', '1', k, 'ID', id, ...atArgs(options.at)], k) };
        },
      ));
    }));
  }

  /** Gives the lease `id` back: 1 if it held a live lease, else 0. */
  async release(key: string, id: string, options: { at?: number } = {}): Promise<number> {
    checkKey(key);
    if (typeof id !== 'string' || id === '') throw new TypeError(`id must be a non-empty string, the one the lease was acquired with, not ${describeValue(id)}`);
    const at = atArgs(options.at);
    return this.strict(async () => {
      const { reply } = await this.run(
        async () => ({ reply: await this.transport.send(['RATELIMIT.RELEASE', key, 'ID', id, ...at], key) }),
        async () => {
          const k = this.libraryPrefix + key;
          return { reply: await this.transport.send(['FCALL', 'ratelimit_release', '1', k, 'ID', id, ...at], k) };
        },
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
    if (typeof work !== 'function') throw new TypeError(`work must be a function to run holding the lease, not ${describeValue(work)}`);
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
          if (!(error instanceof RateLimitUnavailable)) throw error;
          this.warnOnce(`release:${error.message}`, `ratelimit: the lease ${id} on ${key} was not released (${error.message}); it expires by itself`);
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
    return this.decide(this.knownPeriodMs(spec), () => this.request(command, key, spec, cost, atMs),
      command === 'refund' ? 0 : cost, () => this.decideLocally(command, key, spec, cost, atMs), false, late);
  }

  /** A decision whose caller went away (its call timed out): what it consumed is given back. */
  private lateGrant(key: string, spec: LimitSpec, d: Decision, at: number | undefined): void {
    if (!d.allowed || d.granted === 0 || d.shadowRejected) return;
    this.giveBack(`${d.granted} units granted on ${key} after the call timed out`, () => this.request('refund', key, spec, d.granted, at));
  }

  /** One call on one limit, sent to the engine in use (no onError: RateLimitUnavailable as the
   * guard raises it). */
  private request(command: Command, key: string, spec: LimitSpec, cost: number, atMs: number | undefined): Promise<Decision> {
    if (this.engineInUse === 'module' && !isPolicy(spec)) {
      // The module serves and the limit is inline: the command straight away, its arguments from
      // the limit's cached ones (the general path below resolves, in more steps, to the same).
      const args = [COMMANDS[command], key, ...this.argsOf(spec), command === 'take' ? 'MAX' : 'COST', String(cost)];
      if (atMs !== undefined) args.push('AT', String(atMs));
      const replyCost = command === 'take' ? null : command === 'refund' ? 0 : cost;
      return this.transport.send(args, key, command === 'peek').then(
        (reply) => decision(reply, 'module', spec.periodMs, replyCost),
        (error) => {
          if (!(this.engineOption === 'auto' && unknownCommand(error))) throw error;
          this.engineInUse = 'library'; // the module is gone: the library from now on
          return this.requestResolved(command, key, spec, cost, atMs);
        },
      );
    }
    return this.requestResolved(command, key, spec, cost, atMs);
  }

  /** An inline limit's module arguments (`algorithm limit period [BURST c] [BLOCK d]`), made once. */
  private argsOf(lim: Limit): string[] {
    let args = this.limitArgsCache.get(lim);
    if (args === undefined) {
      args = limitArgs(lim);
      this.limitArgsCache.set(lim, args);
    }
    return args;
  }

  private async requestResolved(command: Command, key: string, spec: LimitSpec, cost: number, atMs: number | undefined): Promise<Decision> {
    const at = atArgs(atMs);
    const readonly = command === 'peek';
    const moduleName = COMMANDS[command];
    // TAKE's number is MAX, the others' COST; TAKE's reply carries the grant.
    const amount = [command === 'take' ? 'MAX' : 'COST', String(cost)];
    const replyCost = command === 'take' ? null : command === 'refund' ? 0 : cost;
    {
      const { reply, source, periodMs: period, shadowRejected } = await this.run(
        async () => {
          const resolved = await this.resolveForModule(key, spec);
          const args = [moduleName, key, ...resolved.args, ...amount, ...at];
          if (resolved.shadowAs && command !== 'refund') {
            // What enforcement would answer, sent in the same round trip (pipelined): for TAKE,
            // whether it would have granted all of MAX.
            const enforced = this.transport.send(['RATELIMIT.PEEK', key, ...limitArgs(resolved.shadowAs), 'COST', String(cost), ...at], key, true);
            const [peeked, reply] = await Promise.all([enforced, this.transport.send(args, key, readonly)]);
            const answered = decision(reply, 'module', resolved.periodMs, replyCost);
            return { reply, periodMs: resolved.periodMs, shadowRejected: answered.allowed && !decision(peeked, 'module', 0).allowed };
          }
          return { reply: await this.transport.send(args, key, readonly), periodMs: resolved.periodMs, shadowRejected: false };
        },
        async () => {
          const inline = this.fallback(spec);
          const k = this.libraryPrefix + key;
          const fcall = readonly ? 'FCALL_RO' : 'FCALL';
          const args = [fcall, `ratelimit_${command}`, '1', k, ...limitArgs(inline), ...amount, ...at];
          return { reply: await this.transport.send(args, k, readonly), periodMs: inline.periodMs, shadowRejected: false };
        },
      );
      return { ...decision(reply, source, period, replyCost), shadowRejected };
    }
  }

  /** onError 'local': the call on the in-process limiter, at `at` or the machine's clock; null
   * where the limit is not known here (a policy without a cached definition or a fallback, or a
   * shadow policy), which fails open. */
  private decideLocally(command: Command, key: string, spec: LimitSpec, cost: number, at: number | undefined): Decision | null {
    const lim = this.localLimit(spec);
    if (lim === null) return null;
    const now = at ?? Date.now();
    let reply: Reply;
    let granted = 0;
    if (command === 'take') {
      reply = this.local.take(key, lim, cost, now);
      granted = (reply as Reply & { granted: number }).granted;
    } else if (command === 'refund') {
      reply = this.local.refund(key, lim, cost, now);
    } else {
      reply = this.local.check(key, lim, cost, now, command === 'check');
      granted = reply.allowed ? cost : 0;
    }
    return localDecision({ ...reply }, 'fallback', lim.periodMs, granted);
  }

  /** onError 'local' for checkAll: all or nothing in process; null (fail open) when a limit is
   * not known here. */
  private checkAllLocally(pairs: Array<[string, LimitSpec]>, cost: number, at: number | undefined): MultiDecision | null {
    const limits = pairs.map(([, spec]) => this.localLimit(spec));
    if (limits.some((l) => l === null)) return null;
    const { overall, each } = this.local.checkAll(pairs.map(([key], i) => [key, limits[i]!]), cost, at ?? Date.now());
    const decisions = each.map((reply, i) => localDecision({ ...reply }, 'fallback', limits[i]!.periodMs, reply.allowed ? cost : 0));
    const shown = decisions.find((d) => d.remaining === overall.remaining && d.limit === overall.limit);
    return { ...localDecision({ ...overall }, 'fallback', shown?.periodMs ?? limits[0]!.periodMs, overall.allowed ? cost : 0), limits: decisions };
  }

  /** The limit the in-process limiter applies for a spec, scaled by localShare. */
  private localLimit(spec: LimitSpec): Limit | null {
    let lim: Limit | undefined;
    if (isPolicy(spec)) {
      const cached = this.cache.get(spec.name);
      if (cached?.definition) {
        if (cached.definition.mode === 'shadow') return null;
        lim = cached.definition.limitSpec;
      } else {
        lim = spec.fallback;
      }
    } else {
      lim = spec;
    }
    if (!lim) return null;
    if (this.localShare === 1) return lim;
    let scaled = this.scaledLimits.get(lim);
    if (!scaled) {
      scaled = limit(lim.algorithm, share(lim.limit, this.localShare), lim.periodMs, {
        ...(lim.burst !== undefined ? { burst: share(lim.burst, this.localShare) } : {}),
        ...(lim.block !== undefined ? { block: lim.block } : {}),
      });
      this.scaledLimits.set(lim, scaled);
    }
    return scaled;
  }

  /** A spec's module arguments: inline as given; a policy by name, with its definition (period,
   * mode) read and cached; a policy the server lacks as its fallback (warned once). */
  private async resolveForModule(key: string, spec: LimitSpec): Promise<Resolved> {
    if (!isPolicy(spec)) return { args: limitArgs(spec), periodMs: spec.periodMs };
    const definition = await this.definition(spec.name, key);
    if (definition === null) {
      if (spec.fallback) {
        this.warnOnce(`missing:${spec.name}`, `ratelimit: the server has no policy '${spec.name}': using its fallback ${limitArgs(spec.fallback).join(' ')}`);
        return { args: limitArgs(spec.fallback), periodMs: spec.fallback.periodMs };
      }
      // The module's own error says it: ERR no such policy.
      return { args: ['POLICY', spec.name], periodMs: 0 };
    }
    return {
      args: ['POLICY', spec.name],
      periodMs: definition.periodMs ?? definition.leaseMs ?? 0,
      ...(definition.mode === 'shadow' && definition.limitSpec ? { shadowAs: definition.limitSpec } : {}),
    };
  }

  /** A policy's definition from the cache; read at its first use, then again in the background
   * every policyRefreshMs. */
  private async definition(name: string, key: string): Promise<PolicyDefinition | null> {
    const cached = this.cache.get(name);
    const fetch = async () => {
      const reply = await this.transport.send(['RATELIMIT.POLICY', 'GET', name], key, true);
      const definition = policyDefinition(name, reply);
      this.cache.set(name, { definition, fetchedAt: this.now() });
      return definition;
    };
    if (!cached) return fetch();
    if (this.now() - cached.fetchedAt > this.policyRefreshMs && !cached.refreshing) {
      cached.refreshing = fetch().catch(() => {
        cached.refreshing = undefined;
      });
    }
    return cached.definition;
  }

  /** @internal a policy changed here: read it again at its next use; its refusals are void. */
  _forget(name: string): void {
    this.cache.delete(name);
    this.denials?.dropMatching(`\nPOLICY ${name}`);
  }

  /** The inline limit the library applies for a spec. */
  private fallback(spec: LimitSpec): Limit {
    if (!isPolicy(spec)) return spec;
    if (!spec.fallback) {
      throw new RateLimitError(`policy '${spec.name}' has no fallback: the Functions library has no policies (give policy('${spec.name}', { fallback: limit(...) }))`);
    }
    return spec.fallback;
  }

  private knownPeriodMs(spec: LimitSpec): number {
    if (!isPolicy(spec)) return spec.periodMs;
    const cached = this.cache.get(spec.name)?.definition;
    return cached?.periodMs ?? spec.fallback?.periodMs ?? 0;
  }

  /** Runs a call on the engine in use: the module's command, or, where the server does not know
   * it, the library's function (loaded first when needed). */
  private async run<T extends object>(onModule: () => Promise<T>, onLibrary: () => Promise<T>): Promise<T & { source: Source }> {
    if (this.engineInUse !== 'library') {
      try {
        const result = await onModule();
        if (this.engineInUse === null) {
          this.engineInUse = 'module';
          this.logger.info('ratelimit: engine: the module (RATELIMIT.* commands)');
        }
        return { ...result, source: 'module' };
      } catch (error) {
        if (!(this.engineOption === 'auto' && unknownCommand(error))) {
          if (noSuchPolicy(error)) this.cache.clear(); // deleted meanwhile: read again next time
          throw error;
        }
        this.engineInUse = 'library';
      }
    }
    await this.ensureLibrary();
    if (!this.libraryAnnounced) {
      this.libraryAnnounced = true;
      const why = this.engineOption === 'library' ? 'as configured' : 'the module is not loaded';
      this.logger.info(`ratelimit: ${why}: engine: the Functions library '${LIBRARY_NAME}' (keys prefixed '${this.libraryPrefix}'; no policies: their fallbacks apply)`);
    }
    try {
      return { ...(await onLibrary()), source: 'library' };
    } catch (error) {
      if (!functionNotFound(error) || !this.loadLibraryOption) throw error;
      // Flushed, or a primary added since: load it again, once.
      this.libraryReady = null;
      await this.ensureLibrary();
      return { ...(await onLibrary()), source: 'library' };
    }
  }

  private ensureLibrary(): Promise<void> {
    if (!this.loadLibraryOption) return Promise.resolve();
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
        const listed = (await send(['FUNCTION', 'LIST', 'LIBRARYNAME', LIBRARY_NAME, 'WITHCODE'])) as unknown[];
        const found = listed.map(pairs).find((library) => String(library.library_name) === LIBRARY_NAME);
        if (!found) {
          try {
            await send(['FUNCTION', 'LOAD', LIBRARY]);
            this.logger.info(`ratelimit: loaded the Functions library '${LIBRARY_NAME}'`);
          } catch (error) {
            if (!(isReplyError(error) && /already exists/.test(error.message))) throw error; // loaded meanwhile
          }
          return;
        }
        if (String(found.library_code) === LIBRARY) return;
        const names = new Set((found.functions as unknown[]).map((f) => String(pairs(f).name)));
        if (LIBRARY_FUNCTIONS.some((name) => !names.has(name))) {
          await send(['FUNCTION', 'LOAD', 'REPLACE', LIBRARY]);
          this.logger.info(`ratelimit: replaced an older Functions library '${LIBRARY_NAME}' (it lacked some functions)`);
        } else {
          this.warnOnce('library', `ratelimit: the Functions library '${LIBRARY_NAME}' loaded differs from this package's but has all its functions: using it as is`);
        }
      }),
    );
  }

  // ---- bounds, breaker, onError ----

  /** A call that goes to Redis: refused at once while the breaker is open; bounded by timeoutMs;
   * RateLimitUnavailable when Redis is unavailable; the client's error as is otherwise. `late`
   * receives the result of a call that answered after its timeout fired (its caller has had
   * onError's answer): what it consumed is given back there. */
  private guard<T>(work: () => Promise<T>, late?: (value: T) => void): Promise<T> {
    if (!this.breaker.allow()) return Promise.reject(new RateLimitUnavailable('Redis unavailable: the breaker is open (recent calls failed)'));
    return this.bound(work, late).then(
      (result) => {
        this.answered();
        return result;
      },
      (error) => {
        throw this.failed(error);
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
        (error) => {
          if (call.settled) return;
          call.settled = true;
          this.deadlines.settled();
          reject(error);
        },
      );
      this.deadlines.add(call);
    });
  }

  /** The error a call that failed rejects with: RateLimitUnavailable (the breaker counts it, the
   * log says it once) when Redis is unavailable; the client's own otherwise. */
  private failed(error: unknown): unknown {
    if (error instanceof Timeout || isUnavailable(error)) {
      this.breaker.failure();
      if (!this.down) {
        this.down = true;
        const failing = { open: 'open (admitted)', closed: 'closed (RateLimitUnavailable)', local: 'over to the in-process limiter' }[this.onError];
        this.logger.warn(`ratelimit: Redis unavailable (${replyMessage(error)}): failing ${failing}`);
      }
      return new RateLimitUnavailable(`Redis unavailable: ${replyMessage(error)}`, { cause: error });
    }
    if (isReplyError(error)) this.answered();
    return error;
  }

  private answered(): void {
    this.breaker.success();
    if (this.down) {
      this.down = false;
      // At the level of the failure's line: whoever sees one sees the other.
      this.logger.warn('ratelimit: Redis answers again');
    }
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
    return this.guard(work, late).catch((error) => this.unavailable(error, periodMs, granted, local, multi));
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
      const why = error instanceof Timeout ? `${replyMessage(error)}; it may still be done when Redis runs it` : replyMessage(error);
      this.logger.warn(`ratelimit: could not give back ${what} (${why}): they return to the limit as it refills`);
    });
    this.refunds.add(back);
    void back.finally(() => this.refunds.delete(back));
  }

  /** onError for a call that found Redis unavailable; any other error rejects as is. */
  private unavailable<D extends Decision>(error: unknown, periodMs: number, granted: number, local: (() => D | null) | null, multi = false): D {
    if (!(error instanceof RateLimitUnavailable) || this.onError === 'closed') throw error;
    const decided = this.onError === 'local' && local ? local() : null;
    if (decided) return decided;
    const failed = errorDecision(periodMs, granted);
    return (multi ? { ...failed, limits: [] } : failed) as D;
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
        if (unknownCommand(error)) {
          throw new RateLimitError('policies need the redis-ratelimit module: the server does not have it (the Functions library has no policies)', { cause: error });
        }
        throw error;
      }
    });
  }

  private warnOnce(what: string, message: string): void {
    if (this.warned.has(what)) return;
    if (this.warned.size > 100) this.warned.clear();
    this.warned.add(what);
    this.logger.warn(message);
  }
}
