//! A connection that closes between being chosen and being sent on (its close read on
//! another worker thread, or a liveness PING's verdict landing in that moment): the command
//! was never tried, so it goes once more on a new connection instead of failing as
//! PROVIDER_FAILED (decision 0178). Made deterministic with `testing::close_before_send`,
//! which is process-wide: this file holds one test so nothing else runs beside it.

mod common;
mod support;

use common::{driver, url};
use dokebi_lock_redis::testing::close_before_send;
use dokebi_lock_redis::LockErrorCode;
use support::RedisServer;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_command_refused_unsent_on_a_connection_that_just_closed_is_sent_once_on_a_new_one() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "closed-before-send", &[]);
    // Open the connection first, so the acquire below is handed an open one.
    let warm = d.acquire("warm", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&warm).await.unwrap());

    // waitTimeoutMs 0 "tries once": a refusal before sending is not a try.
    close_before_send(1);
    let lease = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert!(lease.valid());
    close_before_send(1);
    d.renew(&lease).await.unwrap();
    close_before_send(1);
    assert!(d.release(&lease).await.unwrap(), "the release reached Redis");
    let again = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&again).await.unwrap());

    // Once only: a connection closing under it twice in a row is a failure to report.
    close_before_send(2);
    let err = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::ProviderFailed);
    close_before_send(0);
    let after = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&after).await.unwrap(), "nothing was left behind by the refusals");
}
