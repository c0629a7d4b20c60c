//! The state of the assigned input partitions, and how group events change
//! it. Pure: the run loop feeds it the consumer's events and records.

use std::collections::{BTreeMap, BTreeSet};

use readfold_core::flush::{self, PartitionSlot};
use readfold_core::fold::{InputKind, StoredFault};
use readfold_wire::OutRecord;

use crate::group::GroupEvent;

/// A partition's slot: its fold state and what its next flush publishes.
pub type Slot = PartitionSlot<OutRecord>;

/// What an assignment looked like, for the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    pub read_reports: Vec<i32>,
    pub conversation_events: Vec<i32>,
    /// Partitions assigned for one input only: the inputs are not
    /// co-partitioned in this group.
    pub one_sided: Vec<i32>,
}

/// The assigned partitions' state.
#[derive(Default)]
pub struct Partitions {
    pub slots: BTreeMap<i32, Slot>,
    /// The partitions of the current assignment; none between a revoke and
    /// the next assignment.
    owned: BTreeSet<i32>,
    /// `owned`, by input.
    owned_by_input: [Vec<i32>; 2],
    /// Between a revoke and the next assignment nothing is flushed.
    pub suspended: bool,
    /// Counts whole assignments and revokes (the classic protocol): a flush
    /// that began in another generation must not give back input offsets or
    /// dead letters of a partition that may have moved meanwhile. The
    /// consumer protocol's incremental changes leave it as it is: a
    /// partition released loses its slot, and one that comes back has
    /// another restore (see `flush::failed`).
    pub generation: u64,
    /// Counts every group event, whole or incremental.
    pub changes: u64,
}

impl Partitions {
    /// Applies one group event. `inputs` names the two input topics
    /// (read reports, conversation events). Returns the new assignment,
    /// if the event was one.
    pub fn apply(&mut self, event: GroupEvent, inputs: [&str; 2]) -> Option<Assignment> {
        self.changes += 1;
        match event {
            GroupEvent::Added { partitions, .. } => Some(self.add(&partitions, inputs)),
            GroupEvent::Released { partitions, lost } => Some(self.release(&partitions, lost, inputs)),
            GroupEvent::Revoked { lost } => {
                self.generation += 1;
                self.owned.clear();
                self.owned_by_input = Default::default();
                for slot in self.slots.values_mut() {
                    slot.forget_uncommitted();
                }
                if lost {
                    tracing::warn!("assignment lost: dropping all partition state");
                    self.slots.clear();
                }
                self.suspended = true;
                None
            }
            GroupEvent::Assigned { partitions, .. } => {
                self.generation += 1;
                let [reports, events] = inputs.map(|topic| of_input(&partitions, topic));
                let one_sided = one_sided(&reports, &events);
                self.owned = reports.iter().chain(&events).copied().collect();
                self.owned_by_input = [reports.clone(), events.clone()];
                // Another member may have owned a partition we did not get
                // back: its state here is stale. A slot is only ever made
                // for an owned partition (see `owns`), so one we got back
                // was ours throughout.
                let owned = &self.owned;
                self.slots.retain(|p, _| owned.contains(p));
                self.suspended = false;
                Some(Assignment {
                    read_reports: reports,
                    conversation_events: events,
                    one_sided,
                })
            }
        }
    }

    /// The consumer protocol added `partitions` (topic, partition).
    fn add(&mut self, partitions: &[(String, i32)], inputs: [&str; 2]) -> Assignment {
        for (topic, p) in partitions {
            if let Some(input) = inputs.iter().position(|i| i == topic) {
                self.owned_by_input[input].push(*p);
            }
        }
        self.incremental_assignment()
    }

    /// The consumer protocol took `partitions` away; the rest stay, with
    /// their state and offsets, and go on folding.
    fn release(&mut self, partitions: &[(String, i32)], lost: bool, inputs: [&str; 2]) -> Assignment {
        for (topic, p) in partitions {
            if let Some(input) = inputs.iter().position(|i| i == topic) {
                self.owned_by_input[input].retain(|q| q != p);
            }
        }
        let assignment = self.incremental_assignment();
        // One input of a partition still held (never under the broker's
        // range assignor, which moves both): its offsets are not ours to
        // commit any more.
        for (topic, p) in partitions {
            let kind = match inputs.iter().position(|i| i == topic) {
                Some(0) => InputKind::ReadReports,
                Some(_) => InputKind::ConversationEvents,
                None => continue,
            };
            if let Some(slot) = self.slots.get_mut(p) {
                slot.offsets.remove(&kind);
            }
        }
        // Owned elsewhere from now on, its state goes stale: a partition
        // that comes back is restored anew, and a flush in flight gives
        // nothing back to it (`flush::failed` compares restores).
        let owned = &self.owned;
        let gone: Vec<i32> = self
            .slots
            .keys()
            .filter(|p| !owned.contains(p))
            .copied()
            .collect();
        for p in &gone {
            self.slots.remove(p);
        }
        if lost && !gone.is_empty() {
            tracing::warn!(partitions = ?gone, "partitions lost: dropping their state");
        }
        assignment
    }

