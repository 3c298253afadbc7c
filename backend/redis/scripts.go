package redis

import goredis "github.com/redis/go-redis/v9"

// Each operation is one Lua script on one key: Redis runs a script to the end before it serves
// any other command, so the check and the write inside it are atomic. Every script touches only
// KEYS[1], so the scripts also run on Redis Cluster, routed by that key's hash slot.
//
// The row is a hash with the fields
//
//	generation            integer, created 0 by Provision and only ever incremented
//	published_generation  integer, created 0 by Provision
//	owner                 present only while a lease is installed
//	lease_until_us        present only while a lease is installed; server microseconds
//	published_at_us       server microseconds of the last publication
//	payload               the last publication
//
// Integers that pass through Lua are doubles there: exact up to 2^53, far above a microsecond
// clock (about 2^51 today) or any generation. They are written back with string.format('%d')
// because Lua's default number-to-string conversion may use exponent notation.

// serverNow reads the server's clock. Redis 7 always replicates a script by its effects (the
// writes it makes), not by re-running it, so a script may call TIME before it writes and
// replicas and the AOF receive the time it computed, never a second reading.
const serverNow = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
`

// holds is true where the row's lease belongs to (owner, generation) and has not expired. The
// generation is compared as the decimal string HINCRBY stored, so no conversion can blur it.
const holds = `
local function holds(row, owner, generation)
  return row[1] == owner and row[2] == generation and row[3] ~= false and tonumber(row[3]) > now
end
`

// luaProvision creates the row's counters where they are absent and never touches one that
// exists: HSETNX is create-if-absent per field.
const luaProvision = `
redis.call('HSETNX', KEYS[1], 'generation', '0')
redis.call('HSETNX', KEYS[1], 'published_generation', '0')
return 1
`

// luaAcquire returns {1, generation, lease_until_us} when granted, {0, holder generation,
// holder lease_until_us} when busy, and {-1, 0, 0} when the row does not exist.
// ARGV: owner, ttl in microseconds.
const luaAcquire = serverNow + `
local row = redis.call('HMGET', KEYS[1], 'generation', 'owner', 'lease_until_us')
if not row[1] then
  return {-1, 0, 0}
end
if row[3] and tonumber(row[3]) > now then
  if row[2] == ARGV[1] then
    -- Owners are fresh per acquisition, so this is a resend of an acquisition that was granted
    -- and whose reply was lost: it gets its own grant back rather than a busy refusal.
    return {1, tonumber(row[1]), tonumber(row[3])}
  end
  return {0, tonumber(row[1]), tonumber(row[3])}
end
local generation = redis.call('HINCRBY', KEYS[1], 'generation', 1)
local untilUs = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_until_us', string.format('%d', untilUs))
return {1, generation, untilUs}
`

// luaRenew returns the new lease_until_us, or 0 when the lease is not current and unexpired.
// ARGV: owner, generation, ttl in microseconds.
const luaRenew = serverNow + holds + `
local row = redis.call('HMGET', KEYS[1], 'owner', 'generation', 'lease_until_us')
if not holds(row, ARGV[1], ARGV[2]) then
  return 0
end
local untilUs = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'lease_until_us', string.format('%d', untilUs))
return untilUs
`

// publishBody stores the payload where the lease is current and unexpired and its generation
// has not published yet; the scripts below return 1 when it did, 0 when refused.
// ARGV: owner, generation, payload.
const publishBody = serverNow + holds + `
local row = redis.call('HMGET', KEYS[1], 'owner', 'generation', 'lease_until_us', 'published_generation')
if not holds(row, ARGV[1], ARGV[2]) or tonumber(row[4]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'payload', ARGV[3], 'published_generation', ARGV[2],
  'published_at_us', string.format('%d', now))
`

const luaPublish = publishBody + `
return 1
`

const luaPublishAndRelease = publishBody + `
redis.call('HDEL', KEYS[1], 'owner', 'lease_until_us')
return 1
`

// luaRelease frees the lease where owner and generation match, expired or not; it never
// touches the counters. ARGV: owner, generation.
const luaRelease = `
local row = redis.call('HMGET', KEYS[1], 'owner', 'generation')
if row[1] ~= ARGV[1] or row[2] ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], 'owner', 'lease_until_us')
return 1
`

// luaRead returns {exists, generation, owner, lease_until_us, published_generation,
// published_at_us, payload size, now}; absent fields read as 0 or the empty string.
const luaRead = serverNow + `
local row = redis.call('HMGET', KEYS[1], 'generation', 'owner', 'lease_until_us',
  'published_generation', 'published_at_us')
if not row[1] then
  return {0, 0, '', 0, 0, 0, 0, now}
end
return {1, tonumber(row[1]), row[2] or '', tonumber(row[3] or '0'), tonumber(row[4] or '0'),
  tonumber(row[5] or '0'), redis.call('HSTRLEN', KEYS[1], 'payload'), now}
`

// luaReadPayload returns {exists, published_generation, payload}.
const luaReadPayload = `
local row = redis.call('HMGET', KEYS[1], 'generation', 'published_generation', 'payload')
if not row[1] then
  return {0, 0, ''}
end
return {1, tonumber(row[2] or '0'), row[3] or ''}
`

// luaMigrate records the schema version under KEYS[1] if none is recorded and returns the
// recorded one. ARGV: this driver's version.
const luaMigrate = `
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1])
  return tonumber(ARGV[1])
end
local n = tonumber(v)
if not n then
  return redis.error_reply('the schema version key holds ' .. v .. ', not a number')
end
return n
`

// The scripts, run with EVALSHA and sent in full (EVAL) only when the server does not have
// them cached yet.
var (
	scriptProvision         = goredis.NewScript(luaProvision)
	scriptAcquire           = goredis.NewScript(luaAcquire)
	scriptRenew             = goredis.NewScript(luaRenew)
	scriptPublish           = goredis.NewScript(luaPublish)
	scriptPublishAndRelease = goredis.NewScript(luaPublishAndRelease)
	scriptRelease           = goredis.NewScript(luaRelease)
	scriptRead              = goredis.NewScript(luaRead)
	scriptReadPayload       = goredis.NewScript(luaReadPayload)
	scriptMigrate           = goredis.NewScript(luaMigrate)
)
