// What the middleware of every framework shares: the options, the decision for a request, and
// the answer (status, draft-ietf-httpapi-ratelimit-headers-10 fields, body). No framework here.

import { checkSpec, isPolicy, RateLimitError, RateLimitUnavailable, type Decision, type LimitSpec } from './types.js';
import type { RateLimiter } from './limiter.js';

/** The options of every middleware; `Req` is the framework's own request object. */
export interface RateLimitOptions<Req> {
  limiter: RateLimiter;
  /** The limit: inline, or a policy (with a fallback for servers without the module). */
  limit: LimitSpec;
  /** The caller's identity to count the request under (an API key, a user id); where it answers
   * undefined, null or '' (and without `key`), the client's address: `ip:<address>` (IPv6: its
   * /56 network, `ipv6Subnet`). */
  key?: (req: Req) => string | undefined | null | Promise<string | undefined | null>;
  /** Requests for which it answers true are not limited and not counted. */
  skip?: (req: Req) => boolean | Promise<boolean>;
  /** The prefix length an IPv6 address is counted under (default 56: one customer's network, as
   * express-rate-limit's ipKeyGenerator does), 1 to 128, or false for the whole address. */
  ipv6Subnet?: number | false;
  /** The policy's name in the headers (default: the policy's own name, else `'default'`). */
  name?: string;
  /** The request's cost (default 1), or a function of the request. */
  cost?: number | ((req: Req) => number | Promise<number>);
}

/** The client address of a request, as the framework knows it (undefined when it does not). */
export type AddressOf<Req> = (req: Req, ...rest: unknown[]) => string | undefined | null;

/** What a middleware does with a request. */
export type Outcome =
  | { kind: 'skip' }
  | { kind: 'unavailable'; status: 503; body: { error: string } }
  | { kind: 'answer'; decision: Decision; status: 200 | 429; headers: Record<string, string>; body?: Record<string, unknown> };

/** Checks the options once, when the middleware is made: a mistake is a TypeError at start-up.
 * `address` is the framework's client address; `where` says where it comes from (for errors). */
export function checkOptions<Req>(options: RateLimitOptions<Req>, address: AddressOf<Req>, where: string): Required<Pick<RateLimitOptions<Req>, 'limiter' | 'limit'>> & {
  name: string;
  key: (req: Req, rest: unknown[]) => Promise<string>;
  skip: ((req: Req) => boolean | Promise<boolean>) | null;
  cost: (req: Req) => number | Promise<number>;
} {
  if (!options || typeof options !== 'object') throw new TypeError('rateLimit needs { limiter, limit }');
  const { limiter, key, skip, cost = 1, ipv6Subnet = 56 } = options;
  if (!limiter || typeof limiter.check !== 'function') throw new TypeError('rateLimit: limiter must be a RateLimiter');
  const spec = checkSpec(options.limit, 'rateLimit: limit');
  if (key !== undefined && typeof key !== 'function') throw new TypeError('rateLimit: key must be a function (req) => string | undefined');
  if (skip !== undefined && typeof skip !== 'function') throw new TypeError('rateLimit: skip must be a function (req) => boolean');
  if (typeof cost !== 'number' && typeof cost !== 'function') throw new TypeError('rateLimit: cost must be a number or a function of the request');
  if (ipv6Subnet !== false && !(Number.isInteger(ipv6Subnet) && ipv6Subnet >= 1 && ipv6Subnet <= 128)) {
    throw new TypeError(`rateLimit: ipv6Subnet must be an integer from 1 to 128 or false, not ${String(ipv6Subnet)}`);
  }
  const name = options.name ?? (isPolicy(spec) ? spec.name : 'default');
  if (typeof name !== 'string' || !/^[A-Za-z0-9_.-]+$/.test(name)) {
    throw new TypeError(`rateLimit: name must be a token of A-Z, a-z, 0-9, '_', '-' and '.', not '${name}'`);
  }
  const keyOf = async (req: Req, rest: unknown[]): Promise<string> => {
    const given = key ? await key(req) : undefined;
    if (given !== undefined && given !== null && given !== '') return given;
    const from = address(req, ...rest);
    if (!from) throw new RateLimitError(`rateLimit: the request has no client address (${where}): give key`);
    return addressKey(from, ipv6Subnet);
  };
  return { limiter, limit: spec, key: keyOf, skip: skip ?? null, name, cost: typeof cost === 'function' ? cost : () => cost };
}

/** The key of a client address: `ip:<IPv4>` (an IPv4-mapped IPv6 address as its IPv4), or
 * `ip:<network>/<subnet>` for IPv6 (the whole address with subnet false or 128). */
export function addressKey(address: string, ipv6Subnet: number | false = 56): string {
  let text = address.trim();
  if (text.startsWith('[') && text.endsWith(']')) text = text.slice(1, -1);
  const zone = text.indexOf('%');
  if (zone >= 0) text = text.slice(0, zone);
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(text);
  if (mapped) text = mapped[1];
  if (!text.includes(':')) return `ip:${text}`;
  const groups = ipv6Groups(text);
  if (groups === null) return `ip:${text.toLowerCase()}`; // not an address we can read: as given
  const bits = ipv6Subnet === false ? 128 : ipv6Subnet;
  const masked = groups.map((g, i) => {
    const keep = Math.max(0, Math.min(16, bits - 16 * i));
    return keep === 0 ? 0 : g & ((0xffff << (16 - keep)) & 0xffff);
  });
  return `ip:${ipv6Text(masked)}${bits === 128 ? '' : `/${bits}`}`;
}

/** The eight 16-bit groups of an IPv6 address (`::` expanded, an IPv4 tail read), or null. */
function ipv6Groups(text: string): number[] | null {
  const halves = text.split('::');
  if (halves.length > 2) return null;
  const part = (s: string): number[] | null => {
    if (s === '') return [];
    const out: number[] = [];
    const pieces = s.split(':');
    for (let i = 0; i < pieces.length; i += 1) {
      const p = pieces[i];
      if (i === pieces.length - 1 && /^\d+\.\d+\.\d+\.\d+$/.test(p)) {
        const b = p.split('.').map(Number);
        if (b.some((x) => x > 255)) return null;
        out.push((b[0] << 8) | b[1], (b[2] << 8) | b[3]);
      } else if (/^[0-9a-f]{1,4}$/i.test(p)) {
        out.push(parseInt(p, 16));
      } else {
        return null;
      }
    }
    return out;
  };
  const head = part(halves[0]);
  const tail = halves.length === 2 ? part(halves[1]) : [];
  if (head === null || tail === null) return null;
  if (halves.length === 1) return head.length === 8 ? head : null;
  if (head.length + tail.length > 7) return null;
  return [...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail];
}

/** RFC 5952 text: lowercase, no leading zeros, the longest run of two or more zero groups as `::`. */
function ipv6Text(groups: number[]): string {
  let best = -1;
  let bestLength = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i += 1;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j += 1;
    if (j - i > bestLength) [best, bestLength] = [i, j - i];
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLength).join(':')}`;
}

/** ⌈ms / 1000⌉: seconds for the headers. */
function ceilSeconds(ms: number): number {
  return Math.ceil(ms / 1000);
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

/** Decides a request: skip (`skip`), unavailable (onError closed), or the answer to give. */
export async function decideRequest<Req>(options: ReturnType<typeof checkOptions<Req>>, req: Req, ...rest: unknown[]): Promise<Outcome> {
  if (options.skip && (await options.skip(req))) return { kind: 'skip' };
  const key = await options.key(req, rest);
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