    /// After an incremental change to `owned_by_input`: the partitions
    /// owned are those of either input (the broker's range assignor moves
    /// both together), and nothing is suspended.
    fn incremental_assignment(&mut self) -> Assignment {
        for input in &mut self.owned_by_input {
            input.sort_unstable();
            input.dedup();
        }
        let [reports, events] = &self.owned_by_input;
        self.owned = reports.iter().chain(events).copied().collect();
        self.suspended = false;
        Assignment {
            read_reports: reports.clone(),
            conversation_events: events.clone(),
            one_sided: one_sided(reports, events),
        }
    }

    /// The partitions whose state must not be published, and why: the
    /// checkpoint each was restored from turned out damaged.
    pub fn stored_faults(&self) -> Vec<(i32, StoredFault)> {
        self.slots
            .iter()
            .filter_map(|(&p, slot)| slot.state.stored_fault().map(|fault| (p, fault)))
            .collect()
    }

    /// Whether any partition's state must not be published
    /// ([`Partitions::stored_faults`]): asked before every step.
    pub fn any_stored_fault(&self) -> bool {
        self.slots
            .values()
            .any(|slot| slot.state.stored_fault().is_some())
    }

    /// Forgets every partition and its state, until the next assignment:
    /// for a member that leaves the group and joins again.
    pub fn start_over(&mut self) {
        *self = Partitions {
            suspended: true,
            generation: self.generation + 1,
            ..Partitions::default()
        };
    }

    /// Whether `partition` is in the current assignment. A record of any
    /// other is dropped, never folded: it was fetched before a revoke, and
    /// whoever owns its partition now reads it again from the committed
    /// offsets. Folding it would need that partition's state, and a state
    /// restored for a partition owned elsewhere goes stale at once: were the
    /// partition to come back, it would be kept instead of restored.
    pub fn owns(&self, partition: i32) -> bool {
        self.owned.contains(&partition)
    }

    /// The partitions of the current assignment of each input (read
    /// reports, conversation events), in order.
    pub fn owned_by_input(&self) -> &[Vec<i32>; 2] {
        &self.owned_by_input
    }

    /// The owned partitions with no state yet, in order: to restore before
    /// any of their records is folded. None between a revoke and the next
    /// assignment, so a restore never makes a slot for a partition owned
    /// elsewhere.
    pub fn unrestored(&self) -> Vec<i32> {
        self.owned
            .iter()
            .copied()
            .filter(|p| !self.slots.contains_key(p))
            .collect()
    }

    pub fn dirty_len(&self) -> usize {
        flush::dirty_len(&self.slots)
    }

    /// Threads held, and their follower entries, over all partitions.
    pub fn thread_counts(&self) -> (usize, usize) {
        self.slots
            .values()
            .map(|s| s.state.thread_counts())
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }

    pub fn cursor_count(&self) -> usize {
        self.slots.values().map(|s| s.state.cursor_count()).sum()
    }
}

/// The partitions of `topic` among `partitions` (topic, partition), in order.
pub fn of_input(partitions: &[(String, i32)], topic: &str) -> Vec<i32> {
    let mut of: Vec<i32> = partitions
        .iter()
        .filter(|(t, _)| t == topic)
        .map(|(_, p)| *p)
        .collect();
    of.sort_unstable();
    of
}

