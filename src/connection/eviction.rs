//! The advice that Redis may evict lock keys (`maxmemory-policy`).

use std::sync::Arc;
use std::time::Duration;

use super::{Handle, RedisLink, Target};
use crate::events;

/// Reads `maxmemory-policy` through INFO (allowed where CONFIG is not) and warns when Redis
/// may evict lock keys. A denied INFO is not an error: the check is advice.
/// In a Cluster, INFO is asked of the node the URL names.
pub(super) async fn check_eviction_policy(link: Arc<RedisLink>, conn: Handle) {
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    let ask = async {
        let mut conn = match conn {
            Handle::Single(conn) => conn,
            Handle::Cluster(_) => match &link.target {
                Target::Fixed(node) => {
                    node.resp2.get_multiplexed_async_connection_with_config(&link.config).await?
                }
                Target::Sentinel(_) => return Ok(String::new()),
            },
        };
        info.query_async::<String>(&mut conn).await
    };
    let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(5), ask).await else { return };
    if let Some(policy) = maxmemory_policy(&info) {
        if policy != "noeviction" {
            events::eviction_unsafe(link.driver_id, policy);
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
