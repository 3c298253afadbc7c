package redis

import goredis "github.com/redis/go-redis/v9"

// Each operation is one Lua script: Redis runs a script to the end before it serves any other
// command, so the check and the writes inside it are atomic. The keys a script touches are all
// declared in KEYS:
//
//	resource hash   KeyPrefix + "r:{" + name + "}"
//	epoch           KeyPrefix + "epoch", the store's epoch as a decimal string (Migrate creates
//	                it at the server's clock in microseconds since 1970)
//	incarnation     KeyPrefix + "incarnation", the server's run_id and master_replid when the
//	                epoch was created or last bumped
//	operation       KeyPrefix + "op:" + id, one hash per recorded operation id
//	schema          KeyPrefix + "schema", the layout version
//
// A lease-carrying script reads the resource hash and the epoch key, and a publication also
// the operation key: three keys in different hash slots, which Redis Cluster refuses. The
// scripts declare flags=no-cluster, so a cluster node rejects them before running anything.
//
// The resource hash has the fields
//
//	generation            integer, created 0 by Provision and only ever incremented
//	epoch                 the store's epoch when generation was last acquired
//	owner                 present only while a lease is installed
//	lease_until_us        present only while a lease is installed; server microseconds
//	published_generation  integer, created 0 by Provision
//	published_epoch       the epoch of the published generation
//	published_at_us       server microseconds of the last publication
//	source_version        of the published payload, when one was given
//	payload               the last publication
//
// and an operation hash has outcome ("accepted" or "aborted"), recorded_at_us and, when
// accepted, resource, epoch and generation.
//
// # Validate, then write
//
// Redis does not roll back a script that fails halfway: the writes made before the error stay.
// Every script below therefore reads and checks everything first and only then writes, and
// its writes cannot fail on their own (the types of the keys they write, and the generation
// HINCRBY increments, were checked by the reads, and an out-of-memory refusal comes before a
// script with flags starts). So an error reply from a script means it wrote nothing, which is
// what lets classify report a server error as "not applied". Key permissions are checked
// before a script starts (Redis 7 wants read and write access to every declared key). A
// command that the user's ACL denies is refused only when called; the first write of every
// lease-carrying script is recordBump's SET, so a user denied SET gets its error before
// anything changed, and one allowed SET but denied a later command (HINCRBY, HSET, PUBLISH)
// can leave only a recorded bump, which fences and grants nothing.
//
// # Epochs
//
// BumpEpoch is one SET of the epoch key, to max(epoch + 1, TIME in microseconds); it does not visit the resource hashes, which would
// mean touching keys no script can declare in advance. Instead every lease-carrying script
// requires lease.epoch == the current epoch (read from the declared epoch key), so a bump
// fences every earlier lease at once, and Acquire treats a row whose epoch is older than the
// current one as free. Read reports such a row without an owner, as it would after a release.
//
// # Restarts and promotions
//
// A Redis server that restarts from an older snapshot, or without persistence, or a replica
// promoted in a failover, may have lost acquisitions it acknowledged. Each such event changes
// what INFO reports: a restart gives the process a new run_id, and a promotion gives the new
// primary a new master_replid (also when the promoted process was the primary before and was
// re-synced as a replica in between, so that its run_id is the one recorded). Every
// lease-carrying script reads both from INFO itself, inside the script, so no caller can supply
// them, and compares them with the incarnation key. When they differ (or the key is missing,
// as in a store from before this check) the script bumps the epoch before anything else, to
// max(epoch + 1, TIME), records the new incarnation, and then does its work under the new
// epoch: an acquisition gets a token above every token of the lost history, and a lease from
// before the event is refused. A bump can only make tokens larger and fence leases, never make
// an old token valid, so bumping at a restart that lost nothing costs only the leases held
// across it. The check needs INFO to be callable from scripts (an ACL that denies @dangerous
// denies it); a script that cannot read the run id fails before writing anything.
//
// Integers that pass through Lua are doubles there: exact up to 2^53, far above a microsecond
// clock (about 2^51 today) or any generation. They are written back with string.format('%d')
// because Lua's default number-to-string conversion may use exponent notation. Epochs and
// generations are compared as the decimal strings INCR and HINCRBY stored, so no conversion
// can blur them.

// Script headers. Flags make Redis check, before the script runs, what the script needs:
// no-cluster refuses a cluster node; without allow-oom a writing script is refused as a whole
// when the server is over maxmemory (rather than at its first write); no-writes lets a reading
// script run on a replica.
const (
	writes = "#!lua flags=no-cluster\n"
	reads  = "#!lua flags=no-cluster,no-writes\n"
)

