// The wire format: the arguments of each command, and the replies (RESP2 arrays, RESP3 maps, the
// library's arrays) read into typed results. No I/O: the limiter sends what this builds and hands
// back what this reads.

import { ALGORITHMS, BUCKETS, describe, integer, isPolicy, limit, type Algorithm, type Decision, type Limit, type LimitSpec, type MultiDecision, type PolicyDefinition, type Source } from './types.js';

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

/** The command whose arity (`COMMAND INFO`) says how the module takes a limit spec: -3, as one
 * argument too (`'token-bucket 10 1s BURST 20'`); an older module's -4, only as words. */
export const SPEC_PROBE = ['COMMAND', 'INFO', 'RATELIMIT.CHECK'];
export const ONE_ARG_ARITY = -3;

/** A limit spec's words (`algorithm limit period [BURST c] [BLOCK d]`, `POLICY name`) as the
 * module's CHECK, PEEK, TAKE, REFUND and CHECKALL take them: one argument, the words joined by
 * single spaces (`oneArg`: the module takes that, the same call in fewer arguments), else the
 * words. No word holds a space (a period is digits and a unit, a policy name has none). */
export function specWords(words: string[], oneArg: boolean): string[] {
  return oneArg ? [words.join(' ')] : words;
}

/** An older module's reply to a spec sent as one argument (it reads the whole as an algorithm). */
export const ONE_ARG_REFUSED = /unknown algorithm '[^']* [^']*'/;

/** The arity in `COMMAND INFO name`'s reply (`[[name, arity, flags, ...]]`; `[null]` where the
 * server has no such command); null where it says none. */
export function commandArity(reply: unknown): number | null {
  if (!Array.isArray(reply) || !Array.isArray(reply[0])) return null;
  const arity: unknown = (reply[0] as unknown[])[1];
  const n = typeof arity === 'number' || typeof arity === 'bigint' || typeof arity === 'string' ? Number(arity) : NaN;
  return Number.isInteger(n) ? n : null;
}

/** The calls on one limit. */
export type Command = 'check' | 'peek' | 'refund' | 'take';
/** The module's command of each call on one limit. */
export const COMMANDS: Record<Command, string> = { check: 'RATELIMIT.CHECK', peek: 'RATELIMIT.PEEK', refund: 'RATELIMIT.REFUND', take: 'RATELIMIT.TAKE' };

/** A call's number: TAKE's is `MAX`, the others' `COST`. */
export function amountArgs(command: Command, cost: number): string[] {
  return [command === 'take' ? 'MAX' : 'COST', String(cost)];
}

/** The `cost` to read a call's reply with (see `decision`): TAKE's reply carries its grant (null),
 * a refund's decision is a peek of cost 0. */
export function replyCost(command: Command, cost: number): number | null {
  return command === 'take' ? null : command === 'refund' ? 0 : cost;
}

/** A call on one limit for the library: `FCALL[_RO] ratelimit_<call> 1 key limit... COST|MAX n
 * [AT t]` (the key already prefixed). */
export function libraryArgs(command: Command, key: string, lim: Limit, cost: number, at: string[]): string[] {
  return [command === 'peek' ? 'FCALL_RO' : 'FCALL', `ratelimit_${command}`, '1', key, ...limitArgs(lim), ...amountArgs(command, cost), ...at];
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
  const first: unknown = reply[0];
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
    [v0, v1, v2, v3, v4, v5] = reply as unknown[];
  } else {
    const first = cost === null ? 'granted' : 'allowed';
    if (reply instanceof Map) {
      const map = reply as Map<unknown, unknown>;
      [v0, v1, v2, v3, v4, v5] = [map.get(first), map.get('limit'), map.get('remaining'), map.get('retry_after_ms'), map.get('reset_after_ms'), map.get('delay_ms')];
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
    [overall, ...limits] = reply as unknown[];
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
