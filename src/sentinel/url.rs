//! `redis-sentinel://[[user]:password@]host[:port][,host[:port]]…[/db]#masterName` (the
//! Lettuce convention) and `rediss-sentinel://…`, split into what redis-rs can parse.
//!
//! The multi-host authority is the one part no URL crate reads; each piece is then handed
//! to redis-rs's own URL parser, so credentials are percent-decoded and hosts checked the
//! way a plain `redis://` URL is. Rules are reported, never the text: it holds a password.

/// The default port of a Sentinel.
pub(crate) const SENTINEL_PORT: u16 = 26379;

/// A parsed Sentinel URL. Holds the data nodes' password: never printed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// `rediss-sentinel://`: TLS to the Sentinels and to the data nodes.
    pub tls: bool,
    /// `host:port` of each Sentinel, in the listed order (IPv6 hosts in brackets).
    pub sentinels: Vec<String>,
    pub master_name: String,
    /// `user:password` exactly as written (still percent-encoded), for the data nodes.
    userinfo: Option<String>,
    /// The database path (`/0`), for the data nodes.
    db: String,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("tls", &self.tls)
            .field("sentinels", &self.sentinels.len())
            .field("master_name", &self.master_name)
            .field("userinfo", &self.userinfo.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// True for the two Sentinel schemes (any case).
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        let scheme = scheme.to_ascii_lowercase();
        scheme == "redis-sentinel" || scheme == "rediss-sentinel"
    })
}

impl SentinelUrl {
    /// Parses a Sentinel URL; the error is the rule it broke, without any of its text.
    pub(crate) fn parse(url: &str) -> Result<Self, &'static str> {
        let (scheme, rest) =
            url.split_once("://").ok_or("connection.url is not a valid Sentinel URL")?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "redis-sentinel" => false,
            "rediss-sentinel" => true,
            _ => return Err("connection.url is not a valid Sentinel URL"),
        };
        let (rest, master_name) =
            match rest.split_once('#') {
                Some((rest, name)) => (rest, name),
                None => return Err(
                    "connection.url needs #masterName (the name Sentinel monitors the primary by)",
                ),
            };
        if master_name.is_empty() {
            return Err(
                "connection.url needs #masterName (the name Sentinel monitors the primary by)",
            );
        }
        if master_name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(
                "connection.url's #masterName must not contain whitespace or control characters",
            );
        }
        if rest.contains('?') {
            return Err("connection.url of a Sentinel takes no ?query");
        }
        let (authority, db) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        if !(db.is_empty() || db == "/" || db[1..].bytes().all(|b| b.is_ascii_digit())) {
            return Err("connection.url's database must be a number");
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo.to_owned()), hosts),
            None => (None, authority),
        };
        let sentinels = hosts.split(',').map(with_port).collect::<Result<Vec<_>, _>>()?;
        let parsed = Self {
            tls,
            sentinels,
            master_name: master_name.to_owned(),
            userinfo,
            db: db.to_owned(),
        };
        // The data nodes' settings (credentials, database) as redis-rs reads them.
        let sample = parsed.node_url(&parsed.sentinels[0]);
        if redis::IntoConnectionInfo::into_connection_info(sample.as_str()).is_err() {
            return Err("connection.url is not a valid Sentinel URL");
        }
        for sentinel in &parsed.sentinels {
            if redis::IntoConnectionInfo::into_connection_info(
                parsed.sentinel_url(sentinel).as_str(),
            )
            .is_err()
            {
                return Err("connection.url lists a Sentinel that is not a valid host[:port]");
            }
        }
        Ok(parsed)
    }

    /// The URL of a data node at `address` (`host:port`): the URL's credentials and database.
    pub(crate) fn node_url(&self, address: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match &self.userinfo {
            Some(userinfo) => format!("{scheme}://{userinfo}@{address}{}", self.db),
            None => format!("{scheme}://{address}{}", self.db),
        }
    }

    /// The URL of a Sentinel (`host:port`): no credentials (they are set apart), no database.
    pub(crate) fn sentinel_url(&self, address: &str) -> String {
        format!("{}://{address}", if self.tls { "rediss" } else { "redis" })
    }
}

/// `host[:port]` or `[v6][:port]`, with Sentinel's default port where none is given.
fn with_port(host: &str) -> Result<String, &'static str> {
    const RULE: &str = "connection.url lists a Sentinel that is not a valid host[:port]";
    if host.is_empty() {
        return Err(RULE);
    }
    let port = if let Some(v6) = host.strip_prefix('[') {
        let (_, after) = v6.split_once(']').ok_or(RULE)?;
        match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(RULE)?),
        }
    } else {
        host.split_once(':').map(|(_, p)| p)
    };
    match port {
        None => Ok(format!("{host}:{SENTINEL_PORT}")),
        Some(p)
            if !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u16>().is_ok_and(|p| p > 0) =>
        {
            Ok(host.to_owned())
        }
        Some(_) => Err(RULE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_get_the_sentinel_port_and_keep_their_order() {
        let u = SentinelUrl::parse("redis-sentinel://:p%40ss@s1,s2:26380,[::1],[::1]:5/3#mymaster")
            .unwrap();
        assert_eq!(u.sentinels, ["s1:26379", "s2:26380", "[::1]:26379", "[::1]:5"]);
        assert_eq!(u.master_name, "mymaster");
        assert!(!u.tls);
        assert_eq!(u.node_url("10.0.0.1:6379"), "redis://:p%40ss@10.0.0.1:6379/3");
        let info =
            redis::IntoConnectionInfo::into_connection_info(u.node_url("10.0.0.1:6379").as_str())
                .unwrap();
        assert_eq!(
            (info.redis_settings().password(), info.redis_settings().db()),
            (Some("p@ss"), 3)
        );
        assert_eq!(u.sentinel_url("s1:26379"), "redis://s1:26379");
        assert!(SentinelUrl::parse("rediss-sentinel://h#m").unwrap().tls);
    }
}
