// The sans-IO engine: the options, which engine serves (the module, else the Functions library),
// what each call sends to each engine and what its replies mean, policies' definitions and
// fallbacks, the breaker, and what onError answers (the in-process limiter of local.ts for
// 'local'). No sockets, no timers, no promises: the limiter (limiter.ts) asks this what to send,
// sends it, and tells this what came back.

import { isReplyError, isUnavailable, replyMessage } from './connection.js';
import { LIBRARY } from './generated/library.js';
import { LocalLimiter, localDecision, type Reply } from './local.js';
import {
  describe,
  isPolicy,
  limit,
  RateLimitError,
  RateLimitUnavailable,
  type Decision,
  type Limit,
  type LimitSpec,
  type MultiDecision,
  type PolicyDefinition,
  type Source,
} from './types.js';
import {
  amountArgs,
  commandArity,
  COMMANDS,
  decision,
  libraryArgs,
  limitArgs,
  multiDecision,
  ONE_ARG_ARITY,
  ONE_ARG_REFUSED,
  pairs,
  replyCost,
  SPEC_PROBE,
  specWords,
  type Command,
} from './wire.js';

/** The default bound on every call: a limiter in front of a request must not add more. */
export const DEFAULT_TIMEOUT_MS = 100;

/** The most keys the in-process limiter of `onError: 'local'` holds. */
const LOCAL_KEYS = 10000;

/** The Functions library's name, as `#!lua name=ratelimit` declares it. */
export const LIBRARY_NAME = 'ratelimit';
/** The functions the shipped library registers. */
export const LIBRARY_FUNCTIONS = [...LIBRARY.matchAll(/function_name\s*=\s*'([a-z_]+)'/g)].map((m) => m[1]);

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

/** The options checked, with their defaults: a TypeError or RangeError for a bad one, in the
 * order they are listed here. */
export interface Settings {
  onError: 'open' | 'closed' | 'local';
  localShare: number;
  timeoutMs: number;
  engine: 'auto' | 'module' | 'library';
  libraryPrefix: string;
  loadLibrary: boolean;
  failures: number;
  cooldownMs: number;
  now: () => number;
  denialCache: number;
  policyRefreshMs: number;
  logger: Logger;
}

export function settings(options: RateLimiterOptions): Settings {
  const { onError = 'open', timeoutMs = DEFAULT_TIMEOUT_MS, engine = 'auto', libraryPrefix = 'fn:', loadLibrary = true } = options;
  if (!['open', 'closed', 'local'].includes(onError)) throw new TypeError(`onError must be 'open', 'closed' or 'local', not ${describe(onError)}`);
  const localShare = options.localShare ?? 1;
  if (typeof localShare !== 'number' || Number.isNaN(localShare)) throw new TypeError(`localShare must be a number, not ${describe(localShare)}`);
  if (!(localShare > 0 && localShare <= 1)) throw new RangeError(`localShare must be more than 0 and at most 1, not ${localShare}`);
  if (!['auto', 'module', 'library'].includes(engine)) throw new TypeError(`engine must be 'auto', 'module' or 'library', not ${describe(engine)}`);
  if (!(typeof timeoutMs === 'number' && Number.isFinite(timeoutMs) && timeoutMs > 0)) throw new TypeError(`timeoutMs must be a positive number of ms, not ${describe(timeoutMs)}`);
  if (typeof libraryPrefix !== 'string') throw new TypeError(`libraryPrefix must be a string, not ${describe(libraryPrefix)}`);
  if (typeof loadLibrary !== 'boolean') throw new TypeError(`loadLibrary must be true or false, not ${describe(loadLibrary)}`);
  const failures = options.breaker?.failures ?? 3;
  const cooldownMs = options.breaker?.cooldownMs ?? 1000;
  if (!(Number.isInteger(failures) && failures >= 1)) throw new TypeError(`breaker.failures must be an integer of at least 1, not ${describe(failures)}`);
  if (!(typeof cooldownMs === 'number' && Number.isFinite(cooldownMs) && cooldownMs >= 0)) throw new TypeError(`breaker.cooldownMs must be a number of ms, not ${describe(cooldownMs)}`);
  if (options.now !== undefined && typeof options.now !== 'function') throw new TypeError(`now must be a function answering ms (a monotonic clock), not ${describe(options.now)}`);
  const now = options.now ?? (() => performance.now());
  const denialCache = options.denialCache ?? 0;
  if (typeof denialCache !== 'number' || !Number.isInteger(denialCache)) throw new TypeError(`denialCache must be an integer (a number of refusals), not ${describe(denialCache)}`);
  if (denialCache < 0) throw new RangeError(`denialCache must be 0 (off) or more, not ${denialCache}`);
  const policyRefreshMs = options.policyRefreshMs ?? 10000;
  if (!(typeof policyRefreshMs === 'number' && Number.isFinite(policyRefreshMs) && policyRefreshMs >= 0)) {
    throw new TypeError(`policyRefreshMs must be a number of ms, not ${describe(policyRefreshMs)}`);
  }
  const logger = options.logger ?? console;
  if (typeof logger?.info !== 'function' || typeof logger?.warn !== 'function') throw new TypeError('logger must have info(message) and warn(message)');
  return { onError, localShare, timeoutMs, engine, libraryPrefix, loadLibrary, failures, cooldownMs, now, denialCache, policyRefreshMs, logger };
}