// serverNow reads the server's clock. Redis 7 always replicates a script by its effects (the
// writes it makes), not by re-running it, so a script may call TIME before it writes and
// replicas and the AOF receive the time it computed, never a second reading.
const serverNow = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
`

// currentEpoch reads the store's epoch from KEYS[2]; a missing key means Migrate has not run
// (or the key was deleted), and no script guesses an epoch.
const currentEpoch = `
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  return redis.error_reply('ERR fenced: the epoch key is missing; run Migrate')
end
`

// serverIncarnation reads the server's run_id and master_replid from INFO, inside the script.
const serverIncarnation = `
local function serverIncarnation()
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
  if not run or not replid then
    return nil
  end
  return run .. ':' .. replid
end
`

// checkIncarnation follows currentEpoch and serverNow in every lease-carrying script. When the
// server's incarnation differs from the one recorded in KEYS[3] (or none is recorded), it moves
// epoch to max(epoch + 1, now) in the script's view; recordBump, called at the script's first
// write (or instead of one, when the script refuses), stores it. See "Restarts and promotions".
const checkIncarnation = serverIncarnation + `
local incarnation = serverIncarnation()
if not incarnation then
  return redis.error_reply('ERR fenced: INFO does not report run_id and master_replid')
end
local bumped = redis.call('GET', KEYS[3]) ~= incarnation
if bumped then
  epoch = string.format('%d', math.max(tonumber(epoch) + 1, now))
end
-- Called after the script's checks, so that an error reply still means nothing was written.
local function recordBump()
  if bumped then
    redis.call('SET', KEYS[2], epoch)
    redis.call('SET', KEYS[3], incarnation)
    bumped = false
  end
end
`

// holds is true where the row's lease belongs to (owner ARGV[1], generation ARGV[2], epoch
// ARGV[3]), that epoch is the current one, and the lease has not expired. row holds the fields
// owner, generation, epoch, lease_until_us in that order.
const holds = `
local function holds(row)
  return row[1] == ARGV[1] and row[2] == ARGV[2] and row[3] == ARGV[3] and ARGV[3] == epoch
    and row[4] ~= false and tonumber(row[4]) > now
end
`

// luaProvision creates the row's counters where they are absent and never touches one that
// exists: HSETNX is create-if-absent per field. KEYS: resource.
const luaProvision = writes + `
redis.call('HSETNX', KEYS[1], 'generation', '0')
redis.call('HSETNX', KEYS[1], 'published_generation', '0')
return 1
`

// luaAcquire returns {1, epoch, generation, lease_until_us} when granted, {0, holder epoch,
// holder generation, holder lease_until_us} when busy, and {-1, 0, 0, 0} when the row does not
// exist. A lease from an earlier epoch is free: the bump that ended that epoch freed it.
// KEYS: resource, epoch, incarnation. ARGV: owner, ttl in microseconds.
const luaAcquire = writes + serverNow + currentEpoch + checkIncarnation + `
local row = redis.call('HMGET', KEYS[1], 'generation', 'owner', 'lease_until_us', 'epoch')
if not row[1] then
  recordBump()
  return {-1, 0, 0, 0}
end
-- HINCRBY would refuse a generation that is not an integer (or would overflow), but only
-- after recordBump wrote: checked here, before any write.
if not string.match(row[1], '^%d+$') or #row[1] > 18 then
  return redis.error_reply('ERR fenced: the generation of this resource is not an integer')
end
local ttl = tonumber(ARGV[2])
if row[2] and row[4] == epoch and tonumber(row[3]) > now then
  if row[2] == ARGV[1] then
    -- Owners are fresh per acquisition, so this is a resend of an acquisition that was granted
    -- and whose reply was lost: it gets its own grant back rather than a busy refusal.
    return {1, tonumber(row[4]), tonumber(row[1]), tonumber(row[3])}
  end
  return {0, tonumber(row[4]), tonumber(row[1]), tonumber(row[3])}
end
-- The bump is recorded first, as in every script: a user refused the SET (an ACL) then gets
-- an error before the generation moved.
recordBump()
local generation = redis.call('HINCRBY', KEYS[1], 'generation', 1)
local untilUs = now + ttl
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_until_us', string.format('%d', untilUs), 'epoch', epoch)
return {1, tonumber(epoch), generation, untilUs}
`

// luaRenew returns the new lease_until_us, or 0 when the lease is not current and unexpired.
// KEYS: resource, epoch, incarnation. ARGV: owner, generation, epoch, ttl in microseconds.
const luaRenew = writes + serverNow + currentEpoch + checkIncarnation + holds + `
local row = redis.call('HMGET', KEYS[1], 'owner', 'generation', 'epoch', 'lease_until_us')
local ttl = tonumber(ARGV[4])
local current = holds(row)
recordBump()
if not current then
  return 0
