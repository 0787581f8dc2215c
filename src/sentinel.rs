//! Redis Sentinel: which node is the primary, and when that changes (decision 0020).
//!
//! The primary is asked of the Sentinels in the listed order and confirmed with `ROLE` by
//! the connection that then carries the commands (`connection/`). Every change of primary
//! (the first `+switch-master` heard from any Sentinel, or a new address found when
//! reconnecting) bumps an epoch: a command connection of an older epoch is not used for another command,
//! and the release-notification subscription moves to the new primary. Before that, from
//! the moment the leading Sentinel begins promoting a replica, the primary is held: no new
//! command goes to it (decision 0051).

mod url;
mod watcher;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionInfo, IntoConnectionInfo, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub(crate) use url::{is_sentinel_url, SentinelUrl};

use crate::connection::Liveness;
use crate::error::{Outcome, RedisErrorCode, RedisFailure};

/// How long a primary whose failover began is left alone without a `+switch-master` or an
/// abort: longer than the second the switch takes to be announced, shorter than a lease.
const FAILOVER_HOLD: Duration = Duration::from_secs(3);

pub(crate) struct Sentinel {
    url: SentinelUrl,
    /// One client per Sentinel, in the listed order, with the Sentinel credentials.
    sentinels: Vec<Client>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    command_timeout: Duration,
    /// pingIntervalMs for the watchers' subscriptions (decision 0172).
    liveness: Liveness,
    /// The address last confirmed or announced as the primary (`host:port`), and the epoch
    /// in which it was announced, if it was: guards epoch changes.
    confirmed: Mutex<Known>,
    epoch: AtomicU64,
    switched: watch::Sender<u64>,
    /// A connection to the Sentinel that answered last, kept for the next question.
    asked: tokio::sync::Mutex<Option<(usize, MultiplexedConnection)>>,
    watching: AtomicBool,
    /// Whose logger hears of a refused failover-state subscription, and whether it did.
    driver_id: u64,
    hold_refusal_logged: AtomicBool,
    /// Cancelled when the link closes: ends the watchers.
    stop: CancellationToken,
}

/// What this driver knows of the primary's address.
#[derive(Default)]
struct Known {
    address: Option<String>,
    /// The epoch a `+switch-master` (or the watcher's own question) started with `address`.
    announced_in: Option<u64>,
    /// When a Sentinel said it is promoting a replica of `address` (decision 0051).
    failover_began: Option<Instant>,
}

impl Known {
    /// The announced address, while its epoch lasts.
    fn announced_now(&self, epoch: u64) -> Option<String> {
        if self.announced_in == Some(epoch) {
            self.address.clone()
        } else {
            None
        }
    }
}

/// Credentials for the Sentinels themselves (`sentinelUsername` / `sentinelPassword`).
pub(crate) struct SentinelAuth<'a> {
    pub username: Option<&'a str>,
    pub password: Option<&'a str>,
}

impl Sentinel {
    pub(crate) fn new(
        url: SentinelUrl,
        auth: SentinelAuth<'_>,
        open: impl Fn(ConnectionInfo) -> redis::RedisResult<Client>,
        connect_timeout: Duration,
        command_timeout: Duration,
        liveness: Liveness,
        driver_id: u64,
    ) -> redis::RedisResult<Self> {
        let sentinels = url
            .sentinels
            .iter()
            .map(|address| {
                let info = url.sentinel_url(address).as_str().into_connection_info()?;
                let mut settings = info.redis_settings().clone();
                if let Some(username) = auth.username {
                    settings = settings.set_username(username);
                }
                if let Some(password) = auth.password {
                    settings = settings.set_password(password);
                }
                open(info.set_redis_settings(settings))
            })
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        Ok(Self {
            url,
            sentinels,
            config,
            connect_timeout,
            command_timeout,
            liveness,
            confirmed: Mutex::new(Known::default()),
            epoch: AtomicU64::new(0),
            switched: watch::Sender::new(0),
            asked: tokio::sync::Mutex::new(None),
            watching: AtomicBool::new(false),
            driver_id,
            hold_refusal_logged: AtomicBool::new(false),
            stop: CancellationToken::new(),
        })
    }

    /// Changes each time the primary changes.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Fires on each change of primary (the subscription follows it).
    pub(crate) fn switches(&self) -> watch::Receiver<u64> {
        self.switched.subscribe()
    }

    /// The connection settings of the data node at `address`: the URL's credentials,
    /// database and TLS.
    pub(crate) fn node_info(&self, address: &str) -> redis::RedisResult<ConnectionInfo> {
        self.url.node_url(address).as_str().into_connection_info()
    }