/** The error of a call that did not answer within the limiter's `timeoutMs`. */
export class Timeout extends Error {}

/** Consecutive failures open it for the cool-down: calls then apply onError at once, without
 * touching Redis; after the cool-down one call (the probe) goes through, the others still fail
 * at once; the probe's success closes it, its failure opens it again. */
export class Breaker {
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

/** ⌊x · share⌋, at least 1, exactly: the share read as the decimal it prints as. */
export function share(x: number, fraction: number): number {
  const [digits, exponent = '0'] = fraction.toExponential().split('e');
  const [whole, decimals = ''] = digits.split('.');
  const numerator = BigInt(whole + decimals);
  const power = Number(exponent) - decimals.length;
  const scaled = power >= 0 ? BigInt(x) * numerator * 10n ** BigInt(power) : (BigInt(x) * numerator) / 10n ** BigInt(-power);
  return Math.max(1, Number(scaled));
}

/** The server does not have the module's command (the module is not loaded). */
export const unknownCommand = (error: unknown): boolean => isReplyError(error) && /^ERR unknown command/i.test(error.message);
/** The server does not have the library's function (flushed, or a primary added since). */
export const functionNotFound = (error: unknown): boolean => isReplyError(error) && /Function not found/i.test(error.message);
const noSuchPolicy = (error: unknown) => isReplyError(error) && /^ERR no such policy/.test(error.message);

/** What to do with the library a primary has (its `FUNCTION LIST LIBRARYNAME ratelimit
 * WITHCODE` reply): `'load'` it is missing; `'replace'` it lacks functions the package's has
 * (older); `'keep'` it is the package's; `'differs'` another with all of them (used as is). */
export function libraryAction(listed: unknown): 'load' | 'replace' | 'keep' | 'differs' {
  const found = (listed as unknown[]).map(pairs).find((library) => String(library.library_name) === LIBRARY_NAME);
  if (!found) return 'load';
  if (String(found.library_code) === LIBRARY) return 'keep';
  const names = new Set((found.functions as unknown[]).map((f) => String(pairs(f).name)));
  return LIBRARY_FUNCTIONS.some((name) => !names.has(name)) ? 'replace' : 'differs';
}

interface CachedPolicy {
  definition: PolicyDefinition | null;
  fetchedAt: number;
  refreshing?: boolean;
}

/** A spec resolved for the module: the arguments to send and what goes with them. */
export interface Resolved {
  args: string[];
  periodMs: number;
  /** A shadow policy's definition inline, to learn what enforcement would answer. */
  shadowAs?: Limit;
}

/** One call on one limit for the module, with a spec resolved: the command, and the PEEK of a
 * shadow policy's enforcement to send beside it (pipelined) or null. */
export interface ModuleCall {
  args: string[];
  readonly: boolean;
  peek: string[] | null;
  periodMs: number;
}

/** One call on one limit for the library: the function, and its key (prefixed). */
export interface LibraryCall {
  args: string[];
  key: string;
  readonly: boolean;
  periodMs: number;
}

/** A call of another kind for either engine: its arguments and the key that routes it. */
export interface Sent {
  args: string[];
  key: string;
}

/**
 * The engine's state and decisions: which engine serves, the policies read, the breaker, the
 * Redis-is-down episode, onError. Every method answers at once.
 */
export class Engine {
  /** The engine serving: `'module'`, `'library'`, or null before the first answer. */
  inUse: 'module' | 'library' | null;
  readonly choice: 'auto' | 'module' | 'library';
  readonly onError: 'open' | 'closed' | 'local';
  readonly localShare: number;
  readonly libraryPrefix: string;
  readonly loadLibrary: boolean;
  readonly breaker: Breaker;
  private readonly policyRefreshMs: number;
  private readonly logger: Logger;
  private readonly now: () => number;
  private readonly policies = new Map<string, CachedPolicy>();
  private readonly local = new LocalLimiter({ maxKeys: LOCAL_KEYS });
  private readonly scaledLimits = new WeakMap<Limit, Limit>();
  private readonly limitArgsCache = new WeakMap<Limit, string[]>();
  private readonly oneArgCache = new WeakMap<Limit, string[]>();
  /** Whether the module's specs go as one argument (`formFound`): words until it is known. */
  oneArg = false;
  /** Whether how the module takes a spec is still to be asked (`formToAsk`). */
  formUnknown = true;
  private readonly warned = new Set<string>();
  private down = false;
  private libraryAnnounced = false;

