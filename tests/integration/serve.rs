//! `readfold serve` against the real stores: every endpoint agrees with the
//! reference read model, from Redis and, once Redis lost everything, from
//! CQL; bearer tokens keep callers to their own conversations; the OpenAPI
//! document passes an independent validator.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use readfold_core::read_model::Reached;
use readfold_core::{ConversationId, MessageRef, Seq, UserId};
use readfold_serve::client::HttpClient;
use serde_json::{json, Value};

use crate::kit::*;

/// Starts `readfold serve` on a free port and waits until it answers.
pub(crate) async fn spawn_serve(env: &TestEnv, extra: &[(&str, &str)]) -> (Processor, String) {
    let addr = free_local_addr();
    let mut vars = vec![("READFOLD__SERVE__LISTEN", addr.as_str())];
    vars.extend_from_slice(extra);
    let mut serve = env.spawn_command("serve", "api", &vars);
    let started = Instant::now();
    while HttpClient::new(addr.clone()).get("/healthz").await.is_err() {
        assert!(serve.is_running(), "readfold serve exited:\n{}", serve.log_text());
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "readfold serve never answered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (serve, addr)
}

/// Everything the API answers about the reference's conversations and users,
/// as the reference read model says it should be, keyed by request.
fn expected_answers(reference: &Reference) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let users: Vec<UserId> = (0..12)
        .map(|i| format!("u{i}"))
        .chain((0..4).map(|i| format!("j{i}")))
        .map(|u| u.parse().unwrap())
        .collect();
    let mut conversations: Vec<(&ConversationId, _)> = reference.state.conversations().collect();
    conversations.sort_by_key(|(c, _)| (*c).clone());
    for (id, conv) in &conversations {
        let view = conv.view();
        if view.members.is_empty() {
            continue;
        }
        let members: Vec<Value> = view
            .members
            .iter()
            .map(|(u, m)| json!({ "user_id": u.as_str(), "cursor": m.cursor.get(), "delivered": m.delivered_through().get(), "join_seq": m.join_seq.get() }))
            .collect();
        out.insert(
            format!("cursors {id}"),
            json!({ "latest_seq": view.latest_seq.get(), "members": members }),
        );
        let sender: UserId = "u0".parse().unwrap();
        let messages: Vec<MessageRef> = (1..=view.latest_seq.get())
            .map(|s| MessageRef {
                seq: Seq(s),
                sender: sender.clone(),
            })
            .collect();
        out.insert(format!("counts {id}"), json!(view.read_counts(&messages)));
        let ticks: Vec<Value> = messages
            .iter()
            .map(|m| {
                let t = view.ticks(m.seq, &m.sender);
                json!([
                    t.delivered_count,
                    t.possible_readers,
                    t.delivered_to_all(),
                    t.read_by_all()
                ])
            })
            .collect();
        out.insert(format!("ticks {id}"), json!(ticks));
        let readers: Vec<&str> = view.readers(Seq(1), &sender).map(UserId::as_str).collect();
        out.insert(format!("readers {id}"), json!(readers));
        let (receivers, _) = view.reached_page(Reached::Delivered, Seq(1), &sender, None, usize::MAX);
        let receivers: Vec<&str> = receivers.iter().map(UserId::as_str).collect();
        out.insert(format!("receivers {id}"), json!(receivers));
    }
    for user in &users {
        let entries: Vec<Value> = conversations
            .iter()
            .map(|(_, conv)| match conv.member(user) {
                Some(m) if m.listed && !m.left => {
                    let own = m.own();
                    let muted_until = own.mute.filter(|m| m.is_muted(now_ms())).map(|m| m.until);
                    json!({ "member": true, "unread": own.unread(conv.latest_seq()), "marked_unread": own.marked_unread(),
                            "cursor": m.cursor.get(), "private_cursor": m.private_cursor.get(),
                            "unread_mentions": own.unread_mentions, "muted_until": muted_until })
                }
                _ => json!({ "member": false }),
            })
            .collect();
        out.insert(format!("unread {user}"), json!(entries));
    }
    out
}

