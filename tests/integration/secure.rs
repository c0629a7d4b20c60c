//! Every connection logs in over TLS, against servers that demand it (the
//! secure instances of `scripts/services`): Kafka SASL/SCRAM-SHA-512 over
//! TLS, a Redis ACL user over TLS, CQL PasswordAuthenticator over TLS. No
//! password reaches a log line, and a wrong one stops readfold at start
//! with a clear error instead of retrying.

use std::time::{Duration, Instant};

use readfold_core::ConversationId;
use readfold_store::cql::CqlStore;
use readfold_store::redis::RedisStore;
use readfold_store::CursorStore;

use crate::kit::*;

/// The members of `conversation` in `store`, once they equal `want`.
async fn wait_for_store<S: CursorStore>(
    store: &S,
    conversation: &str,
    want: &readfold_core::ConversationView,
    timeout: Duration,
) {
    let id: ConversationId = conversation.parse().unwrap();
    let started = Instant::now();
    loop {
        let got = store.read(&id).await.expect("read the store").map(|v| v.members);
        if got.as_ref() == Some(&want.members) {
            return;
        }
        assert!(
            started.elapsed() < timeout,
            "{}: {conversation} is {got:?}, want {:?}",
            S::NAME,
            want.members
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn assert_no_secret(log: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!log.contains(secret), "a password is in the log:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folds_over_logins_and_tls_and_never_logs_a_password() {
    let secure = SecureServices::load();
    let env = TestEnv::secure("secure", 2, &secure).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.seed_chats("dm", "group").await;
    let addr = free_local_addr();
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
            ("READFOLD__LOG__FORMAT", "json"),
            ("READFOLD_LOG", "debug"),
        ],
    );
    let log = env.wait_for_reference(&reference, Duration::from_secs(90)).await;
    assert_matches(&log, &reference);

    // The stores' read halves log in over TLS too.
    let redis = RedisStore::connect(&env.config.redis)
        .await
        .expect("Redis over TLS");
    let cql = CqlStore::connect(&env.config.cql).await.expect("CQL over TLS");
    for conversation in ["dm", "group"] {
        let want = log.view(conversation);
        wait_for_store(&redis, conversation, &want, Duration::from_secs(30)).await;
        wait_for_store(&cql, conversation, &want, Duration::from_secs(60)).await;
    }
    let (status, ready) = http_get(&addr, "/readyz").expect("/readyz answers");
    assert_eq!(status, 200, "{ready}");

    assert!(processor.terminate(Duration::from_secs(30)));
    let text = processor.log_text();
    assert!(text.contains("redis store ready"), "{text}");
    assert_no_secret(&text, &secure.passwords());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_stops_readfold_at_start_with_a_clear_error() {
    let secure = SecureServices::load();
    let env = TestEnv::secure("secure-wrong", 1, &secure).await;
    let wrong = "not-the-password-81";
    for (variable, says) in [
        (
            "READFOLD__KAFKA__PROPERTIES__SASL_PASSWORD",
            "SASL authentication",
        ),
        ("READFOLD__REDIS__PASSWORD", "redis: "),
        ("READFOLD__CQL__PASSWORD", "bad credentials"),
    ] {
        let started = Instant::now();
        let mut processor = env.spawn_with("a", &[(variable, wrong)]);
        let code = processor.wait(Duration::from_secs(45));
        let text = processor.log_text();
        assert!(
            matches!(code, Some(c) if c != 0),
            "{variable}: readfold must stop (exit {code:?}):\n{text}"
        );
        assert!(
            text.contains(says) && text.to_lowercase().contains("auth"),
            "{variable}: the error must say the login failed:\n{text}"
        );
        // Stopped at once, not after a storm of retries.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{variable}: took {:?}",
            started.elapsed()
        );
        // readfold's own retries of the failing login; librdkafka's lines
        // (a fresh broker's "coordinator load in progress: retrying") are
        // about something else.
        let retries = text
            .lines()
            .filter(|l| l.contains("retrying") && !l.contains(" librdkafka: "))
            .count();
        assert!(retries <= 1, "{variable}: {retries} retries:\n{text}");
        let mut secrets = secure.passwords().to_vec();
        secrets.push(wrong);
        assert_no_secret(&text, &secrets);
    }
}
