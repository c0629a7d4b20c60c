//! The `[gateway]` section; defaults and documentation are in
//! `config/default.toml`.

use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    pub listen: String,
    /// A read receipt more than this far past the conversation's latest
    /// known seq is refused as insane (`invalid_seq`).
    pub max_seq_ahead: u64,
    /// How long a receipt the gateway would refuse (`invalid_seq`,
    /// `not_a_member`) waits for the gateway's view to catch up first.
    pub receipt_wait_ms: u64,
    /// Serve the demo page at /demo/ and its endpoints that send messages.
    pub demo: bool,
    /// SO_SNDBUF of client connections (0: the kernel's autotuning). A
    /// small buffer bounds the kernel memory a connection can hold, and
    /// makes a slow client's updates coalesce in its outbox sooner.
    pub send_buffer_bytes: u32,
    /// A conversation with at least this many present members is a big
    /// group: its member changes go out as one `cursors` frame per
    /// `batch_interval_ms` instead of a frame each.
    pub batch_from_members: usize,
    pub batch_interval_ms: u64,
    /// v2: how many of a big group's newest seqs its `read_counts` cover.
    pub read_counts_window: usize,
    /// v2: at most one `read_counts` frame per connection per this interval.
    pub read_counts_interval_ms: u64,
}
