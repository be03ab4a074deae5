-- wrk script for tests/bench/load_http.sh and tests/http_load.sh: POSTs the
-- JSON file named by $D3_WRK_BODY (default ops/examples/d3-nano-npu2.json) to
-- the URL given to wrk, counts the responses by status in each thread, and
-- prints in done() one "d3:" line per figure for the calling script to parse:
--   d3: requests N / duration_s S / rps R / latency_ms p50 p90 p99 max
--   d3: errors connect read write timeout status
--   d3: status CODE COUNT   (one line per status seen)

local path = os.getenv("D3_WRK_BODY") or "ops/examples/d3-nano-npu2.json"
local f = assert(io.open(path, "rb"), "wrk_post.lua: cannot open " .. path)
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  counts = {}
end

function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local c = t:get("counts")
    for status, n in pairs(c or {}) do
      total[status] = (total[status] or 0) + n
    end
  end
  local secs = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format("d3: requests %d\n", summary.requests))
  io.write(string.format("d3: duration_s %.3f\n", secs))
  io.write(string.format("d3: rps %.1f\n", summary.requests / secs))
  io.write(string.format("d3: latency_ms %.3f %.3f %.3f %.3f\n",
    latency:percentile(50) / 1e3, latency:percentile(90) / 1e3,
    latency:percentile(99) / 1e3, latency.max / 1e3))
  io.write(string.format("d3: errors %d %d %d %d %d\n",
    e.connect, e.read, e.write, e.timeout, e.status))
  local codes = {}
  for status in pairs(total) do table.insert(codes, status) end
  table.sort(codes)
  for _, status in ipairs(codes) do
    io.write(string.format("d3: status %d %d\n", status, total[status]))
  end
end