  constructor(s: Settings) {
    this.choice = s.engine;
    this.inUse = s.engine === 'auto' ? null : s.engine;
    this.onError = s.onError;
    this.localShare = s.localShare;
    this.libraryPrefix = s.libraryPrefix;
    this.loadLibrary = s.loadLibrary;
    this.policyRefreshMs = s.policyRefreshMs;
    this.logger = s.logger;
    this.now = s.now;
    this.breaker = new Breaker(s.failures, s.cooldownMs, s.now);
  }

  // ---- which engine serves ----

  /** The module's call failed with `error`: true when that says the module is gone and the
   * engine is `'auto'` (the library serves from now on: send the call again); false when the
   * error stands (a policy deleted meanwhile is read again next time). */
  moduleFailed(error: unknown): boolean {
    if (this.choice === 'auto' && unknownCommand(error)) {
      this.inUse = 'library';
      return true;
    }
    if (noSuchPolicy(error)) this.policies.clear();
    return false;
  }

  /** `COMMAND INFO RATELIMIT.CHECK`'s arguments where how the module takes a spec is still to
   * be asked and the module may serve (never for the library: words, a server's library may be
   * older), now marked as asked; else null. Sent once, beside the first module call (no round
   * trip of its own): that call and those before the answer go as words. */
  formToAsk(): string[] | null {
    if (!this.formUnknown || this.choice === 'library' || this.inUse === 'library') return null;
    this.formUnknown = false;
    return [...SPEC_PROBE];
  }

  /** COMMAND INFO answered: arity -3, specs as one argument from now on; any other, or none (no
   * such command), words. */
  formFound(reply: unknown): void {
    this.oneArg = commandArity(reply) === ONE_ARG_ARITY;
  }

  /** COMMAND INFO failed: Redis unavailable, asked again beside a later call; an error reply (no
   * permission...), words. */
  formFailed(error: unknown): void {
    if (error instanceof Timeout || isUnavailable(error)) this.formUnknown = true;
    else this.oneArg = false;
  }

