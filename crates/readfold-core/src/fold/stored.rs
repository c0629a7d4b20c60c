//! Conversations kept in a store (a local checkpoint) rather than in
//! memory, each taken in when a record first touches it.
//!
//! Decoding a whole checkpoint first would make a restart take time in
//! proportion to the state. A state [`over`](super::PartitionState::over)
//! a store starts empty and asks the store for a conversation the first
//! time it misses it, so a restart costs the same at any size; what no
//! record touches stays in the store. Everything merges by max, and a
//! conversation is taken whole before anything is folded into it, so the
//! result is the one a state loaded whole would reach.
//!
//! The store says when it finds itself damaged ([`StoredConversations::fault`]);
//! a state with a fault answers wrongly for what it could not take, and
//! must be dropped (restored from the changelog) before any of it is
//! published.

use std::fmt;

use super::Member;
use crate::domain::{ConversationId, Seq, UserId};

/// One conversation as a store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredConversation {
    pub id: ConversationId,
    pub latest_seq: Seq,
    pub members: Vec<(UserId, Member)>,
}

/// Why a store could not give a conversation: it is damaged or cannot be
/// read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoredFault(pub String);

/// Conversations a [`PartitionState`](super::PartitionState) takes in one
/// at a time. Implemented by the checkpoint format (`readfold-wire`) over
/// a file the processor opens: nothing here reads one.
pub trait StoredConversations: Send + Sync + fmt::Debug {
    /// The conversation `id`, if stored. A fault is also kept for
    /// [`StoredConversations::fault`].
    fn find(&self, id: &ConversationId) -> Result<Option<StoredConversation>, StoredFault>;

    /// Every stored conversation, in the store's order. A fault is also
    /// kept for [`StoredConversations::fault`].
    fn for_each(&self, each: &mut dyn FnMut(StoredConversation)) -> Result<(), StoredFault>;

    /// How many conversations and cursors it stores.
    fn counts(&self) -> (usize, usize);

    /// The first fault anyone found in it (a find, a `for_each`, or a check
    /// of the whole store run beside the fold), if any.
    fn fault(&self) -> Option<StoredFault>;
}
