-- luacheck for the gateways' Lua: `luacheck --config gateways/.luacheckrc gateways/`.
-- The core runs on LuaJIT (NGINX) and Lua 5.3/5.4 (HAProxy): it keeps to what all three have.
std = "max"
max_line_length = 100

files["gateways/nginx/"] = { globals = { "ngx" } }
files["gateways/haproxy/"] = { read_globals = { "core" } }