    fn confirmed(&self) -> std::sync::MutexGuard<'_, Known> {
        crate::sync::lock(&self.confirmed)
    }

    /// The primary's address by `SENTINEL GET-MASTER-ADDR-BY-NAME`, from the first Sentinel
    /// in the listed order that answers. One Sentinel that does not answer gets a share of
    /// connectTimeoutMs, so a stalled first one leaves time to ask the next and to connect.
    ///
    /// After a `+switch-master` was heard, Sentinels that have not learnt of it yet (they
    /// hear of a failover from each other within seconds) may still name the old primary, which
    /// keeps answering ROLE `master` and taking writes until it is converted: a lock taken
    /// there is lost. So in the epoch of an announcement, a Sentinel naming another address
    /// is passed over for one naming the announced primary; it is believed only when none
    /// does (a later failover the watchers missed).
    pub(crate) async fn primary_address(&self) -> Result<String, RedisFailure> {
        let mut asked = self.asked.lock().await;
        let resolved = self.resolve(&mut asked).await;
        // A resolution still running when the link closed (shutdown) keeps no connection:
        // `stop()` could not drop it then, and nothing would later.
        if self.stop.is_cancelled() {
            *asked = None;
        }
        resolved
    }

    async fn resolve(
        &self,
        asked: &mut Option<(usize, MultiplexedConnection)>,
    ) -> Result<String, RedisFailure> {
        let share = self.connect_timeout / (self.sentinels.len() as u32 + 1);
        let announced = self.confirmed().announced_now(self.epoch());
        let mut other = None;
        let mut refusal = None;
        let mut unknown_name = false;
        for index in 0..self.sentinels.len() {
            // Only this Sentinel's own connection is taken: the one kept for a later
            // Sentinel stays for its turn, so a first Sentinel that is down costs no
            // reconnection to the next one per question.
            let kept = match asked {
                Some((i, _)) if *i == index => asked.take().map(|(_, conn)| conn),
                _ => None,
            };
            let reused = kept.is_some();
            let mut outcome =
                tokio::time::timeout(share.max(Duration::from_millis(1)), self.ask(index, kept))
                    .await;
            if reused && !matches!(outcome, Ok(Ok(_))) {
                // The kept connection may have died quietly: one fresh try.
                outcome = tokio::time::timeout(
                    share.max(Duration::from_millis(1)),
                    self.ask(index, None),
                )
                .await;
            }
            match outcome {
                Ok(Ok((conn, Some((host, port))))) => {
                    *asked = Some((index, conn));
                    let named = address(&host, &port);
                    if announced.as_ref().is_none_or(|a| *a == named) {
                        return Ok(named);
                    }
                    other.get_or_insert(named);
                }
                // This Sentinel does not know the name (yet): another one may.
                Ok(Ok((conn, None))) => {
                    *asked = Some((index, conn));
                    unknown_name = true;
                }
                Ok(Err(err)) => {
                    let failure = RedisFailure::connect(&err);
                    if failure.server_code.is_some() && refusal.is_none() {
                        refusal = Some(failure);
                    }
                }
                Err(_) => {}
            }
        }
        if let Some(named) = other {
            return Ok(named);
        }
        Err(refusal.unwrap_or_else(|| {
            let message = if unknown_name {
                "no Sentinel knows the primary's name"
            } else {
                "no Sentinel answered for the primary"
            };
            RedisFailure::new(RedisErrorCode::ConnectionFailed, Outcome::NotSubmitted, message)
        }))
    }

    async fn ask(
        &self,
        index: usize,
        kept: Option<MultiplexedConnection>,
    ) -> redis::RedisResult<(MultiplexedConnection, Option<(String, String)>)> {
        let mut conn = match kept {
            Some(conn) => conn,
            None => {
                self.sentinels[index]
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?
            }
        };
        let reply = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.url.master_name)
            .query_async(&mut conn)
            .await?;
        Ok((conn, reply))
    }

    /// Records `address` as the confirmed primary of a resolution that began at `began`.
    /// Returns the epoch the connection belongs to, or `None` when the primary changed
    /// meanwhile (ask again). A new address is a change of primary too.
    pub(crate) fn confirm(&self, began: u64, address: &str) -> Option<u64> {
        let mut known = self.confirmed();
        if self.epoch() != began {
            return None;
        }
        let moved = known.address.as_deref().is_some_and(|a| a != address);
        if !moved {
            known.address.get_or_insert_with(|| address.to_owned());
            return Some(began);
        }
        *known =
            Known { address: Some(address.to_owned()), announced_in: None, failover_began: None };
        Some(self.bump())
    }

    /// A Sentinel announced the switch from `from` to `to`. The first announcement of a
    /// switch moves the primary (one epoch, however many Sentinels announce it after); a
    /// later one only marks `to` as announced. False when `from` is not the primary this
    /// driver knows: the announcement is older than a switch already followed, or one went
    /// unheard, and the caller asks the Sentinels.
    fn switched_from(&self, from: &str, to: &str) -> bool {
        let mut known = self.confirmed();
        let epoch = match known.address.as_deref() {
            Some(at) if at == to => self.epoch(),
            Some(at) if at != from => return false,
            _ => self.bump(),
        };
        *known =
            Known { address: Some(to.to_owned()), announced_in: Some(epoch), failover_began: None };
        true
    }

    /// Sentinel says the primary is at `now_at`: unless that is the one confirmed, every
    /// connection is to be made anew. Called by the watchers.
    /// The address is remembered as announced, so that a Sentinel still naming the old
    /// primary is not believed in this epoch (see [`primary_address`](Self::primary_address)).
    fn switched_to(&self, now_at: &str) {
        let mut known = self.confirmed();
        if known.address.as_deref() != Some(now_at) {
            let epoch = self.bump();
            *known = Known {
                address: Some(now_at.to_owned()),
                announced_in: Some(epoch),
                failover_began: None,
            };
        }
    }

    /// The leading Sentinel is about to send SLAVEOF NO ONE to a replica of `primary`
    /// (`+failover-state-send-slaveof-noone`): from now on its WAIT may be acknowledged by a
    /// replica that will follow the new primary, so no new command goes to it (decision 0051).
    fn failover_begins(&self, primary: &str) {
        let mut known = self.confirmed();
        let holding = known.failover_began.is_some_and(|began| began.elapsed() < FAILOVER_HOLD);
        if known.address.as_deref() == Some(primary) && !holding {
            known.failover_began = Some(Instant::now());
        }
    }

    /// The failover of `primary` was aborted: it stays the primary.
    fn failover_aborted(&self, primary: &str) {
        let mut known = self.confirmed();
        if known.address.as_deref() == Some(primary) {
            known.failover_began = None;
        }
    }

    /// Whether a command connection of `epoch`, opened at `opened`, may carry another
    /// command: not once the primary changed, nor while it is held (the failover hold's
    /// whole rule, decision 0051; the link asks before each command). The refusal says
    /// which, and that nothing was sent.
    pub(crate) fn admits(&self, epoch: u64, opened: Instant) -> Result<(), RedisFailure> {
        if self.epoch() != epoch {
            return Err(RedisFailure::new(
                RedisErrorCode::ConnectionFailed,
                Outcome::NotSubmitted,
                "the primary changed before the command was sent",
            ));
        }
        if self.holds(epoch, opened) {
            return Err(failover_in_progress());
        }
        Ok(())
    }

    /// Whether a new connection may be opened to `address`: not to the primary a failover
    /// in progress is leaving.
    pub(crate) fn admits_address(&self, address: &str) -> Result<(), RedisFailure> {
        if self.is_held(address) {
            return Err(failover_in_progress());
        }
        Ok(())
    }

    /// Whether a connection of `epoch` opened at `opened` is held back by a failover in
    /// progress: every connection during the hold; after it, those opened before it began
    /// (the Sentinels are asked afresh, as after a lost connection).
    fn holds(&self, epoch: u64, opened: Instant) -> bool {
        let known = self.confirmed();
        match known.failover_began {
            Some(began) if self.epoch() == epoch => {
                began.elapsed() < FAILOVER_HOLD || opened <= began
            }
            _ => false,
        }
    }

    /// Whether `address` is the primary a failover in progress is leaving: not connected to.
    fn is_held(&self, address: &str) -> bool {
        let known = self.confirmed();
        known.address.as_deref() == Some(address)
            && known.failover_began.is_some_and(|began| began.elapsed() < FAILOVER_HOLD)
    }

    fn bump(&self) -> u64 {
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        self.switched.send_replace(epoch);
        epoch
    }

    /// Starts the watchers once, one per Sentinel (they run until [`stop`](Self::stop)).
    pub(crate) fn watch(self: &std::sync::Arc<Self>) {
        if !self.watching.swap(true, Ordering::AcqRel) && !self.stop.is_cancelled() {
            for index in 0..self.sentinels.len() {
                tokio::spawn(watcher::run(self.clone(), index));
            }
        }
    }

    /// Ends the watchers and drops the kept Sentinel connection. A resolution still in
    /// progress (a connect or a late cleanup after shutdown) drops its own when it ends.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
        if let Ok(mut asked) = self.asked.try_lock() {
            *asked = None;
        }
    }
}

