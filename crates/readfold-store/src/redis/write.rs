//! The write half: EVALSHA of a max-merge script for a few dozen
//! conversations at a time (and one per user with private changes), in
//! pipelines of bounded size.

use futures_util::stream::{self, StreamExt, TryStreamExt};
use readfold_core::flush::{ConversationBatch, MemberWrite, UserBatch};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::badge::WRITE_BADGES_SCRIPT;
use super::threads::{MERGE_THREADS_SCRIPT, MERGE_THREAD_PRIVATE_SCRIPT};
use super::{keys, user_keys, RedisStore, KEYS_PER_CONVERSATION};
use crate::error::{Error, Result};

/// The public max-merge script; see the file for its keys and arguments.
pub const MERGE_SCRIPT: &str = include_str!("merge.lua");
/// The private max-merge script; see the file for its keys and arguments.
pub const MERGE_PRIVATE_SCRIPT: &str = include_str!("merge_private.lua");

impl RedisStore {
    pub(super) async fn load_script(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        for script in [
            MERGE_SCRIPT,
            MERGE_PRIVATE_SCRIPT,
            WRITE_BADGES_SCRIPT,
            MERGE_THREADS_SCRIPT,
            MERGE_THREAD_PRIVATE_SCRIPT,
        ] {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script)
                .query_async(&mut conn)
                .await?;
        }
        Ok(())
    }

    /// Max-merges one flush's private state: one EVALSHA per user. Returns
    /// the number of private cursors raised.
    pub async fn merge_private(&self, batches: &[UserBatch]) -> Result<u64> {
        if batches.is_empty() {
            return Ok(0);
        }
        self.run_all(pipelines(self.private_calls(batches))).await
    }

    /// One EVALSHA of the private script per user.
    fn private_calls<'a>(&'a self, batches: &'a [UserBatch]) -> impl Iterator<Item = redis::Cmd> + Send + 'a {
        batches.iter().map(|batch| {
            let mut cmd = redis::cmd("EVALSHA");
            let keys = user_keys(&self.prefix, batch.user_id.as_str());
            cmd.arg(self.private_script.get_hash()).arg(keys.len());
            for key in keys {
                cmd.arg(key);
            }
            for c in &batch.conversations {
                cmd.arg(c.conversation_id.as_str()).arg(c.private_cursor.get());
                match c.mark {
                    Some(mark) => cmd.arg(mark.at).arg(mark.seq.map_or(-1, |s| s.get() as i64)),
                    None => cmd.arg("").arg(""),
                };
                let mentions: Vec<String> = c.mentions.iter().map(|s| s.get().to_string()).collect();
                cmd.arg(c.read_up_to.get()).arg(mentions.join(","));
                match c.mute {
                    Some(mute) => cmd.arg(mute.at).arg(mute.until),
                    None => cmd.arg("").arg(""),
                };
            }
            cmd
        })
    }

    /// Runs pipelines of script calls, [`PIPELINES_IN_FLIGHT`] at a time;
    /// the fields raised in all. Their calls touch disjoint keys, so the
    /// order they land in does not matter.
    pub(super) async fn run_all(&self, pipes: impl Iterator<Item = redis::Pipeline> + Send) -> Result<u64> {
        stream::iter(pipes)
            .map(|pipe| self.run(pipe))
            .buffer_unordered(PIPELINES_IN_FLIGHT)
            .try_fold(0, |sum, raised| async move { Ok(sum + raised) })
            .await
    }

    /// Runs a pipeline of script calls, loading the scripts again if Redis
    /// lost them (restarted or flushed its script cache).
    async fn run(&self, pipe: redis::Pipeline) -> Result<u64> {
        let mut conn = self.conn.clone();
        let raised: Vec<u64> = match pipe.query_async(&mut conn).await {
            Err(e) if is_noscript(&e) => {
                self.load_script().await?;
                pipe.query_async(&mut conn).await
            }
            other => other,
        }
        .map_err(|e| cross_slot(e, self.conversations_per_call))?;
        Ok(raised.iter().sum())
    }

    /// Max-merges a flush: one EVALSHA per group of conversations (see
    /// [`calls`]), in pipelines of bounded size. Returns the number of
    /// cursors and delivered cursors raised.
    pub async fn merge(&self, batches: &[ConversationBatch]) -> Result<u64> {
        if batches.is_empty() {
            return Ok(0);
        }
        self.run_all(pipelines(self.merge_calls(batches))).await
    }

    /// The public script's calls for `batches` (see [`calls`]).
    fn merge_calls<'a>(
        &'a self,
        batches: &'a [ConversationBatch],
    ) -> impl Iterator<Item = redis::Cmd> + Send + 'a {
        calls(batches, self.conversations_per_call).map(|call| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.script.get_hash())
                .arg(KEYS_PER_CONVERSATION * call.len());
            for batch in call {
                for key in keys(&self.prefix, batch.conversation_id.as_str()) {
                    cmd.arg(key);
                }
            }
            for batch in call {
                cmd.arg(batch.members.len()).arg(batch.latest_seq.get());
                for m in &batch.members {
                    let cursor = if m.left { -1 } else { m.cursor.get() as i64 };
                    cmd.arg(m.user_id.as_str())
                        .arg(cursor)
                        .arg(m.join_seq.get())
                        .arg(m.epoch);
                }
                cmd.arg(ahead(batch).count());
                for (position, m) in ahead(batch) {
                    cmd.arg(position).arg(m.delivered.get());
                }
            }
            cmd
        })
    }
}

