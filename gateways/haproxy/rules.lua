-- /etc/haproxy/redis-ratelimit/rules.lua: the limits haproxy.cfg applies by name.
local ratelimit = require("ratelimit")

ratelimit.configure{
    redis = "127.0.0.1:6379",
    timeout_ms = 50,
    -- Loaded into a server that has neither the module nor the library.
    library = "/etc/haproxy/redis-ratelimit/functions.lua",
}

-- 100 a minute per API key. Fails open.
ratelimit.rule("api", { key = "txn.api_key", limit = "sliding-window 100 1m" })

-- 5 logins per 15 minutes per client address. Fails closed (503) without Redis.
ratelimit.rule("login", {
    key = "txn.login_key",
    limit = "fixed-window 5 15m",
    on_error = "closed",
})

-- Two limits at once (RATELIMIT.CHECKALL): 5 a second and 1000 an hour per address.
ratelimit.rule("search", {
    limits = {
        { key = "txn.ip_sec", limit = "token-bucket 5 1s", name = "sec" },
        { key = "txn.ip_hour", limit = "token-bucket 1000 1h", name = "hour" },
    },
})

-- A policy defined on the server (RATELIMIT.POLICY SET upload ...); the fallback applies where
-- the server has no such policy (and on the library).
ratelimit.rule("upload", { key = "txn.tenant", policy = "upload", fallback = "token-bucket 10 1m" })

-- A key computed in Lua, a function of the transaction (nil or "" leaves the request
-- unlimited): 20 an hour per partner, named in any case by the X-Partner header.
ratelimit.rule("partner", {
    key = function(txn)
        local partner = txn.sf:req_hdr("x-partner")
        if partner == nil or partner == "" then return nil end
        return "partner:" .. partner:lower()
    end,
    limit = "sliding-log 20 1h",
})