/// `host:port`, with brackets around an IPv6 host.
fn address(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `ROLE` on the connection that is to carry the commands: only a master is used. A node
/// Sentinel still names after it was demoted (or not yet promoted) fails like no
/// connection at all: nothing was sent, and a waiting acquire rides it out.
pub(crate) async fn confirm_primary(conn: &mut MultiplexedConnection) -> Result<(), RedisFailure> {
    let role: Value =
        redis::cmd("ROLE").query_async(conn).await.map_err(|e| RedisFailure::connect(&e))?;
    let first = match &role {
        Value::Array(items) => items.first(),
        _ => None,
    };
    let is_master = match first {
        Some(Value::BulkString(bytes)) => bytes == b"master",
        Some(Value::SimpleString(s)) => s == "master",
        _ => false,
    };
    if is_master {
        Ok(())
    } else {
        Err(RedisFailure::new(
            RedisErrorCode::ConnectionFailed,
            Outcome::NotSubmitted,
            "the node Sentinel named is not a primary (yet)",
        ))
    }
}

/// A failover is moving the primary away from the node a connection is to: nothing was
/// sent, and a waiting acquire rides it out like a primary that is not one (yet).
fn failover_in_progress() -> RedisFailure {
    RedisFailure::new(
        RedisErrorCode::ConnectionFailed,
        Outcome::NotSubmitted,
        "Sentinel is failing the primary over",
    )
}

/// Sleeps `delay` unless `stop` fires first; false when stopped.
async fn pause(stop: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep_until((Instant::now() + delay).into()) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel() -> Sentinel {
        let url = SentinelUrl::parse("redis-sentinel://s1,s2,s3#m").unwrap();
        let auth = SentinelAuth { username: None, password: None };
        let timeout = Duration::from_secs(1);
        let liveness = Liveness::of(
            &crate::options::parse_connection(&crate::Raw::String("redis://h".into())).unwrap(),
        );
        Sentinel::new(url, auth, Client::open, timeout, timeout, liveness, 0).unwrap()
    }

    #[test]
    fn a_switch_announced_by_every_sentinel_moves_the_primary_once() {
        let s = sentinel();
        assert_eq!(s.confirm(0, "p:1"), Some(0));
        let switches = s.switches();
        for _ in 0..3 {
            assert!(s.switched_from("p:1", "x:1"));
        }
        assert_eq!(s.epoch(), 1, "one change of primary, not one per Sentinel");
        assert!(switches.has_changed().unwrap());
        assert_eq!(s.confirmed().announced_now(1).as_deref(), Some("x:1"));
    }

    #[test]
    fn a_late_announcement_of_an_older_switch_does_not_move_the_primary_back() {
        let s = sentinel();
        s.confirm(0, "p:1");
        assert!(s.switched_from("p:1", "x:1"));
        assert!(s.switched_from("x:1", "y:1"));
        // A Sentinel that learnt of the first failover only now.
        assert!(!s.switched_from("p:1", "x:1"), "left to the Sentinels to settle");
        assert_eq!(s.epoch(), 2);
        assert_eq!(s.confirmed().announced_now(2).as_deref(), Some("y:1"));
    }

    #[test]
    fn a_failover_of_the_known_primary_holds_it_until_the_switch_or_an_abort() {
        let s = sentinel();
        s.confirm(0, "p:1");
        let opened = Instant::now();
        s.failover_begins("other:1");
        assert!(!s.holds(0, opened) && !s.is_held("p:1"), "another primary's failover");
        s.failover_begins("p:1");
        assert!(s.holds(0, opened) && s.is_held("p:1"));
        assert!(s.holds(0, Instant::now()), "no connection of the held primary is used");
        s.failover_aborted("p:1");
        assert!(!s.holds(0, opened) && !s.is_held("p:1"));
        s.failover_begins("p:1");
        assert!(s.switched_from("p:1", "x:1"));
        assert!(!s.holds(1, Instant::now()) && !s.is_held("x:1"), "the switch ends the hold");
    }

    #[test]
    fn an_announcement_of_the_primary_already_confirmed_marks_it_announced_without_a_switch() {
        let s = sentinel();
        s.confirm(0, "p:1");
        // A reconnect after a killed primary found the new one before any announcement.
        assert_eq!(s.confirm(0, "x:1"), Some(1));
        assert_eq!(s.confirmed().announced_now(1), None);
        assert!(s.switched_from("p:1", "x:1"));
        assert_eq!(s.epoch(), 1);
        assert_eq!(s.confirmed().announced_now(1).as_deref(), Some("x:1"));
    }
}