  /** A module call failed with `error`: true when it refused a spec sent as one argument as an
   * older module does (a cluster's node not upgraded yet, a failover to one): words from now on
   * (said once), send the call again (so too for the calls in flight when the form changed: no
   * spec sent as words is refused so). */
  oneArgRefused(error: unknown): boolean {
    if (!isReplyError(error) || !ONE_ARG_REFUSED.test(error.message)) return false;
    if (this.oneArg) this.logger.warn(`ratelimit: a server does not take a limit spec as one argument (an older module: ${error.message}): sending the words from now on`);
    this.oneArg = false;
    return true;
  }

  /** The module answered: it serves (said once). */
  moduleAnswered(): void {
    if (this.inUse === null) {
      this.inUse = 'module';
      this.logger.info('ratelimit: engine: the module (RATELIMIT.* commands)');
    }
  }

  /** The library is about to serve a call: said once. */
  libraryServes(): void {
    if (this.libraryAnnounced) return;
    this.libraryAnnounced = true;
    const why = this.choice === 'library' ? 'as configured' : 'the module is not loaded';
    this.logger.info(`ratelimit: ${why}: engine: the Functions library '${LIBRARY_NAME}' (keys prefixed '${this.libraryPrefix}'; no policies: their fallbacks apply)`);
  }

  /** A primary's library was loaded (`'load'`, `'replace'`) or found different (`'differs'`):
   * said. */
  libraryLoaded(action: 'load' | 'replace' | 'differs'): void {
    if (action === 'load') this.logger.info(`ratelimit: loaded the Functions library '${LIBRARY_NAME}'`);
    else if (action === 'replace') this.logger.info(`ratelimit: replaced an older Functions library '${LIBRARY_NAME}' (it lacked some functions)`);
    else this.warnOnce('library', `ratelimit: the Functions library '${LIBRARY_NAME}' loaded differs from this package's but has all its functions: using it as is`);
  }

  /** FUNCTION LOAD failed with `error`: true when another client loaded it meanwhile. */
  loadedMeanwhile(error: unknown): boolean {
    return isReplyError(error) && /already exists/.test(error.message);
  }

  // ---- policies ----

  /** A policy's definition as known: `fetch` says whether to read it (`'wait'`: never read,
   * answer after; `'refresh'`: older than policyRefreshMs, read in the background, now marked
   * as being read; null: fresh or being read). */
  definitionOf(name: string): { definition: PolicyDefinition | null; fetch: 'wait' | 'refresh' | null } {
    const cached = this.policies.get(name);
    if (!cached) return { definition: null, fetch: 'wait' };
    if (this.now() - cached.fetchedAt > this.policyRefreshMs && !cached.refreshing) {
      cached.refreshing = true;
      return { definition: cached.definition, fetch: 'refresh' };
    }
    return { definition: cached.definition, fetch: null };
  }

  /** `RATELIMIT.POLICY GET name`'s arguments. */
  policyGet(name: string): string[] {
    return ['RATELIMIT.POLICY', 'GET', name];
  }

  /** A policy's definition was read (null: the server has none). */
  learned(name: string, definition: PolicyDefinition | null): void {
    this.policies.set(name, { definition, fetchedAt: this.now() });
  }

  /** A background read of a policy failed: it may be read again at its next use. */
  refreshFailed(name: string): void {
    const cached = this.policies.get(name);
    if (cached) cached.refreshing = false;
  }

  /** A policy changed here: read it again at its next use. */
  forget(name: string): void {
    this.policies.delete(name);
  }