end
local untilUs = now + ttl
redis.call('HSET', KEYS[1], 'lease_until_us', string.format('%d', untilUs))
return untilUs
`

// publishCheck and publishWrite store the payload and record the operation id as accepted,
// where the lease is
// current and unexpired, its generation has not published yet, the source version (if any) is
// not older than the published one, and the operation id has no recorded outcome. The scripts
// below return 1 when it did, 0 when refused.
// KEYS: resource, epoch, incarnation, operation. ARGV: owner, generation, epoch, payload,
// source version (0: none), resource name, and the released channel (notify.go).
const publishCheck = serverNow + currentEpoch + checkIncarnation + holds + `
local row = redis.call('HMGET', KEYS[1], 'owner', 'generation', 'epoch', 'lease_until_us',
  'published_generation', 'source_version')
local sv = tonumber(ARGV[5])
local refused = redis.call('EXISTS', KEYS[4]) == 1 or not holds(row)
  or tonumber(row[5]) >= tonumber(ARGV[2])
  or (sv > 0 and tonumber(row[6] or '0') > sv)
recordBump()
if refused then
  return 0
end
`

// announce7 announces the lease that the script is about to free on the released channel
// (ARGV[7]). It comes after every check and before the first write: PUBLISH is refused to a
// user whose ACL lacks the channel, and that refusal must come before anything is written.
// Subscribers hear it after the script ends (they are served after it, like every client).
const announce7 = `
redis.call('PUBLISH', ARGV[7], KEYS[1])
`

const publishWrite = `
local at = string.format('%d', now)
redis.call('HSET', KEYS[1], 'payload', ARGV[4], 'published_generation', ARGV[2],
  'published_epoch', ARGV[3], 'published_at_us', at)
if sv > 0 then
  redis.call('HSET', KEYS[1], 'source_version', ARGV[5])
end
redis.call('HSET', KEYS[4], 'outcome', 'accepted', 'resource', ARGV[6], 'epoch', ARGV[3],
  'generation', ARGV[2], 'recorded_at_us', at)
`

const luaPublish = writes + publishCheck + publishWrite + `
return 1
`

const luaPublishAndRelease = writes + publishCheck + announce7 + publishWrite + `
redis.call('HDEL', KEYS[1], 'owner', 'lease_until_us')
return 1
`

// luaRelease frees the lease where owner, generation and epoch match and the epoch is the
// current one, expired or not; it never touches the counters.
// It announces the freed lease on the released channel (notify.go).
// KEYS: resource, epoch, incarnation. ARGV: owner, generation, epoch, released channel.
const luaRelease = writes + serverNow + currentEpoch + checkIncarnation + `
local row = redis.call('HMGET', KEYS[1], 'owner', 'generation', 'epoch')
recordBump()
if row[1] ~= ARGV[1] or row[2] ~= ARGV[2] or row[3] ~= ARGV[3] or ARGV[3] ~= epoch then
  return 0
end
redis.call('PUBLISH', ARGV[4], KEYS[1])
redis.call('HDEL', KEYS[1], 'owner', 'lease_until_us')
return 1
`

// luaRead returns {exists, epoch, generation, owner, lease_until_us, published_epoch,
// published_generation, published_at_us, source_version, payload size, current epoch, now};
// absent fields read as 0 or the empty string. A lease from an earlier epoch is reported as
// no lease: the bump freed it, and Acquire treats it so. KEYS: resource, epoch.
const luaRead = reads + serverNow + currentEpoch + `
local row = redis.call('HMGET', KEYS[1], 'generation', 'owner', 'lease_until_us', 'epoch',
  'published_epoch', 'published_generation', 'published_at_us', 'source_version')
if not row[1] then
  return {0, 0, 0, '', 0, 0, 0, 0, 0, 0, tonumber(epoch), now}
end
local owner, untilUs = row[2] or '', tonumber(row[3] or '0')
if row[4] ~= epoch then
  owner, untilUs = '', 0
end
return {1, tonumber(row[4] or '0'), tonumber(row[1]), owner, untilUs, tonumber(row[5] or '0'),
  tonumber(row[6] or '0'), tonumber(row[7] or '0'), tonumber(row[8] or '0'),
  redis.call('HSTRLEN', KEYS[1], 'payload'), tonumber(epoch), now}
`

// luaReadPayload returns {exists, published_generation, payload}. KEYS: resource.
const luaReadPayload = reads + `
local row = redis.call('HMGET', KEYS[1], 'generation', 'published_generation', 'payload')
if not row[1] then
  return {0, 0, ''}
