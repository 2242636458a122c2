-- The registration: each callback binds the standard library on the first call (see bind).
redis.register_function {
  function_name = 'ratelimit_check',
  callback = function(keys, args)
    if not bound then bind() end
    return check('ratelimit_check', keys, args, true)
  end,
  description = 'RATELIMIT.CHECK: 1 key algorithm limit period [BURST c] [BLOCK d] [COST n] '
    .. '[AT ms]',
}
redis.register_function {
  function_name = 'ratelimit_peek',
  callback = function(keys, args)
    if not bound then bind() end
    return check('ratelimit_peek', keys, args, false)
  end,
  flags = { 'no-writes' },
  description = 'RATELIMIT.PEEK: what ratelimit_check would answer, changing nothing',
}
redis.register_function {
  function_name = 'ratelimit_checkall',
  callback = function(keys, args)
    if not bound then bind() end
    return checkall(keys, args)
  end,
  description = 'RATELIMIT.CHECKALL: N keys, one algorithm limit period [BURST c] [BLOCK d] '
    .. 'per key, '
    .. '[COST n] [AT ms]; all or nothing',
}
redis.register_function {
  function_name = 'ratelimit_refund',
  callback = function(keys, args)
    if not bound then bind() end
    return refund(keys, args)
  end,
  description = 'RATELIMIT.REFUND: 1 key algorithm limit period [BURST c] [BLOCK d] COST n '
    .. '[AT ms]; gives '
    .. 'back up to n of what earlier calls consumed',
}
redis.register_function {
  function_name = 'ratelimit_reset',
  callback = function(keys, args)
    if not bound then bind() end
    return reset(keys, args)
  end,
  description = 'RATELIMIT.RESET: N keys; removes limiters, replies how many',
}
redis.register_function {
  function_name = 'ratelimit_info',
  callback = function(keys, args)
    if not bound then bind() end
    return info(keys, args)
  end,
  flags = { 'no-writes' },
  description = 'RATELIMIT.INFO: 1 key; the stored state as field/value pairs, nil if missing',
}
redis.register_function {
  function_name = 'ratelimit_acquire',
  callback = function(keys, args)
    if not bound then bind() end
    return acquire(keys, args)
  end,
  description = 'RATELIMIT.ACQUIRE: 1 key limit lease-duration ID lease-id [COST n] [AT ms]; '
    .. 'takes (or renews) a lease if the limit has room for it',
}
-- allow-oom: a release only removes and rewrites members (memory is given back), and the
-- module's RELEASE is allowed over maxmemory so that a request's `finally` can always run.
redis.register_function {
  function_name = 'ratelimit_release',
  callback = function(keys, args)
    if not bound then bind() end
    return release(keys, args)
  end,
  flags = { 'allow-oom' },
  description = 'RATELIMIT.RELEASE: 1 key ID lease-id [AT ms]; gives a lease back, 1 if it was '
    .. 'live',
}
redis.register_function {
  function_name = 'ratelimit_take',
  callback = function(keys, args)
    if not bound then bind() end
    return take(keys, args)
  end,
  description = 'RATELIMIT.TAKE: 1 key algorithm limit period [BURST c] [BLOCK d] MAX n [AT ms]; '
    .. 'grants and consumes the largest cost up to n that ratelimit_check would admit',
}
