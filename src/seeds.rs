//! `redis://[[user]:password@]host[:port][,host[:port]]…[/db]` with `cluster: true`: the
//! seed nodes of a Cluster, each turned into a URL of its own that redis-rs parses the way
//! it parses any `redis://` URL (credentials percent-decoded, port 6379 by default), so the
//! URL's credentials, database and TLS apply to every node (CONTRACT "Cluster seed nodes").
//!
//! Rules are reported, never the text: it holds a password.

/// The URL of each node `url` lists, in the listed order; one for a single-node URL.
pub(crate) fn split(url: &str) -> Result<Vec<String>, &'static str> {
    const RULE: &str = "connection.url lists a node that is not a valid host[:port]";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("connection.url is not a valid Redis URL");
    };
    // The hosts run from after the credentials to the database path or the query.
    let hosts_start = rest.rfind('@').map_or(0, |at| at + 1);
    let hosts_end = rest[hosts_start..].find(['/', '?']).map_or(rest.len(), |i| hosts_start + i);
    let (userinfo, hosts, tail) =
        (&rest[..hosts_start], &rest[hosts_start..hosts_end], &rest[hosts_end..]);
    hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                return Err(RULE);
            }
            let node = format!("{scheme}://{userinfo}{host}{tail}");
            match redis::IntoConnectionInfo::into_connection_info(node.as_str()) {
                Ok(_) => Ok(node),
                Err(_) => Err(RULE),
            }
        })
        .collect()
}

/// True when `url` lists more than one node.
pub(crate) fn lists_several(url: &str) -> bool {
    url.split_once("://").is_some_and(|(_, rest)| {
        let start = rest.rfind('@').map_or(0, |at| at + 1);
        let end = rest[start..].find(['/', '?']).map_or(rest.len(), |i| start + i);
        rest[start..end].contains(',')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_seed_gets_the_urls_credentials_and_database() {
        let seeds = split("redis://u:p%40ss@h1,h2:7001,[::1]:7002/0").unwrap();
        assert_eq!(
            seeds,
            [
                "redis://u:p%40ss@h1/0",
                "redis://u:p%40ss@h2:7001/0",
                "redis://u:p%40ss@[::1]:7002/0"
            ]
        );
        let info = redis::IntoConnectionInfo::into_connection_info(seeds[0].as_str()).unwrap();
        assert_eq!(info.redis_settings().password(), Some("p@ss"));
        assert_eq!(info.addr().to_string(), "h1:6379");
        assert_eq!(split("rediss://h").unwrap(), ["rediss://h"]);
        assert!(lists_several("redis://:a,b@h1,h2") && !lists_several("redis://:a,b@h1"));
    }

    #[test]
    fn an_empty_or_malformed_seed_is_refused_without_the_urls_text() {
        for url in ["redis://:secret@h1,,h2", "redis://:secret@h1,", "redis://:secret@h1,h2:x"] {
            let rule = split(url).unwrap_err();
            assert!(!rule.contains("secret"), "{rule}");
        }
    }
}