end
return {1, tonumber(row[2] or '0'), row[3] or ''}
`

// luaResolve records the operation as aborted unless an outcome is recorded, and returns the
// recorded one: {outcome, resource, epoch, generation, recorded_at_us}, absent fields false.
// KEYS: operation.
const luaResolve = writes + serverNow + `
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'outcome', 'aborted', 'recorded_at_us', string.format('%d', now))
end
return redis.call('HMGET', KEYS[1], 'outcome', 'resource', 'epoch', 'generation', 'recorded_at_us')
`

// luaReadOperation returns what luaResolve returns, without recording anything; all false when
// nothing is recorded. KEYS: operation.
const luaReadOperation = reads + `
return redis.call('HMGET', KEYS[1], 'outcome', 'resource', 'epoch', 'generation', 'recorded_at_us')
`

// luaBumpEpoch sets the epoch to max(epoch + 1, TIME in microseconds), records the server's
// incarnation, and returns the epoch. That alone frees every lease: see Epochs above. A missing
// key is an error: Migrate creates it. It announces the freed leases on the released channel
// with the epoch key as the message. KEYS: epoch, incarnation. ARGV: released channel.
const luaBumpEpoch = writes + serverNow + serverIncarnation + `
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  return redis.error_reply('ERR fenced: the epoch key is missing; run Migrate')
end
local incarnation = serverIncarnation()
if not incarnation or not tonumber(epoch) then
  return redis.error_reply('ERR fenced: INFO does not report run_id and master_replid, or the epoch is not a number')
end
local bumped = math.max(tonumber(epoch) + 1, now)
redis.call('PUBLISH', ARGV[1], KEYS[1])
redis.call('SET', KEYS[1], string.format('%d', bumped))
redis.call('SET', KEYS[2], incarnation)
return bumped
`

// luaPrune deletes the operation records among KEYS recorded before now - ARGV[1]
// microseconds, and returns how many it deleted. It reads every key before deleting any, so an
// error (a key of another type) leaves all of them in place. A key that has gone since the
// SCAN that listed it is skipped.
const luaPrune = writes + serverNow + `
local before = now - tonumber(ARGV[1])
local old = {}
for _, key in ipairs(KEYS) do
  local at = redis.call('HGET', key, 'recorded_at_us')
  if at and tonumber(at) < before then
    old[#old + 1] = key
  end
end
if #old > 0 then
  redis.call('DEL', unpack(old))
end
return #old
`

// luaMigrate records this driver's schema version unless a newer one is recorded, creates the
// epoch key at the server's clock in microseconds (with the server's incarnation) where it is
// absent, and returns the version recorded before (0: none). A store lost entirely (flushed, or
// a server restarted without persistence) thus starts above every epoch it had, so its tokens
// are above every token it issued. Version 1 had no epochs: its rows have no epoch field, so any
// lease they hold is from an earlier epoch and is free after the upgrade. Version 2 recorded no
// incarnation: the first lease-carrying script bumps its epoch. KEYS: schema, epoch,
// incarnation. ARGV: version.
const luaMigrate = writes + serverNow + serverIncarnation + `
local v = redis.call('GET', KEYS[1])
local n = 0
if v then
  n = tonumber(v)
  if not n then
    return redis.error_reply('ERR fenced: the schema version key holds ' .. v .. ', not a number')
  end
end
local e = redis.call('GET', KEYS[2])
if e and not tonumber(e) then
  return redis.error_reply('ERR fenced: the epoch key holds ' .. e .. ', not a number')
end
if n > tonumber(ARGV[1]) then
  return n
end
local incarnation = serverIncarnation()
if not incarnation then
  return redis.error_reply('ERR fenced: INFO does not report run_id and master_replid')
end
redis.call('SET', KEYS[1], ARGV[1])
if not e then
  redis.call('SET', KEYS[2], string.format('%d', now))
  redis.call('SET', KEYS[3], incarnation)
end
return n
`

// The scripts, run with EVALSHA and sent in full (EVAL) only when the server does not have
// them cached yet; NOSCRIPT means the script did not run, so that fallback is never a resend.
var (
	scriptProvision         = goredis.NewScript(luaProvision)
	scriptAcquire           = goredis.NewScript(luaAcquire)
	scriptRenew             = goredis.NewScript(luaRenew)
	scriptPublish           = goredis.NewScript(luaPublish)
	scriptPublishAndRelease = goredis.NewScript(luaPublishAndRelease)
	scriptRelease           = goredis.NewScript(luaRelease)
	scriptRead              = goredis.NewScript(luaRead)
	scriptReadPayload       = goredis.NewScript(luaReadPayload)
	scriptResolve           = goredis.NewScript(luaResolve)
	scriptReadOperation     = goredis.NewScript(luaReadOperation)
	scriptBumpEpoch         = goredis.NewScript(luaBumpEpoch)
	scriptPrune             = goredis.NewScript(luaPrune)
	scriptMigrate           = goredis.NewScript(luaMigrate)

	allScripts = []*goredis.Script{scriptProvision, scriptAcquire, scriptRenew, scriptPublish,
		scriptPublishAndRelease, scriptRelease, scriptRead, scriptReadPayload, scriptResolve,
		scriptReadOperation, scriptBumpEpoch, scriptPrune, scriptMigrate}
)
