// Express middleware: `app.use(rateLimit({ limiter, limit, key }))`, or on one route.
import type { Decision } from './types.js';
import { checkOptions, decideRequest, type RateLimitOptions } from './http.js';

export type { RateLimitOptions } from './http.js';

// The parts of Express's request and response this uses (Express 4 and 5).
interface Request {
  rateLimit?: Decision;
  ip?: string;
  socket?: { remoteAddress?: string };
}
interface Response {
  set(headers: Record<string, string>): unknown;
  status(code: number): Response;
  json(body: unknown): unknown;
}
type Next = (error?: unknown) => void;

/** Limits each request (the key of `key(req)`, else the client address `req.ip`), sets the RateLimit headers on every limited
 * answer, answers 429 (with Retry-After and `{ error, policy, retry_after_ms }`) when refused and
 * 503 when Redis is unavailable and onError is `'closed'`; `req.rateLimit` holds the decision. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- the published default: an untyped key(req) reads any field of the framework's request
export function rateLimit<Req extends Request = any>(options: RateLimitOptions<Req>) {
  // req.ip: the client address as Express's `trust proxy` setting reads it (the socket's peer
  // without it; with it, from X-Forwarded-For as far as the proxies it trusts).
  const checked = checkOptions(options, (req: Req) => req.ip ?? req.socket?.remoteAddress, 'Express req.ip');
  return async function rateLimitMiddleware(req: Req, res: Response, next: Next): Promise<void> {
    let outcome;
    try {
      outcome = await decideRequest(checked, req);
    } catch (error) {
      return next(error); // the caller's mistake (a bad argument, WRONGTYPE): Express's error handling
    }
    if (outcome.kind === 'skip') return next();
    if (outcome.kind === 'unavailable') {
      res.status(outcome.status).json(outcome.body);
      return;
    }
    req.rateLimit = outcome.decision;
    res.set(outcome.headers);
    if (outcome.status === 429) {
      res.status(429).json(outcome.body);
      return;
    }
    next();
  };
}

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace -- Express declares its Request in the global namespace Express: only there it merges
  namespace Express {
    interface Request {
      /** The rate-limit decision of redis-ratelimit-client's middleware. */
      rateLimit?: Decision;
    }
  }
}