  /** A spec's module arguments with the policy's definition known (`definition`; only read for
   * a policy): inline as given; a policy by name, with its period and a shadow policy's limit;
   * a policy the server lacks as its fallback (warned once), else by name (the module's own
   * error says it: ERR no such policy); in the form the module takes (`oneArg`). */
  resolve(spec: LimitSpec, definition: PolicyDefinition | null): Resolved {
    if (!isPolicy(spec)) return { args: this.argsOf(spec), periodMs: spec.periodMs };
    if (definition === null) {
      if (spec.fallback) {
        this.warnOnce(`missing:${spec.name}`, `ratelimit: the server has no policy '${spec.name}': using its fallback ${limitArgs(spec.fallback).join(' ')}`);
        return { args: this.argsOf(spec.fallback), periodMs: spec.fallback.periodMs };
      }
      return { args: specWords(['POLICY', spec.name], this.oneArg), periodMs: 0 };
    }
    return {
      args: specWords(['POLICY', spec.name], this.oneArg),
      periodMs: definition.periodMs ?? definition.leaseMs ?? 0,
      ...(definition.mode === 'shadow' && definition.limitSpec ? { shadowAs: definition.limitSpec } : {}),
    };
  }

  /** The inline limit the library applies for a spec: a RateLimitError for a policy without a
   * fallback. */
  fallback(spec: LimitSpec): Limit {
    if (!isPolicy(spec)) return spec;
    if (!spec.fallback) {
      throw new RateLimitError(`policy '${spec.name}' has no fallback: the Functions library has no policies (give policy('${spec.name}', { fallback: limit(...) }))`);
    }
    return spec.fallback;
  }

  /** A spec's period as known without asking: what onError's answers report. */
  knownPeriodMs(spec: LimitSpec): number {
    if (!isPolicy(spec)) return spec.periodMs;
    const cached = this.policies.get(spec.name)?.definition;
    return cached?.periodMs ?? spec.fallback?.periodMs ?? 0;
  }

  /** Whether refusals of a limit may be answered again by the denial cache: not with a BLOCK (a
   * refusal after a block ends starts another, which an answer from the cache would skip). A
   * policy's block is known from its definition once read (else its fallback's applies: the
   * library, or the server without it). */
  cacheable(spec: LimitSpec): boolean {
    if (!isPolicy(spec)) return spec.block === undefined;
    const definition = this.policies.get(spec.name)?.definition;
    if (definition) return definition.blockMs === 0;
    return spec.fallback === undefined || spec.fallback.block === undefined;
  }

  // ---- what each call sends ----

  /** An inline limit's module arguments (`algorithm limit period [BURST c] [BLOCK d]`, as words
   * or as one argument: `oneArg`), made once per form. */
  argsOf(lim: Limit): string[] {
    const oneArg = this.oneArg;
    const cache = oneArg ? this.oneArgCache : this.limitArgsCache;
    let args = cache.get(lim);
    if (args === undefined) {
      args = specWords(limitArgs(lim), oneArg);
      cache.set(lim, args);
    }
    return args;
  }

  /** A call on an inline limit for the module, its arguments from the limit's cached ones
   * (what `moduleCall` resolves to, in fewer steps). */
  inlineArgs(command: Command, key: string, lim: Limit, cost: number, at: number | undefined): string[] {
    const args = [COMMANDS[command], key, ...this.argsOf(lim), command === 'take' ? 'MAX' : 'COST', String(cost)];
    if (at !== undefined) args.push('AT', String(at));
    return args;
  }

  /** A call on one limit for the module, the spec resolved; with a shadow policy (but for a
   * refund), the PEEK of what enforcement would answer (for TAKE: whether it would have granted
   * all of MAX). */
  moduleCall(command: Command, key: string, resolved: Resolved, cost: number, at: string[]): ModuleCall {
    return {
      args: [COMMANDS[command], key, ...resolved.args, ...amountArgs(command, cost), ...at],
      readonly: command === 'peek',
      peek: resolved.shadowAs && command !== 'refund' ? ['RATELIMIT.PEEK', key, ...this.argsOf(resolved.shadowAs), 'COST', String(cost), ...at] : null,
      periodMs: resolved.periodMs,
    };
  }

  /** A call on one limit for the library (a policy as its fallback). */
  libraryCall(command: Command, key: string, spec: LimitSpec, cost: number, at: string[]): LibraryCall {
    const inline = this.fallback(spec);
    const k = this.libraryPrefix + key;
    return { args: libraryArgs(command, k, inline, cost, at), key: k, readonly: command === 'peek', periodMs: inline.periodMs };
  }

