//! Snapshot marks: how a local checkpoint tells that the CQL store still
//! holds what it held when the checkpoint was written.
//!
//! A checkpoint written at a clean stop says that CQL held every key of its
//! partition; a restart from it then snapshots only what the changelog tail
//! changed. Tables truncated, or restored from a backup, under the same ids
//! would make that a lie the table ids cannot catch. So each stop that
//! names the store puts a fresh random mark at the head of the partition's
//! list of marks in `snapshot_marks`, and the checkpoint names that mark.
//! A mark in the list means that CQL has held the partition whole, without
//! a gap, since the stop that wrote it. A restart whose checkpoint's mark is
//! not in the list (the tables truncated: no list; restored from a backup
//! taken before that stop: an older list) snapshots every key instead. A
//! stop adds its mark only if the list is still the one its restore found
//! (a conditional write), which catches a truncation while it ran; the marks of earlier stops stay
//! (up to [`MARKS_KEPT`]), so a partition that another instance owned
//! meanwhile still finds its checkpoint's mark.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};

use super::CqlStore;
use crate::error::{Error, Result};

impl CqlStore {
    /// The mark lists of `group`'s input partitions, by partition, as
    /// stored (newest first, comma-separated: see [`MarkList`]).
    pub async fn snapshot_marks(&self, group: &str) -> Result<BTreeMap<i32, String>> {
        let cql = format!(
            "SELECT input_partition, mark FROM {}.snapshot_marks WHERE group_id = ?",
            self.keyspace
        );
        let rows = self
            .session
            .query_unpaged(cql, (group,))
            .await?
            .into_rows_result()
            .map_err(Error::cql_result)?;
        let mut marks = BTreeMap::new();
        for row in rows.rows::<(i32, String)>().map_err(Error::cql_result)? {
            let (partition, mark) = row.map_err(Error::cql_result)?;
            marks.insert(partition, mark);
        }
        Ok(marks)
    }

    /// Sets `group`'s mark list of each input partition in `swaps` to its
    /// new list, but only where CQL still holds the expected one (`None`:
    /// no list yet): lightweight transactions, side by side, so that a
    /// truncation between a stop's check and its write cannot go unseen,
    /// and a restore that read the marks long ago cannot replace a list
    /// another owner wrote since. Returns, for each, whether it applied.
    pub async fn swap_snapshot_marks(
        &self,
        group: &str,
        swaps: &[(i32, Option<&str>, &str)],
    ) -> Vec<(i32, Result<bool>)> {
        let ks = &self.keyspace;
        let writes = swaps.iter().map(|&(partition, expected, new)| async move {
            let result = match expected {
                Some(expected) => {
                    let cql = format!(
                        "UPDATE {ks}.snapshot_marks SET mark = ? WHERE group_id = ? AND input_partition = ? IF mark = ?"
                    );
                    self.session.query_unpaged(cql, (new, group, partition, expected)).await
                }
                None => {
                    let cql = format!(
                        "INSERT INTO {ks}.snapshot_marks (group_id, input_partition, mark) VALUES (?, ?, ?) IF NOT EXISTS"
                    );
                    self.session.query_unpaged(cql, (group, partition, new)).await
                }
            };
            (partition, result.map_err(Error::from).and_then(applied))
        });
        futures_util::future::join_all(writes).await
    }
}

/// Whether a lightweight transaction applied: its first column,
/// `[applied]` (the columns after it, when it did not, are the row's).
fn applied(result: scylla::response::query_result::QueryResult) -> Result<bool> {
    let rows = result.into_rows_result().map_err(Error::cql_result)?;
    let mut rows = rows.rows::<scylla::value::Row>().map_err(Error::cql_result)?;
    let row = rows
        .next()
        .ok_or_else(|| Error::Config("a conditional write returned no row".into()))?
        .map_err(Error::cql_result)?;
    Ok(matches!(
        row.columns.first(),
        Some(Some(scylla::value::CqlValue::Boolean(true)))
    ))
}

/// How many marks a partition's list keeps: a checkpoint older than this
/// many stops of its partition (by any instance) snapshots every key.
pub const MARKS_KEPT: usize = 8;

/// A partition's list of marks, newest first, as stored: comma-separated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarkList(String);

impl MarkList {
    pub fn parse(stored: &str) -> MarkList {
        MarkList(stored.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn contains(&self, mark: &str) -> bool {
        !mark.is_empty() && self.0.split(',').any(|m| m == mark)
    }

    /// The list with `mark` first, the oldest dropped past [`MARKS_KEPT`].
    pub fn with_newest(&self, mark: &str) -> MarkList {
        let kept = self.0.split(',').filter(|m| !m.is_empty()).take(MARKS_KEPT - 1);
        MarkList(std::iter::once(mark).chain(kept).collect::<Vec<_>>().join(","))
    }
}

/// A fresh mark: 128 random bits, as hex. Unique, not secret: the standard
/// library's per-process random hash keys, and the clock.
pub fn new_mark() -> String {
    let random = |salt: u128| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(salt);
        hasher.finish()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{:016x}{:016x}",
        random(now),
        random(now ^ u128::from(std::process::id()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_the_newest_marks_first() {
        let mut list = MarkList::default();
        assert!(!list.contains("a") && !list.contains(""));
        for mark in ["a", "b", "c"] {
            list = list.with_newest(mark);
        }
        assert_eq!(list.as_str(), "c,b,a");
        assert!(list.contains("a") && list.contains("c") && !list.contains("d"));
        for i in 0..MARKS_KEPT {
            list = list.with_newest(&format!("m{i}"));
        }
        assert_eq!(list.as_str().split(',').count(), MARKS_KEPT);
        assert!(!list.contains("c") && list.contains(&format!("m{}", MARKS_KEPT - 1)));
        assert_eq!(MarkList::parse(list.as_str()), list);
    }

    #[test]
    fn marks_differ_and_are_32_hex_digits() {
        let (a, b) = (super::new_mark(), super::new_mark());
        assert_ne!(a, b);
        assert!(a.len() == 32 && a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    }
}