/// What the API answers to the same questions.
async fn api_answers(
    client: &mut HttpClient,
    reference: &Reference,
) -> (BTreeMap<String, Value>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut sources = Vec::new();
    let mut conversations: Vec<(&ConversationId, _)> = reference.state.conversations().collect();
    conversations.sort_by_key(|(c, _)| (*c).clone());
    for (id, conv) in &conversations {
        if conv.view().members.is_empty() {
            continue;
        }
        let r = client.get(&format!("/v1/conversations/{id}")).await.unwrap();
        let body = r.json().unwrap();
        sources.push(body["source"].as_str().unwrap_or("?").to_owned());
        out.insert(
            format!("cursors {id}"),
            json!({ "latest_seq": body["latest_seq"], "members": body["members"] }),
        );
        let latest = body["latest_seq"].as_u64().unwrap_or(0);
        let messages: Vec<Value> = (1..=latest)
            .map(|s| json!({ "seq": s, "sender": "u0" }))
            .collect();
        let r = client
            .post_json(
                &format!("/v1/conversations/{id}/read-counts"),
                &json!({ "messages": messages }),
            )
            .await
            .unwrap();
        let body = r.json().unwrap();
        let counts: Vec<Value> = body["counts"]
            .as_array()
            .map(|a| a.iter().map(|c| c["read_count"].clone()).collect())
            .unwrap_or_default();
        out.insert(format!("counts {id}"), json!(counts));
        let ticks: Vec<Value> = body["counts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        json!([
                            c["delivered_count"],
                            c["possible_readers"],
                            c["delivered_to_all"],
                            c["read_by_all"]
                        ])
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.insert(format!("ticks {id}"), json!(ticks));
        // Who-read of #1, two readers a page, all pages.
        let mut readers = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = match &after {
                Some(a) => format!("/v1/conversations/{id}/messages/1/readers?sender=u0&limit=2&after={a}"),
                None => format!("/v1/conversations/{id}/messages/1/readers?sender=u0&limit=2"),
            };
            let body = client.get(&page).await.unwrap().json().unwrap();
            readers.extend(body["readers"].as_array().cloned().unwrap_or_default());
            match body["next_after"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
        out.insert(format!("readers {id}"), json!(readers));
        // Who-received of #1, three a page, all pages.
        let mut receivers = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = match &after {
                Some(a) => format!("/v1/conversations/{id}/messages/1/receivers?sender=u0&limit=3&after={a}"),
                None => format!("/v1/conversations/{id}/messages/1/receivers?sender=u0&limit=3"),
            };
            let body = client.get(&page).await.unwrap().json().unwrap();
            receivers.extend(body["receivers"].as_array().cloned().unwrap_or_default());
            match body["next_after"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
        out.insert(format!("receivers {id}"), json!(receivers));
    }
    let ids: Vec<String> = conversations.iter().map(|(c, _)| c.to_string()).collect();
    for user in (0..12)
        .map(|i| format!("u{i}"))
        .chain((0..4).map(|i| format!("j{i}")))
    {
        let r = client
            .post_json(
                &format!("/v1/users/{user}/unread"),
                &json!({ "conversations": ids }),
            )
            .await
            .unwrap();
        let entries: Vec<Value> = r.json().unwrap()["conversations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|e| {
                if e["member"] == true {
                    json!({ "member": true, "unread": e["unread"], "marked_unread": e["marked_unread"],
                            "cursor": e["cursor"], "private_cursor": e["private_cursor"],
                            "unread_mentions": e["unread_mentions"], "muted_until": e["muted_until"] })
                } else {
                    json!({ "member": false })
                }
            })
            .collect();
        out.insert(format!("unread {user}"), json!(entries));
    }
    (out, sources)
}