/// Partitions held for one input only.
fn one_sided(reports: &[i32], events: &[i32]) -> Vec<i32> {
    reports
        .iter()
        .filter(|p| !events.contains(p))
        .chain(events.iter().filter(|p| !reports.contains(p)))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use readfold_core::flush::SnapshotDue;
    use readfold_core::fold::{InputKind, PartitionState, ReadReport};
    use readfold_core::Seq;

    const INPUTS: [&str; 2] = ["reports", "events"];

    fn assigned(pairs: &[(&str, i32)]) -> GroupEvent {
        GroupEvent::Assigned {
            partitions: pairs.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
            offsets_stable: true,
        }
    }

    fn with_slot(partitions: &mut Partitions, p: i32) {
        let mut slot = Slot::restored(PartitionState::new(), SnapshotDue::Nothing);
        slot.state.apply_report(&ReadReport {
            conversation_id: "C".parse().unwrap(),
            user_id: "u".parse().unwrap(),
            seq: Seq(1),
            reported_at: 0,
            private: false,
        });
        slot.processed(InputKind::ReadReports, 4);
        partitions.slots.insert(p, slot);
    }

    #[test]
    fn a_revoke_suspends_and_keeps_state_unless_lost() {
        let mut parts = Partitions::default();
        with_slot(&mut parts, 0);
        assert!(parts.apply(GroupEvent::Revoked { lost: false }, INPUTS).is_none());
        assert!(parts.suspended);
        assert!(parts.slots[&0].offsets.is_empty(), "uncommitted offsets go");
        assert_eq!(parts.dirty_len(), 1, "folded state stays");
        parts.apply(GroupEvent::Revoked { lost: true }, INPUTS);
        assert!(parts.slots.is_empty());
    }

    #[test]
    fn an_assignment_drops_partitions_that_moved_and_names_one_sided_ones() {
        let mut parts = Partitions::default();
        with_slot(&mut parts, 0);
        with_slot(&mut parts, 1);
        parts.apply(GroupEvent::Revoked { lost: false }, INPUTS);
        let a = parts
            .apply(assigned(&[("reports", 1), ("events", 1), ("reports", 2)]), INPUTS)
            .unwrap();
        assert!(!parts.suspended);
        assert_eq!(a.read_reports, [1, 2]);
        assert_eq!(a.conversation_events, [1]);
        assert_eq!(a.one_sided, [2]);
        assert_eq!(parts.slots.keys().copied().collect::<Vec<_>>(), [1]);
    }

    fn added(pairs: &[(&str, i32)]) -> GroupEvent {
        GroupEvent::Added {
            partitions: pairs.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
            offsets_stable: true,
        }
    }

    fn released(pairs: &[(&str, i32)]) -> GroupEvent {
        GroupEvent::Released {
            partitions: pairs.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
            lost: false,
        }
    }

    #[test]
    fn incremental_changes_keep_what_stays_and_drop_what_goes() {
        let mut parts = Partitions::default();
        parts.apply(
            added(&[("reports", 0), ("events", 0), ("reports", 1), ("events", 1)]),
            INPUTS,
        );
        with_slot(&mut parts, 0);
        with_slot(&mut parts, 1);
        let generation = parts.generation;
        let a = parts
            .apply(released(&[("reports", 1), ("events", 1)]), INPUTS)
            .unwrap();
        assert_eq!((a.read_reports, a.conversation_events), (vec![0], vec![0]));
        assert!(!parts.suspended, "what stays goes on");
        assert!(parts.owns(0) && !parts.owns(1));
        assert_eq!(
            parts.slots.keys().copied().collect::<Vec<_>>(),
            [0],
            "1's state went stale"
        );
        assert_eq!(
            parts.slots[&0].offsets[&InputKind::ReadReports],
            5,
            "0 keeps its progress"
        );
        assert_eq!(
            parts.generation, generation,
            "a flush in flight still gives 0 its work back"
        );
        parts.apply(added(&[("events", 2), ("reports", 2)]), INPUTS);
        assert_eq!(parts.owned_by_input(), &[vec![0, 2], vec![0, 2]]);
        assert_eq!(parts.unrestored(), [2]);
    }

    #[test]
    fn releasing_one_input_of_a_held_partition_gives_up_its_offsets_only() {
        let mut parts = Partitions::default();
        parts.apply(added(&[("reports", 0), ("events", 0)]), INPUTS);
        with_slot(&mut parts, 0);
        let slot = parts.slots.get_mut(&0).unwrap();
        slot.processed(InputKind::ConversationEvents, 8);
        let a = parts.apply(released(&[("events", 0)]), INPUTS).unwrap();
        assert_eq!(a.one_sided, [0]);
        let offsets = &parts.slots[&0].offsets;
        assert_eq!(offsets.get(&InputKind::ReadReports), Some(&5));
        assert_eq!(offsets.get(&InputKind::ConversationEvents), None);
    }

    #[test]
    fn only_the_current_assignment_is_owned() {
        let mut parts = Partitions::default();
        assert!(!parts.owns(0), "nothing before the first assignment");
        parts.apply(assigned(&[("reports", 0), ("events", 0), ("events", 3)]), INPUTS);
        assert!(parts.owns(0) && parts.owns(3));
        assert!(!parts.owns(1));
        // Each input's own: librdkafka is only asked about partitions it
        // was assigned (it would make the others up, and look for them).
        assert_eq!(parts.owned_by_input(), &[vec![0], vec![0, 3]]);
        parts.apply(GroupEvent::Revoked { lost: false }, INPUTS);
        assert!(!parts.owns(0), "nothing between a revoke and the next assignment");
        assert_eq!(parts.owned_by_input(), &[Vec::<i32>::new(), vec![]]);
        parts.apply(assigned(&[("reports", 1), ("events", 1)]), INPUTS);
        assert!(parts.owns(1) && !parts.owns(0) && !parts.owns(3));
    }

    #[test]
    fn the_owned_partitions_without_state_are_the_ones_to_restore() {
        let mut parts = Partitions::default();
        with_slot(&mut parts, 1);
        parts.apply(GroupEvent::Revoked { lost: false }, INPUTS);
        parts.apply(
            assigned(&[("reports", 2), ("events", 2), ("reports", 1), ("events", 1)]),
            INPUTS,
        );
        assert_eq!(parts.unrestored(), [2], "1 came straight back with its state");
        // An assignment then a revoke, taken together: nothing to restore.
        parts.apply(GroupEvent::Revoked { lost: false }, INPUTS);
        assert!(parts.unrestored().is_empty());
        parts.apply(assigned(&[("reports", 3), ("events", 3)]), INPUTS);
        parts.start_over();
        assert!(
            parts.unrestored().is_empty(),
            "a fenced member restores after its next assignment"
        );
    }
}
