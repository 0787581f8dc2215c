-- In a Cluster with minReplicas (decision 0142): rewrite a lease that is still ours, unchanged,
-- so that the WAIT sent right after it, on the same node connection, counts replicas that
-- have it. A WAIT counts the writes of the connection it runs on, and redis-rs may have
-- reconnected to the node, or the slot may have moved, since the acquire or renew wrote.
-- KEYS[1] lock key; ARGV[1] owner token.
-- Reply: 1 when rewritten, 0 when another token or none holds the key on this node.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'XX', 'KEEPTTL')
return 1
