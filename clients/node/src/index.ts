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
  type CallOptions,
  type Stats,
  RateLimited,
  RateLimitError,
  RateLimitUnavailable,
} from './types.js';
export { LIBRARY_NAME, type Logger, type RateLimiterOptions } from './engine.js';
export { Policies, RateLimiter } from './limiter.js';
export { addressKey, rateLimitHeaders, type RateLimitOptions } from './http.js';
export { LIBRARY } from './generated/library.js';
