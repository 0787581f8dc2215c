//! The advice that Redis may evict lock keys (`maxmemory-policy`).

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::{Handle, RedisLink};
use crate::events;

/// Reads `maxmemory-policy` through INFO (allowed where CONFIG is not) and warns when Redis
/// may evict lock keys. A denied INFO is not an error: the check is advice.
/// In a Cluster, INFO is asked of any one node.
pub(super) async fn check_eviction_policy(link: Arc<RedisLink>, conn: Handle) {
    let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(5), info_memory(conn)).await else {
        return;
    };
    if let Some(policy) = maxmemory_policy(&info) {
        if policy != "noeviction" {
            events::eviction_unsafe(link.driver_id, policy);
        }
    }
}

async fn info_memory(conn: Handle) -> redis::RedisResult<String> {
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    match conn {
        Handle::Single(mut conn) => info.query_async(&mut conn).await,
        Handle::Lane(lane) => {
            Ok(redis::from_redis_value(lane.send(&info).await?.extract_error()?)?)
        }
        // INFO has no key: redis-rs would ask every primary and merge the replies.
        Handle::Cluster(mut cluster) => {
            let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
            let reply = cluster.route_command(info, any).await?;
            Ok(redis::from_redis_value(reply).unwrap_or_default())
        }
    }
}

fn maxmemory_policy(info: &str) -> Option<&str> {
    info.lines().find_map(|line| line.strip_prefix("maxmemory_policy:")).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_read_from_info_memory() {
        let info = "# Memory\r\nused_memory:1\r\nmaxmemory_policy:allkeys-lru\r\nmem_fragmentation_ratio:1.0\r\n";
        assert_eq!(maxmemory_policy(info), Some("allkeys-lru"));
        assert_eq!(maxmemory_policy("# Memory\r\n"), None);
    }
}
