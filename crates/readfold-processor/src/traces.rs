//! Spans of traced read reports: one opens when the fold takes a report
//! whose `traceparent` header says sampled, and ends when the flush that
//! publishes it commits. The changelog records of its change carry the
//! span's context on to the push gateways. With tracing off nothing here
//! runs: no header is read.

use std::collections::HashMap;

use readfold_core::domain::CursorKey;
use readfold_core::flush::FlushPlan;
use readfold_trace::{kafka_attributes, OpenSpan, SpanContext, SpanKind, Status, Tracer, Value};

/// Reports waiting for their flush, at most: a burst of traced reports
/// beyond it is not traced rather than held.
const MAX_PENDING: usize = 10_000;

/// A traced report the fold took.
#[derive(Clone, Debug)]
struct Pending {
    span: OpenSpan,
    offset: i64,
}

/// Traced reports not yet flushed, by partition and key.
#[derive(Default)]
pub(crate) struct PendingTraces {
    by_partition: HashMap<i32, HashMap<CursorKey, Vec<Pending>>>,
    len: usize,
}

/// The traced reports a flush carries.
#[derive(Default)]
pub(crate) struct FlushTraces {
    /// `traceparent` per index of the plan's changes that a traced report
    /// moved: the latest such report's span.
    pub headers: HashMap<usize, String>,
    spans: Vec<(i32, CursorKey, Pending, bool)>,
}

impl PendingTraces {
    /// Opens a span for a report the fold took, if its header asks for one.
    pub fn took(&mut self, header: Option<&[u8]>, partition: i32, offset: i64, key: &CursorKey) {
        let Some(parent) = header.and_then(SpanContext::parse).filter(|p| p.sampled) else {
            return;
        };
        if self.len >= MAX_PENDING {
            tracing::debug!(
                partition,
                offset,
                "too many traced reports waiting for a flush; not tracing this one"
            );
            return;
        }
        let pending = Pending {
            span: OpenSpan::start(Some(&parent), true),
            offset,
        };
        self.add(partition, key.clone(), pending);
    }

    fn add(&mut self, partition: i32, key: CursorKey, pending: Pending) {
        self.by_partition
            .entry(partition)
            .or_default()
            .entry(key)
            .or_default()
            .push(pending);
        self.len += 1;
    }

    /// Takes every pending report of the partitions `owned` says, for the
    /// flush of `plan`: the fold took them all before the plan was made.
    /// The others' partitions were given up; their new owner traces them.
    pub fn take_for<D>(&mut self, plan: &FlushPlan<D>, owned: impl Fn(i32) -> bool) -> FlushTraces {
        let mut traces = FlushTraces::default();
        if self.len == 0 {
            return traces;
        }
        self.len = 0;
        let mut pending = std::mem::take(&mut self.by_partition);
        pending.retain(|&partition, _| owned(partition));
        for (index, (partition, change)) in plan.changes.iter().enumerate() {
            let Some(reports) = pending
                .get_mut(partition)
                .and_then(|keys| keys.remove(&change.key))
            else {
                continue;
            };
            if let Some(latest) = reports.last() {
                traces.headers.insert(index, latest.span.context.traceparent());
            }
            let published = reports
                .into_iter()
                .map(|p| (*partition, change.key.clone(), p, true));
            traces.spans.extend(published);
        }
        // Reports that moved nothing (stale or repeated): processed all the
        // same once this flush commits their offsets.
        for (partition, keys) in pending {
            for (key, reports) in keys {
                traces
                    .spans
                    .extend(reports.into_iter().map(|p| (partition, key.clone(), p, false)));
            }
        }
        traces
    }

    /// A failed flush's reports wait for the next one, if their partition
    /// is still `owned`.
    pub fn failed(&mut self, traces: FlushTraces, owned: impl Fn(i32) -> bool) {
        for (partition, key, pending, _) in traces.spans {
            if owned(partition) && self.len < MAX_PENDING {
                self.add(partition, key, pending);
            }
        }
    }
}