  /** A call's reply as its decision; `peeked`, the reply of the shadow policy's PEEK sent beside
   * it: `shadowRejected` when the policy admitted what enforcement would not have. */
  read(command: Command, reply: unknown, source: Source, periodMs: number, cost: number, peeked?: unknown): Decision {
    const d = decision(reply, source, periodMs, replyCost(command, cost));
    if (peeked !== undefined) d.shadowRejected = d.allowed && !decision(peeked, source, 0).allowed;
    return d;
  }

  /** CHECKALL for the module, the specs resolved: the command and a PEEK per shadow policy (null
   * for the others), sent together. */
  moduleCheckAll(keys: string[], resolved: Resolved[], cost: number, at: string[]): { args: string[]; peeks: Array<string[] | null> } {
    return {
      args: ['RATELIMIT.CHECKALL', String(keys.length), ...keys, ...resolved.flatMap((r) => r.args), 'COST', String(cost), ...at],
      peeks: resolved.map((r, i) => (r.shadowAs ? ['RATELIMIT.PEEK', keys[i], ...this.argsOf(r.shadowAs), 'COST', String(cost), ...at] : null)),
    };
  }

  /** CHECKALL for the library (policies as their fallbacks). */
  libraryCheckAll(keys: string[], specs: LimitSpec[], cost: number, at: string[]): Sent & { periods: number[] } {
    const inline = specs.map((spec) => this.fallback(spec));
    const prefixed = keys.map((key) => this.libraryPrefix + key);
    return {
      args: ['FCALL', 'ratelimit_checkall', String(keys.length), ...prefixed, ...inline.flatMap((l) => limitArgs(l)), 'COST', String(cost), ...at],
      key: prefixed[0],
      periods: inline.map((l) => l.periodMs),
    };
  }

  /** CHECKALL's reply as its decision, each limit's `shadowRejected` from its PEEK's reply. */
  readCheckAll(reply: unknown, source: Source, periods: number[], cost: number, peeked: unknown[]): MultiDecision {
    const d = multiDecision(reply, source, periods, cost);
    d.limits.forEach((limitDecision, i) => {
      const peek = peeked[i];
      if (peek !== null && peek !== undefined) limitDecision.shadowRejected = limitDecision.allowed && !decision(peek, source, 0).allowed;
    });
    d.shadowRejected = d.allowed && d.limits.some((l) => l.shadowRejected);
    return d;
  }

  /** RESET on either engine. */
  reset(keys: string[], library: boolean): Sent {
    if (!library) return { args: ['RATELIMIT.RESET', ...keys], key: keys[0] };
    const prefixed = keys.map((key) => this.libraryPrefix + key);
    return { args: ['FCALL', 'ratelimit_reset', String(keys.length), ...prefixed], key: prefixed[0] };
  }

  /** ACQUIRE on either engine; `rest`: `n lease ID id COST c [AT t]`. */
  acquire(key: string, rest: string[], library: boolean): Sent {
    if (!library) return { args: ['RATELIMIT.ACQUIRE', key, ...rest], key };
    const k = this.libraryPrefix + key;
    return { args: ['FCALL', 'ratelimit_acquire', '1', k, ...rest], key: k };
  }

  /** RELEASE on either engine. */
  release(key: string, id: string, at: string[], library: boolean): Sent {
    if (!library) return { args: ['RATELIMIT.RELEASE', key, 'ID', id, ...at], key };
    const k = this.libraryPrefix + key;
    return { args: ['FCALL', 'ratelimit_release', '1', k, 'ID', id, ...at], key: k };
  }

  /** The error a policy command (POLICY SET/GET/DEL/LIST) rejects with. */
  adminError(error: unknown): unknown {
    if (unknownCommand(error)) {
      return new RateLimitError('policies need the redis-ratelimit module: the server does not have it (the Functions library has no policies)', { cause: error });
    }
    return error;
  }

