// Fastify plugin: `await app.register(rateLimit, { limiter, limit, key })`. Registered at the
// root it applies to the whole app (it skips Fastify's encapsulation, as fastify-plugin plugins
// do); registered inside a plugin, to that plugin's routes.
import type { FastifyPluginAsync, FastifyRequest } from 'fastify';

import type { Decision } from './types.js';
import { checkOptions, decideRequest, type RateLimitOptions } from './http.js';

export type { RateLimitOptions } from './http.js';

// The parts of Fastify's instance, request and reply this uses (Fastify 4 and 5).
interface Request {
  rateLimit?: Decision;
  ip?: string;
}
interface Reply {
  headers(values: Record<string, string>): Reply;
  code(status: number): Reply;
  send(body?: unknown): Reply;
}
interface Instance {
  // never: each hook names the parts of Fastify's request and reply it reads (Request, Reply).
  addHook(name: 'onRequest', hook: (request: never, reply: never) => Promise<unknown>): unknown;
  decorateRequest?(name: string, value: unknown): unknown;
  hasRequestDecorator?(name: string): boolean;
}

/** An `onRequest` hook limiting each request (the key of `key(request)`, else the client address
 * `request.ip`): the RateLimit headers
 * on every limited answer, 429 (with Retry-After and `{ error, policy, retry_after_ms }`) when
 * refused, 503 when Redis is unavailable and onError is `'closed'`; `request.rateLimit` holds the
 * decision. */
export const rateLimit: FastifyPluginAsync<RateLimitOptions<FastifyRequest>> = plugin as unknown as FastifyPluginAsync<RateLimitOptions<FastifyRequest>>;

// eslint-disable-next-line @typescript-eslint/require-await -- Fastify waits on a plugin's promise, or else on a done callback
async function plugin<Req extends Request>(app: Instance, options: RateLimitOptions<Req>): Promise<void> {
  // request.ip: the client address as Fastify's `trustProxy` option reads it.
  const checked = checkOptions(options, (request: Req) => request.ip, 'Fastify request.ip');
  if (app.decorateRequest && !app.hasRequestDecorator?.('rateLimit')) app.decorateRequest('rateLimit', null);
  app.addHook('onRequest', async (request: Req, reply: Reply) => {
    const outcome = await decideRequest(checked, request);
    if (outcome.kind === 'skip') return;
    if (outcome.kind === 'unavailable') return reply.code(outcome.status).send(outcome.body);
    request.rateLimit = outcome.decision;
    reply.headers(outcome.headers);
    if (outcome.status === 429) return reply.code(429).send(outcome.body);
    return undefined;
  });
}

// What fastify-plugin sets: the hook applies to the instance it is registered on, not to a child.
(plugin as unknown as Record<symbol | string, unknown>)[Symbol.for('skip-override')] = true;
(plugin as unknown as Record<symbol | string, unknown>)[Symbol.for('fastify.display-name')] = 'redis-ratelimit-client';

declare module 'fastify' {
  interface FastifyRequest {
    /** The rate-limit decision of redis-ratelimit-client's plugin. */
    rateLimit?: Decision;
  }
}
