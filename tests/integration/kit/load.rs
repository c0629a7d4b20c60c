//! Load producers: random workloads of messages, joins and (often stale or
//! duplicated) reports, folded into a reference as they are made.

use std::time::{Duration, Instant};

use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadReportRecord};

use super::env::TestEnv;
use super::reference::{delivery, event, mute, private_report, report, unmute, unread_mark, Reference};
use super::services::now_ms;
use super::services::Rng;

/// What a load run produced.
pub struct Load {
    pub reference: Reference,
    /// Garbage records sent, each of which must be dead-lettered once.
    pub bad: usize,
}

/// Produces batches of messages, joins and (often stale) reports to 30
/// conversations for `duration`, with a garbage record now and then.
pub async fn produce_load(env: &TestEnv, duration: Duration, seed: u64) -> Load {
    produce(env, duration, seed, false).await
}

/// [`produce_load`], with private receipts, unread marks and clears,
/// delivery reports, mentions, mutes, departures and rejoins mixed in.
pub async fn produce_mixed_load(env: &TestEnv, duration: Duration, seed: u64) -> Load {
    produce(env, duration, seed, true).await
}

async fn produce(env: &TestEnv, duration: Duration, seed: u64, mixed: bool) -> Load {
    let producer = env.producer();
    let mut reference = Reference::default();
    let mut rng = Rng::new(seed);
    let mut latest = vec![0i64; 30];
    let mut bad = 0;
    let started = Instant::now();
    let mut round = 0u64;
    while started.elapsed() < duration {
        let (mut reports, mut events) = (Vec::new(), Vec::new());
        for _ in 0..150 {
            let c = rng.below(30) as usize;
            let conv = format!("c{c}");
            if rng.below(6) == 0 {
                latest[c] += 1;
                // In the mixed load some messages mention a member or @all.
                let (mentions, mention_all) = match mixed.then(|| rng.below(8)) {
                    Some(0) => (vec![format!("j{}", rng.below(4))], false),
                    Some(1) => (
                        vec![format!("u{}", rng.below(12)), format!("j{}", rng.below(4))],
                        false,
                    ),
                    Some(2) => (Vec::new(), true),
                    _ => (Vec::new(), false),
                };
                let e = event(
                    &conv,
                    latest[c],
                    EventRecord::MessageSent {
                        starter_id: None,
                        thread: 0,
                        thread_seq: 0,
                        mention_all,
                        mentions,
                        sender_id: format!("u{}", rng.below(12)),
                    },
                );
                reference.event(&e);
                events.push(e);
            } else if rng.below(40) == 0 {
                let e = event(
                    &conv,
                    latest[c],
                    EventRecord::MemberJoined {
                        user_id: format!("j{}", rng.below(4)),
                    },
                );
                reference.event(&e);
                events.push(e);
            } else if mixed && rng.below(25) == 0 {
                // Members j0..j3 and u0..u3 come and go.
                let who = if rng.below(2) == 0 { "j" } else { "u" };
                let e = event(
                    &conv,
                    latest[c],
                    EventRecord::MemberLeft {
                        user_id: format!("{who}{}", rng.below(4)),
                    },
                );
                reference.event(&e);
                events.push(e);
            } else if mixed && rng.below(4) == 0 {
                let user = format!("u{}", rng.below(12));
                let seq = (latest[c] - rng.below(3) as i64).max(0);
                let r = match rng.below(8) {
                    0 => unread_mark(&conv, &user, seq, true),
                    1 => unread_mark(&conv, &user, seq, false),
                    6 => mute(&conv, &user, (rng.below(2) == 0).then(|| now_ms() + 60_000)),
                    7 => unmute(&conv, &user),
                    2 | 3 => delivery(&conv, &user, (latest[c] - rng.below(2) as i64).max(1)),
                    _ => private_report(&conv, &user, seq.max(1)),
                };
                reference.report(&r);
                reports.push(r);
            } else {
                let r = report(
                    &conv,
                    &format!("u{}", rng.below(12)),
                    (latest[c] - rng.below(3) as i64).max(1),
                );
                reference.report(&r);
                reports.push(r);
            }
        }
        producer.send_many(&reports, &events).await.unwrap();
        if round.is_multiple_of(10) {
            producer
                .send(&env.config.topics.read_reports, "c0", Some(b"\x02not avro"), None)
                .await
                .unwrap();
            bad += 1;
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    Load { reference, bad }
}

/// `records` random records for `convs` conversations and `users` users:
/// messages, late joins, and reports that are often stale or duplicated,
/// whose two inputs may interleave freely. Folded into `reference`.
pub fn random_records(
    reference: &mut Reference,
    seed: u64,
    records: u64,
    convs: u64,
    users: u64,
) -> (Vec<ReadReportRecord>, Vec<ConversationEventRecord>) {
    let mut rng = Rng(seed);
    let mut latest = vec![0i64; convs as usize];
    let (mut reports, mut events) = (Vec::new(), Vec::new());
    for i in 0..records {
        let c = rng.below(convs) as usize;
        let conv = format!("conv-{c}");
        match rng.below(20) {
            0..=2 => {
                latest[c] += 1;
                let e = event(
                    &conv,
                    latest[c],
                    EventRecord::MessageSent {
                        starter_id: None,
                        thread: 0,
                        thread_seq: 0,
                        mention_all: false,
                        mentions: Default::default(),
                        sender_id: format!("u{}", rng.below(users)),
                    },
                );
                reference.event(&e);
                events.push(e);
            }
            3 if i % 7 == 0 => {
                let e = event(
                    &conv,
                    latest[c],
                    EventRecord::MemberJoined {
                        user_id: format!("late{}", rng.below(5)),
                    },
                );
                reference.event(&e);
                events.push(e);
            }
            _ => {
                let seq = (latest[c] - rng.below(4) as i64).max(1);
                let r = report(&conv, &format!("u{}", rng.below(users)), seq);
                reference.report(&r);
                reports.push(r);
            }
        }
    }
    (reports, events)
}