/// The members of `batch` whose delivered cursor is ahead of their cursor,
/// with their positions from 1: the script's delivered pairs. Readers take
/// the higher of the two, so a delivered cursor at the cursor needs none.
fn ahead(batch: &ConversationBatch) -> impl Iterator<Item = (usize, &MemberWrite)> {
    batch
        .members
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.left && m.delivered > m.cursor)
        .map(|(i, m)| (i + 1, m))
}

/// Script arguments (keys included) one call takes, at most, unless one
/// conversation alone has more: a call holds Redis for its whole length,
/// and one of 4k arguments, about a thousand members, takes it a few
/// milliseconds.
const CALL_ARGS: usize = 4096;

/// `batches` in consecutive groups of at most `per_call` conversations and
/// [`CALL_ARGS`] script arguments, one script call each. Each call costs
/// Redis a fixed part (running the script, and a reply) besides its
/// members; most conversations are small, so sharing that part cuts
/// Redis's time for a flush.
pub fn calls(batches: &[ConversationBatch], per_call: usize) -> impl Iterator<Item = &[ConversationBatch]> {
    let per_call = per_call.max(1);
    let mut rest = batches;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut args = 0;
        let mut end = 0;
        while end < rest.len().min(per_call) {
            // The keys, the member count, the latest seq, four per member,
            // the count of delivered pairs and two per pair.
            let batch = &rest[end];
            let more = KEYS_PER_CONVERSATION + 3 + 4 * batch.members.len() + 2 * ahead(batch).count();
            if end > 0 && args + more > CALL_ARGS {
                break;
            }
            args += more;
            end += 1;
        }
        let (call, after) = rest.split_at(end);
        rest = after;
        Some(call)
    })
}

/// Script arguments per pipeline, at most (a command with more goes alone).
/// Each pipeline is one request, and `redis.timeout_ms` bounds each request,
/// so a flush of any size goes out as requests that each cost Redis a few
/// tens of milliseconds (a member's merge takes it a few microseconds and
/// four arguments). One pipeline per flush would outlast the timeout once a
/// flush is large or Redis slow, and then fail again on every retry, each
/// one larger.
const PIPELINE_ARGS: usize = 32 * 1024;

/// Pipelines sent at once: while Redis runs one, the next is already on
/// its way, and a request waits behind at most one other.
const PIPELINES_IN_FLIGHT: usize = 2;

/// `cmds` gathered into pipelines of at most [`PIPELINE_ARGS`] arguments,
/// in order, each built only when the sends ask for it: the first
/// [`PIPELINES_IN_FLIGHT`] at the start, then one as each answer comes, so
/// that a large flush's first pipeline goes out before its last command is
/// built.
pub(super) fn pipelines(
    cmds: impl Iterator<Item = redis::Cmd> + Send,
) -> impl Iterator<Item = redis::Pipeline> + Send {
    // Its name included.
    let mut cmds = cmds.map(|cmd| (cmd.args_iter().count(), cmd)).peekable();
    std::iter::from_fn(move || {
        let mut pipe = redis::Pipeline::new();
        let mut args = 0;
        while let Some((n, cmd)) = cmds.next_if(|(n, _)| args == 0 || args + n <= PIPELINE_ARGS) {
            args += n;
            pipe.add_command(cmd);
        }
        (args > 0).then_some(pipe)
    })
}

