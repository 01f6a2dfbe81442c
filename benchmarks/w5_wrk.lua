-- W5 heartbeats for wrk (Debian's wrk 4.1), run by benchmarks/w5_wrk.py, not on its own.
--
--   wrk -t 1 -c C -d S --timeout 10s -s w5_wrk.lua URL -- DEVICES PERIOD_MS CLOSE
--
-- DEVICES: a file of "device_id token" lines. Each request is the next device's
-- POST /api/v1/devices/{id}/heartbeat with its own bearer token (round robin), so a
-- window of a few seconds spreads over every device. PERIOD_MS: each connection waits
-- this long after an answer before its next request (C connections / PERIOD_MS = the
-- rate); the first wait of each connection is a random phase in [0, PERIOD_MS), so the
-- connections do not beat together. CLOSE: "1" sends Connection: close (wrk then opens a
-- new connection per heartbeat; wrk's latency starts once the request is written, so
-- the TCP handshake is not in it), "0" keeps connections open.
-- done() prints one JSON line: requests, duration (us), wrk's socket errors, answers
-- other than 204, and latency percentiles (us) from wrk's HdrHistogram.

local devices = {}
local next_device = 0
local period_ms = 100
local close = true
local phases_left = 0
local threads = {}
non204 = 0

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  for line in io.lines(args[1]) do
    local id, token = line:match("^(%S+)%s+(%S+)")
    if id then
      table.insert(devices, { id = id, token = token })
    end
  end
  period_ms = tonumber(args[2])
  close = args[3] == "1"
  phases_left = tonumber(args[4] or "0")
  math.randomseed(0)
end

function request()
  next_device = next_device % #devices + 1
  local device = devices[next_device]
  local headers = { ["Authorization"] = "Bearer " .. device.token }
  if close then
    headers["Connection"] = "close"
  end
  return wrk.format("POST", "/api/v1/devices/" .. device.id .. "/heartbeat", headers, nil)
end

function delay()
  if phases_left > 0 then
    phases_left = phases_left - 1
    return math.random() * period_ms
  end
  return period_ms
end

function response(status, headers, body)
  if status ~= 204 then
    non204 = non204 + 1
  end
end

function done(summary, latency, requests)
  local other = 0
  for _, thread in ipairs(threads) do
    other = other + thread:get("non204")
  end
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, '
      .. '"status": %d, "timeout": %d, "non204": %d, "p50_us": %d, "p95_us": %d, '
      .. '"p99_us": %d, "max_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    other, latency:percentile(50), latency:percentile(95), latency:percentile(99),
    latency.max, latency.mean))
end
