//! The tables a replay writes: their columns, in order, and their rows.
//! Every format writes the same columns with the same names.

use std::str::FromStr;

use crate::latency::LatencyRow;

/// Which table a replay writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableKind {
    /// One row per (conversation, member) at the end point.
    Cursors,
    /// One row per message of the chosen conversations: its read count at
    /// the end point.
    ReadCounts,
    /// One row per message: time to first, median and last read.
    Latency,
    /// One row per (conversation, thread, follower) at the end point.
    ThreadCursors,
}

impl FromStr for TableKind {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        match raw {
            "cursors" => Ok(TableKind::Cursors),
            "read-counts" => Ok(TableKind::ReadCounts),
            "latency" => Ok(TableKind::Latency),
            "thread-cursors" => Ok(TableKind::ThreadCursors),
            _ => Err(format!(
                "{raw:?} is not a table: cursors, read-counts, latency or thread-cursors"
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Str,
    Int,
    Bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    pub nullable: bool,
}

const fn col(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        kind,
        nullable: false,
    }
}

const fn nullable(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        kind,
        nullable: true,
    }
}

/// One cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Null,
}

impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Self {
        v.map_or(Value::Null, Value::Int)
    }
}

const CURSOR_COLUMNS: [Column; 7] = [
    col("conversation", Kind::Str),
    col("user", Kind::Str),
    col("cursor", Kind::Int),
    col("join_seq", Kind::Int),
    // false: the member left (their cursor is kept, they count nowhere).
    col("present", Kind::Bool),
    col("latest_seq", Kind::Int),
    // max(0, latest_seq - cursor), as other members see it.
    col("unread", Kind::Int),
];

const THREAD_COLUMNS: [Column; 8] = [
    col("conversation", Kind::Str),
    // The root message's seq; cursors, join_seq and latest_seq count replies.
    col("thread", Kind::Int),
    col("user", Kind::Str),
    col("cursor", Kind::Int),
    col("join_seq", Kind::Int),
    // false: the member left the conversation.
    col("present", Kind::Bool),
    col("latest_seq", Kind::Int),
    // max(0, latest_seq - cursor), by the public cursor.
    col("unread", Kind::Int),
];

const THREAD_PRIVATE_COLUMNS: [Column; 2] = [
    col("private_cursor", Kind::Int),
    // The follower's own count: both cursors.
    col("own_unread", Kind::Int),
];

const PRIVATE_COLUMNS: [Column; 3] = [
    col("private_cursor", Kind::Int),
    col("marked_unread", Kind::Bool),
    // The member's own count: both cursors and the mark.
    col("own_unread", Kind::Int),
];

const READ_COUNT_COLUMNS: [Column; 6] = [
    col("conversation", Kind::Str),
    col("seq", Kind::Int),
    col("sender", Kind::Str),
    col("sent_at_ms", Kind::Int),
    col("read_count", Kind::Int),
    col("possible_readers", Kind::Int),
];

const LATENCY_COLUMNS: [Column; 10] = [
    col("conversation", Kind::Str),
    col("seq", Kind::Int),
    col("sender", Kind::Str),
    col("sent_at_ms", Kind::Int),
    col("possible_readers", Kind::Int),
    col("readers", Kind::Int),
    nullable("first_read_ms", Kind::Int),
    nullable("median_read_ms", Kind::Int),
    nullable("last_read_ms", Kind::Int),
    col("tracked_to_end", Kind::Bool),
];

/// The columns of `table`; the cursors table has three more with private
/// state when asked for.
pub fn columns(table: TableKind, include_private: bool) -> Vec<Column> {
    match table {
        TableKind::Cursors if include_private => {
            CURSOR_COLUMNS.iter().chain(&PRIVATE_COLUMNS).copied().collect()
        }
        TableKind::Cursors => CURSOR_COLUMNS.to_vec(),
        TableKind::ThreadCursors if include_private => THREAD_COLUMNS
            .iter()
            .chain(&THREAD_PRIVATE_COLUMNS)
            .copied()
            .collect(),
        TableKind::ThreadCursors => THREAD_COLUMNS.to_vec(),
        TableKind::ReadCounts => READ_COUNT_COLUMNS.to_vec(),
        TableKind::Latency => LATENCY_COLUMNS.to_vec(),
    }
}

impl LatencyRow {
    pub fn values(&self) -> Vec<Value> {
        vec![
            Value::Str(self.conversation.to_string()),
            Value::Int(self.seq as i64),
            Value::Str(self.sender.to_string()),
            Value::Int(self.sent_at),
            Value::Int(self.possible_readers.into()),
            Value::Int(self.readers.into()),
            self.first_read_ms.into(),
            self.median_read_ms.into(),
            self.last_read_ms.into(),
            Value::Bool(self.tracked_to_end),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_parse_by_name() {
        assert_eq!("read-counts".parse(), Ok(TableKind::ReadCounts));
        assert!("counts"
            .parse::<TableKind>()
            .unwrap_err()
            .contains("cursors, read-counts, latency or thread-cursors"));
        assert_eq!("thread-cursors".parse(), Ok(TableKind::ThreadCursors));
    }

    #[test]
    fn private_columns_only_when_asked() {
        assert_eq!(columns(TableKind::Cursors, false).len(), 7);
        let with = columns(TableKind::Cursors, true);
        assert_eq!(with.last().unwrap().name, "own_unread");
    }
}