/// Polls the API until its answers equal the reference's and every
/// conversation's answer came from `store` (an answer may come from the
/// API's cache for up to serve.cache_ms).
async fn assert_api_matches(client: &mut HttpClient, reference: &Reference, store: &str, timeout: Duration) {
    let want = expected_answers(reference);
    let started = Instant::now();
    loop {
        let (got, sources) = api_answers(client, reference).await;
        if got == want && sources.iter().all(|s| s == store) {
            return;
        }
        if started.elapsed() > timeout {
            let diff: Vec<_> = want
                .iter()
                .filter(|(k, v)| got.get(*k) != Some(v))
                .map(|(k, v)| {
                    format!(
                        "{k}: got {}, want {v}",
                        got.get(k).cloned().unwrap_or(Value::Null)
                    )
                })
                .take(10)
                .collect();
            panic!(
                "the API disagrees with the reference read model, or did not answer from {store} ({sources:?}):\n{}",
                diff.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_agrees_with_the_read_model_from_redis_and_then_from_cql() {
    let env = TestEnv::new("serve", 3).await;
    let mut redis = PrivateRedis::fresh();
    redis.up();
    let url = redis.url();
    let private = [("READFOLD__REDIS__URL", url.as_str())];
    let mut processor = env.spawn_with("a", &private);
    let load = produce_mixed_load(&env, Duration::from_secs(6), 31).await;
    let reference = load.reference;
    let log = env.wait_for_reference(&reference, Duration::from_secs(120)).await;
    assert_matches(&log, &reference);
    let (mut serve, addr) = spawn_serve(&env, &private).await;
    let mut client = HttpClient::new(addr);
    assert_api_matches(&mut client, &reference, "redis", Duration::from_secs(60)).await;

    // Redis loses everything: answers come from CQL, and are still right.
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis_conn(&url).await)
        .await
        .unwrap();
    assert_api_matches(&mut client, &reference, "cql", Duration::from_secs(60)).await;
    assert!(serve.terminate(Duration::from_secs(30)), "{}", serve.log_text());
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

/// An RSA key pair made by openssl for this test: (private PEM, public PEM path).
fn rsa_key_pair(dir: &std::path::Path) -> (Vec<u8>, String) {
    let key = dir.join("key.pem");
    let public = dir.join("public.pem");
    let run = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl not found: install it (Debian package openssl)");
        assert!(status.success(), "openssl {args:?}");
    };
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        key.to_str().unwrap(),
    ]);
    run(&[
        "pkey",
        "-in",
        key.to_str().unwrap(),
        "-pubout",
        "-out",
        public.to_str().unwrap(),
    ]);
    (std::fs::read(&key).unwrap(), public.to_str().unwrap().to_owned())
}

fn rs256_token(private_pem: &[u8], sub: &str) -> String {
    let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &json!({ "sub": sub, "exp": exp }),
        &jsonwebtoken::EncodingKey::from_rsa_pem(private_pem).unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_callers_to_their_own_conversations_and_private_state() {
    let env = TestEnv::new("serve-auth", 2).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for m in ["A", "B"] {
        feed.event(joined("G", m, 0)).await;
    }
    feed.event(sent("G", "B", 1)).await;
    feed.event(sent("G", "B", 2)).await;
    feed.report(report("G", "A", 1)).await;
    feed.report(private_report("G", "A", 2)).await;
    let mut processor = env.spawn("a");
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    check_private_stores(&env, &reference).await;

    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique("rs256"));
    std::fs::create_dir_all(&dir).unwrap();
    let (private_pem, public_path) = rsa_key_pair(&dir);
    let (mut serve, addr) = spawn_serve(
        &env,
        &[
            ("READFOLD__AUTH__MODE", "jwt"),
            ("READFOLD__AUTH__ALGORITHM", "RS256"),
            ("READFOLD__AUTH__KEY_FILE", public_path.as_str()),
        ],
    )
    .await;
    let mut a = HttpClient::new(addr.clone()).with_token(rs256_token(&private_pem, "A"));
    let mut c = HttpClient::new(addr.clone()).with_token(rs256_token(&private_pem, "C"));
    let mut nobody = HttpClient::new(addr.clone());

    let r = a.get("/v1/conversations/G").await.unwrap();
    assert_eq!(r.status, 200, "{:?}", r.json());
    let r = c.get("/v1/conversations/G").await.unwrap();
    assert_eq!(
        (r.status, r.json().unwrap()["code"].clone()),
        (403, json!("forbidden"))
    );
    let r = nobody.get("/v1/conversations/G").await.unwrap();
    assert_eq!(
        (r.status, r.json().unwrap()["code"].clone()),
        (401, json!("unauthorized"))
    );
    // An HS256 token signed with the public key as a secret (algorithm
    // confusion) is refused.
    let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 600;
    let confused = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({ "sub": "A", "exp": exp }),
        &jsonwebtoken::EncodingKey::from_secret(&std::fs::read(&public_path).unwrap()).unwrap(),
    )
    .unwrap();
    let r = HttpClient::new(addr.clone())
        .with_token(confused)
        .get("/v1/conversations/G")
        .await
        .unwrap();
    assert_eq!(r.status, 401);

    // A's own cursor shows the private read; B sees A's public cursor only.
    let own = a
        .get("/v1/conversations/G/members/A")
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        (
            own["cursor"].clone(),
            own["private_cursor"].clone(),
            own["unread"].clone()
        ),
        (json!(1), json!(2), json!(0))
    );
    let mut b = HttpClient::new(addr).with_token(rs256_token(&private_pem, "B"));
    let seen = b
        .get("/v1/conversations/G/members/A")
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(seen["cursor"], 1);
    assert!(
        seen["private_cursor"].is_null() && seen["marked_unread"].is_null(),
        "{seen}"
    );
    assert_eq!(seen["unread"], 1, "B sees A's unread by the public cursor");
    // Read counts never count a private read.
    let counts = b
        .post_json(
            "/v1/conversations/G/read-counts",
            &json!({ "messages": [{ "seq": 2, "sender": "B" }] }),
        )
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(counts["counts"][0]["read_count"], 0);
    // Unread lists are one's own.
    let r = b
        .post_json("/v1/users/A/unread", &json!({ "conversations": ["G"] }))
        .await
        .unwrap();
    assert_eq!(r.status, 403);
    let mine = a
        .post_json("/v1/users/A/unread", &json!({ "conversations": ["G", "H"] }))
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(mine["conversations"][0]["unread"], 0);
    assert_eq!(mine["conversations"][1]["member"], false);
    assert!(
        serve.log_text().contains("access control is on"),
        "{}",
        serve.log_text()
    );
    assert!(serve.terminate(Duration::from_secs(30)));
    assert!(processor.terminate(Duration::from_secs(30)));
}

#[test]
fn the_openapi_document_passes_an_independent_validator() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_readfold"))
        .arg("openapi")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("openapi.json");
    std::fs::write(&path, &out.stdout).unwrap();
    let check = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator", path.to_str().unwrap()])
        .output()
        .expect("python3 not found");
    assert!(
        check.status.success(),
        "openapi-spec-validator rejected the document (or is not installed: `scripts/dev deps` \
         installs it, or `python3 -m pip install openapi-spec-validator==0.9.0`):\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}
