import type { Decision } from './core.js';

/** The base of this package's errors. */
export class RateLimitError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** A request refused (`withLease`, or middleware that throws): `decision` says why and until when. */
export class RateLimited extends RateLimitError {
  readonly decision: Decision;
  constructor(decision: Decision, message = `rate limited: retry in ${decision.retryAfterMs} ms`) {
    super(message);
    this.decision = decision;
  }
}

/** Redis is down, refuses, did not answer within `timeoutMs`, or the breaker is open, and
 * `onError` is `'closed'` (or the call has no decision to fall back to). `cause` holds the
 * client's error where there was one. */
export class RateLimitUnavailable extends RateLimitError {}