/// A Redis Cluster (behind a proxy) refuses a call whose keys lie in
/// several slots, and will every time: a configuration error, not one to
/// retry forever.
fn cross_slot(e: RedisError, conversations_per_call: usize) -> Error {
    if e.kind() != ErrorKind::Server(ServerErrorKind::CrossSlot) {
        return e.into();
    }
    let advice = if conversations_per_call > 1 {
        "; a call carries several conversations (redis.conversations_per_call), \
         which a Redis Cluster refuses: set redis.conversations_per_call = 1"
    } else {
        ""
    };
    Error::Config(format!("Redis refused a merge call: {e}{advice}"))
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pipelines of commands with these argument counts (at least 2:
    /// the name, then the command's index), as those indices.
    fn split(args: &[usize]) -> Vec<Vec<usize>> {
        let cmds = args.iter().enumerate().map(|(i, &n)| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(i);
            for _ in 2..n {
                cmd.arg(0);
            }
            cmd
        });
        pipelines(cmds)
            .map(|p| {
                p.cmd_iter()
                    .map(|c| match c.args_iter().nth(1) {
                        Some(redis::Arg::Simple(index)) => {
                            std::str::from_utf8(index).unwrap().parse().unwrap()
                        }
                        other => panic!("not an index: {other:?}"),
                    })
                    .collect()
            })
            .collect()
    }

    /// A conversation of `members` members, the first `ahead` of them with
    /// a delivered cursor ahead of their cursor.
    fn conversation_ahead(members: usize, ahead: usize) -> ConversationBatch {
        ConversationBatch {
            conversation_id: "C".parse().unwrap(),
            latest_seq: readfold_core::Seq(3),
            members: (0..members)
                .map(|i| MemberWrite {
                    user_id: "u".parse().unwrap(),
                    cursor: readfold_core::Seq(1),
                    delivered: readfold_core::Seq(if i < ahead { 3 } else { 1 }),
                    join_seq: readfold_core::Seq(1),
                    left: false,
                    epoch: 0,
                })
                .collect(),
        }
    }

    fn conversation(members: usize) -> ConversationBatch {
        conversation_ahead(members, 0)
    }

    /// The sizes (in conversations) of the calls for conversations of these
    /// member counts.
    fn call_sizes(members: &[usize], per_call: usize) -> Vec<usize> {
        let batches: Vec<ConversationBatch> = members.iter().map(|&m| conversation(m)).collect();
        let grouped: Vec<&[ConversationBatch]> = calls(&batches, per_call).collect();
        assert_eq!(
            grouped.iter().map(|c| c.len()).sum::<usize>(),
            batches.len(),
            "each once"
        );
        grouped.iter().map(|c| c.len()).collect()
    }

    #[test]
    fn calls_take_up_to_per_call_conversations_and_bounded_arguments() {
        assert!(call_sizes(&[], 64).is_empty());
        assert_eq!(call_sizes(&[1; 130], 64), [64, 64, 2]);
        // 1 keeps each conversation alone, as a Redis Cluster needs.
        assert_eq!(call_sizes(&[2; 3], 1), [1, 1, 1]);
        // A conversation of no members (only its latest seq) still counts.
        assert_eq!(call_sizes(&[0, 0, 0], 2), [2, 1]);
        // 8 + 4 * 500 = 2008 arguments each: two fit, a third would not.
        assert_eq!(call_sizes(&[500; 5], 64), [2, 2, 1]);
        // One larger than the bound goes alone, then the rest go on.
        assert_eq!(call_sizes(&[1, 5000, 1, 1], 64), [1, 1, 2]);
    }

    #[test]
    fn delivered_pairs_go_only_for_members_ahead_and_count_in_the_bound() {
        let mut batch = conversation_ahead(4, 2);
        batch.members[3].delivered = readfold_core::Seq(7);
        // A departure's delivered cursor is never written.
        batch.members[1].left = true;
        let positions: Vec<usize> = ahead(&batch).map(|(p, _)| p).collect();
        assert_eq!(positions, [1, 4]);
        // 8 + 4 * 300 = 1208 arguments each: three fit in a call; with 150
        // pairs each, 1508: only two.
        assert_eq!(call_sizes(&[300; 3], 64), [3]);
        let batches = vec![conversation_ahead(300, 150); 3];
        let sizes: Vec<usize> = calls(&batches, 64).map(<[_]>::len).collect();
        assert_eq!(sizes, [2, 1]);
    }

    #[test]
    fn a_cross_slot_refusal_is_a_configuration_error_naming_the_setting() {
        let refused = || {
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::CrossSlot),
                "keys in several slots",
            ))
        };
        let e = cross_slot(refused(), 64);
        assert!(!e.is_retriable());
        assert!(e.to_string().contains("redis.conversations_per_call = 1"), "{e}");
        assert!(!cross_slot(refused(), 1).to_string().contains("set redis"));
        // Anything else stays what it was, retried as before.
        let busy = RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert!(cross_slot(busy, 64).is_retriable());
    }

    #[test]
    fn pipelines_stay_under_the_argument_bound_in_order() {
        assert!(split(&[]).is_empty());
        let half = PIPELINE_ARGS / 2;
        let pipes = split(&[half, half, 2, PIPELINE_ARGS * 3, 10, 10]);
        let sizes: Vec<usize> = pipes.iter().map(Vec::len).collect();
        // Two halves fill one; the next would overflow it; an oversized
        // command goes alone; what follows starts a new one.
        assert_eq!(sizes, [2, 1, 1, 2]);
        let order: Vec<usize> = pipes.into_iter().flatten().collect();
        assert_eq!(order, [0, 1, 2, 3, 4, 5]);
    }
}
