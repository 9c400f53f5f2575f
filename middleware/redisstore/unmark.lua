-- unmark.lua: ExpiringKeyRepository, after a SET NX GET whose answer was
-- lost. Not a record of the store: no codec.
--
-- KEYS[1]  the repository's key
-- ARGV[1]  the mark that call wrote
--
-- Reply: 1 when the key held ARGV[1] and was deleted; 0 otherwise (another
-- call's mark, or none: nothing changes).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