  // ---- the breaker, Redis down, onError ----

  /** A call that went to Redis failed with `error`: RateLimitUnavailable (the breaker counts it,
   * the log says it once) when Redis is unavailable or did not answer in time; the client's own
   * otherwise (an error reply is an answer). */
  failed(error: unknown): unknown {
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

  /** Redis answered a call. */
  answered(): void {
    this.breaker.success();
    if (this.down) {
      this.down = false;
      // At the level of the failure's line: whoever sees one sees the other.
      this.logger.warn('ratelimit: Redis answers again');
    }
  }

  /** What a call took could not be given back (`what`): said, with why. */
  giveBackFailed(what: string, error: unknown): void {
    const why = error instanceof Timeout ? `${replyMessage(error)}; it may still be done when Redis runs it` : replyMessage(error);
    this.logger.warn(`ratelimit: could not give back ${what} (${why}): they return to the limit as it refills`);
  }

  /** onError for a call that found Redis unavailable (`local`: the in-process decision, null
   * where the limit is not known here); any other error is thrown as is. */
  unavailable<D extends Decision>(error: unknown, periodMs: number, granted: number, local: (() => D | null) | null, multi = false): D {
    if (!(error instanceof RateLimitUnavailable) || this.onError === 'closed') throw error;
    const decided = this.onError === 'local' && local ? local() : null;
    if (decided) return decided;
    const failed = errorDecision(periodMs, granted);
    return (multi ? { ...failed, limits: [] } : failed) as D;
  }

  /** onError 'local': the call on the in-process limiter at `nowMs` (the call's `at`, else the
   * machine's clock); null where the limit is not known here (a policy without a cached
   * definition or a fallback, or a shadow policy), which fails open. */
  decideLocally(command: Command, key: string, spec: LimitSpec, cost: number, nowMs: number): Decision | null {
    const lim = this.localLimit(spec);
    if (lim === null) return null;
    let reply: Reply;
    let granted = 0;
    if (command === 'take') {
      reply = this.local.take(key, lim, cost, nowMs);
      granted = (reply as Reply & { granted: number }).granted;
    } else if (command === 'refund') {
      reply = this.local.refund(key, lim, cost, nowMs);
    } else {
      reply = this.local.check(key, lim, cost, nowMs, command === 'check');
      granted = reply.allowed ? cost : 0;
    }
    return localDecision({ ...reply }, 'fallback', lim.periodMs, granted);
  }

  /** onError 'local' for checkAll: all or nothing in process; null (fail open) when a limit is
   * not known here. */
  checkAllLocally(pairs: Array<[string, LimitSpec]>, cost: number, nowMs: number): MultiDecision | null {
    const limits = pairs.map(([, spec]) => this.localLimit(spec));
    if (limits.some((l) => l === null)) return null;
    const { overall, each } = this.local.checkAll(pairs.map(([key], i) => [key, limits[i]!]), cost, nowMs);
    const decisions = each.map((reply, i) => localDecision({ ...reply }, 'fallback', limits[i]!.periodMs, reply.allowed ? cost : 0));
    const shown = decisions.find((d) => d.remaining === overall.remaining && d.limit === overall.limit);
    return { ...localDecision({ ...overall }, 'fallback', shown?.periodMs ?? limits[0]!.periodMs, overall.allowed ? cost : 0), limits: decisions };
  }

  /** The limit the in-process limiter applies for a spec, scaled by localShare; null where none
   * is known (a policy without a definition read or a fallback) or the policy is a shadow one. */
  localLimit(spec: LimitSpec): Limit | null {
    let lim: Limit | undefined;
    if (isPolicy(spec)) {
      const cached = this.policies.get(spec.name);
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

  /** `warning` logged once per `what` (the last 100 kinds). */
  warnOnce(what: string, message: string): void {
    if (this.warned.has(what)) return;
    if (this.warned.size > 100) this.warned.clear();
    this.warned.add(what);
    this.logger.warn(message);
  }
}
