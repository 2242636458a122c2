// Hono middleware: `app.use(rateLimit({ limiter, limit, key: (c) => ... }))`; and `limitFetch` for
// any fetch-style handler (`(request: Request) => Response`: Deno, Bun, Cloudflare Workers, Node's
// own servers through an adapter).
import type {} from 'hono';

import type { Decision } from './types.js';
import { checkOptions, decideRequest, type RateLimitOptions } from './http.js';

export type { RateLimitOptions } from './http.js';

// The parts of Hono's context this uses.
interface Context {
  header(name: string, value: string): void;
  json(body: unknown, status?: number): Response;
  set(key: 'rateLimit', value: Decision): void;
  env?: unknown;
  req: { raw: Request };
}

/** The peer address of a request from what the server passed along with it: @hono/node-server's
 * `{ incoming }` (Node's socket), Bun's server (`requestIP`), Deno's `ServeHandlerInfo`
 * (`remoteAddr`). No header is read: behind a proxy, give `key`. */
function peer(env: unknown, request: Request): string | undefined {
  const e = env as {
    incoming?: { socket?: { remoteAddress?: string } };
    requestIP?: (request: Request) => { address?: string } | null;
    remoteAddr?: { hostname?: string };
  } | undefined;
  if (!e || typeof e !== 'object') return undefined;
  return e.incoming?.socket?.remoteAddress
    ?? (typeof e.requestIP === 'function' ? e.requestIP(request)?.address : undefined)
    ?? e.remoteAddr?.hostname;
}
const WHERE = "the socket's peer from @hono/node-server, Bun or Deno";

/** Limits each request (the key of `key(c)`, else the client address the server gives: Node's
 * socket through @hono/node-server, Bun's, Deno's): the RateLimit headers on every limited answer, 429
 * (with Retry-After and `{ error, policy, retry_after_ms }`) when refused, 503 when Redis is
 * unavailable and onError is `'closed'`; `c.get('rateLimit')` holds the decision. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- the published default: an untyped key(c) reads any field of Hono's context
export function rateLimit<C extends Context = any>(options: RateLimitOptions<C>) {
  const checked = checkOptions(options, (c: C) => peer(c.env, c.req.raw), WHERE);
  return async function rateLimitMiddleware(c: C, next: () => Promise<void>): Promise<Response | void> {
    const outcome = await decideRequest(checked, c);
    if (outcome.kind === 'skip') return next();
    if (outcome.kind === 'unavailable') return c.json(outcome.body, outcome.status);
    c.set('rateLimit', outcome.decision);
    for (const [name, value] of Object.entries(outcome.headers)) c.header(name, value);
    if (outcome.status === 429) return c.json(outcome.body, 429);
    return next();
  };
}

function json(body: unknown, status: number, headers: Record<string, string>): Response {
  return new Response(JSON.stringify(body), { status, headers: { ...headers, 'Content-Type': 'application/json' } });
}

/** Wraps a fetch-style handler: `key` receives the `Request`; the same answers as `rateLimit`. */
export function limitFetch<Args extends unknown[]>(
  handler: (request: Request, ...rest: Args) => Response | Promise<Response>,
  options: RateLimitOptions<Request>,
): (request: Request, ...rest: Args) => Promise<Response> {
  const checked = checkOptions(options, (request: Request, env?: unknown) => peer(env, request), WHERE);
  return async (request: Request, ...rest: Args) => {
    const outcome = await decideRequest(checked, request, ...rest);
    if (outcome.kind === 'skip') return handler(request, ...rest);
    if (outcome.kind === 'unavailable') return json(outcome.body, outcome.status, {});
    if (outcome.status === 429) return json(outcome.body, 429, outcome.headers);
    const response = await handler(request, ...rest);
    const answered = new Response(response.body, response); // headers of a fetched response are immutable
    for (const [name, value] of Object.entries(outcome.headers)) answered.headers.set(name, value);
    return answered;
  };
}

declare module 'hono' {
  interface ContextVariableMap {
    /** The rate-limit decision of redis-ratelimit-client's middleware. */
    rateLimit: Decision;
  }
}
