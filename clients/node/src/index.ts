// redis-ratelimit-client: rate limits on Redis for node-redis and ioredis.
export {
  ALGORITHMS,
  limit,
  policy,
  periodMs,
  type Algorithm,
  type Decision,
  type Limit,
  type LimitSpec,
  type MultiDecision,
  type Period,
  type Policy,
  type PolicyDefinition,
  type Source,
} from './core.js';
export { RateLimited, RateLimitError, RateLimitUnavailable } from './errors.js';
export { LIBRARY_NAME, Policies, RateLimiter, type CallOptions, type Logger, type RateLimiterOptions, type Stats } from './limiter.js';
export { addressKey, rateLimitHeaders, type RateLimitOptions } from './http.js';
export { LIBRARY } from './generated/library.js';