impl FlushTraces {
    /// Ends the spans of a flush that committed.
    pub fn committed(self, tracer: &Tracer, topic: &str, changes: usize) {
        for (partition, key, pending, published) in self.spans {
            let mut attributes = kafka_attributes("process", topic, Some((partition, pending.offset)));
            attributes.extend([
                (
                    "readfold.conversation_id",
                    Value::from(key.conversation_id.to_string()),
                ),
                ("readfold.user_id", key.user_id.to_string().into()),
                ("readfold.published", published.into()),
                ("readfold.flush.changes", (changes as i64).into()),
            ]);
            tracer.record(pending.span.end(
                format!("process {topic}"),
                SpanKind::Consumer,
                attributes,
                Status::Unset,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use readfold_core::fold::{ConversationEvent, EventKind, PartitionState, ReadReport};
    use readfold_core::Seq;

    use super::*;

    fn key(user: &str) -> CursorKey {
        CursorKey {
            conversation_id: "G".parse().unwrap(),
            user_id: user.parse().unwrap(),
        }
    }

    #[test]
    fn a_flush_carries_the_latest_traced_report_of_a_change_and_ends_every_span() {
        let mut pending = PendingTraces::default();
        let (first, latest, stale) = (
            SpanContext::root(true),
            SpanContext::root(true),
            SpanContext::root(true),
        );
        pending.took(Some(first.traceparent().as_bytes()), 0, 10, &key("alice"));
        pending.took(Some(latest.traceparent().as_bytes()), 0, 11, &key("alice"));
        pending.took(Some(stale.traceparent().as_bytes()), 0, 12, &key("bob"));
        // Unsampled, missing or garbage: not traced.
        pending.took(
            Some(SpanContext::root(false).traceparent().as_bytes()),
            0,
            13,
            &key("bob"),
        );
        pending.took(None, 0, 14, &key("bob"));
        pending.took(Some(b"garbage"), 0, 15, &key("bob"));
        // A partition given up since.
        pending.took(Some(first.traceparent().as_bytes()), 1, 3, &key("carol"));

        let mut state = PartitionState::new();
        state.apply_event(&ConversationEvent {
            conversation_id: "G".parse().unwrap(),
            seq: Seq(6),
            at: 0,
            kind: EventKind::MessageSent {
                sender_id: "dave".parse().unwrap(),
                mentions: Default::default(),
            },
        });
        state.drain();
        state.apply_report(&ReadReport {
            conversation_id: "G".parse().unwrap(),
            user_id: "alice".parse().unwrap(),
            seq: Seq(4),
            reported_at: 0,
            private: false,
        });
        let plan = FlushPlan::<()> {
            partitions: vec![0],
            changes: state.drain().into_iter().map(|c| (0, c)).collect(),
            ..FlushPlan::empty()
        };
        assert_eq!(plan.changes.len(), 1, "alice's read");
        let traces = pending.take_for(&plan, |p| p == 0);
        assert_eq!(pending.len, 0);
        let header = SpanContext::parse(traces.headers[&0].as_bytes()).unwrap();
        assert_eq!(header.trace_id, latest.trace_id, "the latest report's trace");
        let spans: Vec<_> = traces
            .spans
            .iter()
            .map(|(partition, key, p, published)| (*partition, key.user_id.to_string(), p.offset, *published))
            .collect();
        assert_eq!(
            spans,
            [
                (0, "alice".into(), 10, true),
                (0, "alice".into(), 11, true),
                (0, "bob".into(), 12, false)
            ]
        );
        // A failed flush's reports wait for the next, if still owned.
        pending.failed(traces, |p| p == 0);
        assert_eq!(pending.len, 3);
        let traces = pending.take_for(&plan, |_| true);
        pending.failed(traces, |_| false);
        assert_eq!(pending.len, 0);
    }
}
