//! The local state checkpoint of one partition: what a restart on the same
//! machine loads instead of reading the whole changelog, as Kafka Streams
//! keeps a local store with a `.checkpoint` of changelog offsets.
//!
//! A checkpoint holds the partition's state exactly as the processor held
//! it (every conversation's latest seq, every member's every field), taken
//! when everything was flushed, and the changelog offsets that state
//! covers. Loading it and then applying the changelogs from those offsets,
//! as a restore applies them, answers every read as a full restore would:
//! each changelog record is a member's whole state, not a delta. (Where a
//! restore cannot know the live state, such as the cursor of a member who
//! left, the checkpoint keeps what the live processor had.) Pure: the
//! processor reads and writes the file and checks the offsets against the
//! broker.
//!
//! Layout: the magic `RFCKPT`, a format version (u16), the header, the
//! user ids (each once, numbered in order), the conversations (members
//! name their user by that number), then a CRC-32C of all that came before.
//! Integers are little-endian; strings are a u32 length and UTF-8 bytes.
//!
//! Version 2 writes each user id once: version 1 wrote it with every
//! member, and a restart hashed and interned it again for every cursor (a
//! third of decoding), and its checksum is CRC-32C, which CPUs compute
//! (version 1's was zlib's CRC-32). A version 1 file is refused, and that
//! partition restores from its changelog once.
//!
//! Version 3 adds one header field, the CQL store that held the whole state
//! when it was written (`snapshotted_to`), so that a restart snapshots only
//! what changed since rather than the whole state again. A version 2 file
//! is read as one that names no CQL store.

use readfold_core::fold::{
    LoadError, Member, MemberStateUpdate, MembershipVersion, PartitionState, StateLoader, UnreadMark,
};
use readfold_core::{ConversationId, Seq, UserId};

const MAGIC: &[u8; 6] = b"RFCKPT";
const VERSION: u16 = 3;
/// The oldest version this readfold reads.
const OLDEST_READ: u16 = 2;

/// What a checkpoint was taken of, and up to where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMeta {
    pub group_id: String,
    pub public_topic: String,
    pub state_topic: String,
    pub partition: i32,
    pub partition_count: i32,
    /// The next offset of each changelog partition not in the checkpoint.
    pub public_offset: i64,
    pub state_offset: i64,
    /// When it was written (ms since the epoch): a checkpoint older than
    /// the changelogs' `delete.retention.ms` may miss deleted tombstones.
    pub written_at_ms: i64,
    /// The CQL store (as the processor names it) that held every key of
    /// the state when it was written, snapshots included; `None` when CQL
    /// was off or behind. A restart writing to that same store snapshots
    /// only the keys the changelogs' tails changed.
    pub snapshotted_to: Option<String>,
}

/// Why a checkpoint cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("not a readfold checkpoint (bad magic)")]
    Magic,
    #[error("checkpoint format version {0}, this readfold reads {OLDEST_READ} to {VERSION}")]
    Version(u16),
    #[error("checksum mismatch: the file is corrupt")]
    Checksum,
    #[error("truncated or malformed checkpoint")]
    Malformed,
    #[error("invalid id: {0}")]
    Id(String),
    #[error("not one partition's state: {0}")]
    State(#[from] LoadError),
}

/// The checkpoint of `state`, taken at `meta`'s offsets. Call only when
/// every change is flushed, so that the state is what the changelogs hold.
pub fn encode(meta: &CheckpointMeta, state: &PartitionState) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 72 * state.cursor_count());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    put_str(&mut out, &meta.group_id);
    put_str(&mut out, &meta.public_topic);
    put_str(&mut out, &meta.state_topic);
    out.extend_from_slice(&meta.partition.to_le_bytes());
    out.extend_from_slice(&meta.partition_count.to_le_bytes());
    out.extend_from_slice(&meta.public_offset.to_le_bytes());
    out.extend_from_slice(&meta.state_offset.to_le_bytes());
    out.extend_from_slice(&meta.written_at_ms.to_le_bytes());
    put_str(&mut out, meta.snapshotted_to.as_deref().unwrap_or(""));
    let users = state.user_ids();
    out.extend_from_slice(&(users.len() as u64).to_le_bytes());
    for user in users {
        put_str(&mut out, user.as_str());
    }
    let conversations: Vec<_> = state.conversations().collect();
    out.extend_from_slice(&(conversations.len() as u64).to_le_bytes());
    for (id, conversation) in conversations {
        put_str(&mut out, id.as_str());
        out.extend_from_slice(&conversation.latest_seq().get().to_le_bytes());
        out.extend_from_slice(&(conversation.len() as u32).to_le_bytes());
        for (user, member) in conversation.numbered_members() {
            out.extend_from_slice(&user.get().to_le_bytes());
            put_member(&mut out, &member);
        }
    }
    let crc = crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A checkpoint whose frame holds (magic, version, checksum), with its
/// header read: whether it is worth decoding whole, checked once.
pub struct Opened<'a> {
    pub meta: CheckpointMeta,
    body: &'a [u8],
}

/// Checks the frame and reads the header.
pub fn open(bytes: &[u8]) -> Result<Opened<'_>, CheckpointError> {
    let (version, mut body) = check_frame(bytes)?;
    let meta = meta(&mut body, version)?;
    Ok(Opened { meta, body })
}

/// Only the header: whether a checkpoint is worth decoding whole.
pub fn decode_meta(bytes: &[u8]) -> Result<CheckpointMeta, CheckpointError> {
    open(bytes).map(|opened| opened.meta)
}

/// The whole checkpoint: its header and the state it holds. Ids are checked
/// as input ids are (`max_id_bytes`).
pub fn decode(
    bytes: &[u8],
    max_id_bytes: usize,
) -> Result<(CheckpointMeta, PartitionState), CheckpointError> {
    let opened = open(bytes)?;
    let meta = opened.meta.clone();
    Ok((meta, opened.state(max_id_bytes)?))
}

impl Opened<'_> {
    /// The state it holds. Ids are checked as input ids are
    /// (`max_id_bytes`).
    pub fn state(self, max_id_bytes: usize) -> Result<PartitionState, CheckpointError> {
        state(self.body, max_id_bytes)
    }
}

fn state(mut input: &[u8], max_id_bytes: usize) -> Result<PartitionState, CheckpointError> {
    let mut loader = StateLoader::default();
    // Every count is checked against the bytes left before anything is
    // reserved for it: no allocation beyond what the file holds.
    let user_count = take_count(&mut input, 4)?;
    loader.reserve(0, user_count);
    for _ in 0..user_count {
        let user = UserId::parse(take_str(&mut input)?, max_id_bytes)
            .map_err(|e| CheckpointError::Id(e.to_string()))?;
        loader.user(user);
    }
    let conversations = take_count(&mut input, CONVERSATION_MIN_BYTES)?;
    loader.reserve(conversations, 0);
    for _ in 0..conversations {
        let id = ConversationId::parse(take_str(&mut input)?, max_id_bytes)
            .map_err(|e| CheckpointError::Id(e.to_string()))?;
        let latest_seq = Seq(take_u64(&mut input)?);
        let count = u32::from_le_bytes(take_array(&mut input)?) as usize;
        if count > input.len() / MEMBER_MIN_BYTES {
            return Err(CheckpointError::Malformed);
        }
        let mut members = Vec::with_capacity(count);
        for _ in 0..count {
            let number = u32::from_le_bytes(take_array(&mut input)?);
            let user = loader.user_number(number).ok_or(CheckpointError::Malformed)?;
            members.push((user, take_member(&mut input)?));
        }
        loader.conversation(id, latest_seq, members);
    }
    if !input.is_empty() {
        return Err(CheckpointError::Malformed);
    }
    // A checkpoint is written from maps: a user or conversation listed
    // twice is damage.
    Ok(loader.finish()?)
}

/// Every member's member-state record, as the checkpoint's state holds
/// them. A restore applies the public changelog first and the member-state
/// records after, because a public record carries membership only roughly;
/// so after a checkpoint, apply the public tail, then these, then the
/// member-state tail, and the state is the one a full restore reaches.
pub fn member_states(state: &PartitionState) -> Vec<MemberStateUpdate> {
    state
        .keys()
        .filter_map(|key| state.current(&key))
        .map(|change| change.state_update())
        .collect()
}

/// A user number, then cursor, private cursor, join seq, flags, epoch,
/// updated_at.
const MEMBER_MIN_BYTES: usize = 4 + 8 * 3 + 1 + 8 * 2;

/// An id's length prefix, the latest seq, the member count.
const CONVERSATION_MIN_BYTES: usize = 4 + 8 + 4;

const LEFT: u8 = 1;
const LISTED: u8 = 2;
const MEMBERSHIP: u8 = 4;
const MARK: u8 = 8;
const MARK_SEQ: u8 = 16;

fn put_member(out: &mut Vec<u8>, m: &Member) {
    let mut flags = 0;
    for (on, flag) in [
        (m.left, LEFT),
        (m.listed, LISTED),
        (m.membership.is_some(), MEMBERSHIP),
        (m.mark.is_some(), MARK),
        (m.mark.is_some_and(|k| k.seq.is_some()), MARK_SEQ),
    ] {
        if on {
            flags |= flag;
        }
    }
    for seq in [m.cursor, m.private_cursor, m.join_seq] {
        out.extend_from_slice(&seq.get().to_le_bytes());
    }
    out.push(flags);
    out.extend_from_slice(&m.epoch.to_le_bytes());
    out.extend_from_slice(&m.updated_at.to_le_bytes());
    if let Some(v) = m.membership {
        out.extend_from_slice(&v.seq.get().to_le_bytes());
        out.extend_from_slice(&v.at.to_le_bytes());
    }
    if let Some(mark) = m.mark {
        out.extend_from_slice(&mark.at.to_le_bytes());
        if let Some(seq) = mark.seq {
            out.extend_from_slice(&seq.get().to_le_bytes());
        }
    }
}

fn take_member(input: &mut &[u8]) -> Result<Member, CheckpointError> {
    let cursor = Seq(take_u64(input)?);
    let private_cursor = Seq(take_u64(input)?);
    let join_seq = Seq(take_u64(input)?);
    let [flags] = take_array::<1>(input)?;
    if flags & !(LEFT | LISTED | MEMBERSHIP | MARK | MARK_SEQ) != 0
        || (flags & MARK_SEQ != 0 && flags & MARK == 0)
    {
        return Err(CheckpointError::Malformed);
    }
    let epoch = take_u64(input)?;
    let updated_at = take_i64(input)?;
    let membership = if flags & MEMBERSHIP != 0 {
        Some(MembershipVersion {
            seq: Seq(take_u64(input)?),
            at: take_i64(input)?,
        })
    } else {
        None
    };
    let mark = if flags & MARK != 0 {
        let at = take_i64(input)?;
        let seq = if flags & MARK_SEQ != 0 {
            Some(Seq(take_u64(input)?))
        } else {
            None
        };
        Some(UnreadMark { at, seq })
    } else {
        None
    };
    Ok(Member {
        cursor,
        private_cursor,
        join_seq,
        left: flags & LEFT != 0,
        listed: flags & LISTED != 0,
        membership,
        epoch,
        mark,
        updated_at,
    })
}

/// The format version, and the body between it and the checksum, once
/// both are right.
fn check_frame(bytes: &[u8]) -> Result<(u16, &[u8]), CheckpointError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(CheckpointError::Magic);
    }
    if bytes.len() < MAGIC.len() + 2 + 4 {
        return Err(CheckpointError::Malformed);
    }
    // The version first: an older format has an older checksum too, and
    // "version 1" says more than "corrupt".
    let version = u16::from_le_bytes([bytes[6], bytes[7]]);
    if !(OLDEST_READ..=VERSION).contains(&version) {
        return Err(CheckpointError::Version(version));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c(body).to_le_bytes() != crc {
        return Err(CheckpointError::Checksum);
    }
    Ok((version, &body[MAGIC.len() + 2..]))
}

fn meta(input: &mut &[u8], version: u16) -> Result<CheckpointMeta, CheckpointError> {
    Ok(CheckpointMeta {
        group_id: take_str(input)?.to_owned(),
        public_topic: take_str(input)?.to_owned(),
        state_topic: take_str(input)?.to_owned(),
        partition: i32::from_le_bytes(take_array(input)?),
        partition_count: i32::from_le_bytes(take_array(input)?),
        public_offset: take_i64(input)?,
        state_offset: take_i64(input)?,
        written_at_ms: take_i64(input)?,
        snapshotted_to: match version {
            2 => None,
            _ => Some(take_str(input)?.to_owned()).filter(|store| !store.is_empty()),
        },
    })
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn take_array<const N: usize>(input: &mut &[u8]) -> Result<[u8; N], CheckpointError> {
    if input.len() < N {
        return Err(CheckpointError::Malformed);
    }
    let (head, rest) = input.split_at(N);
    *input = rest;
    Ok(head.try_into().expect("N bytes"))
}

/// A u64 count of items that take at least `min_bytes` each, if the rest
/// of the input can hold that many.
fn take_count(input: &mut &[u8], min_bytes: usize) -> Result<usize, CheckpointError> {
    let count = take_u64(input)?;
    if count > (input.len() / min_bytes) as u64 {
        return Err(CheckpointError::Malformed);
    }
    Ok(count as usize)
}

fn take_u64(input: &mut &[u8]) -> Result<u64, CheckpointError> {
    take_array(input).map(u64::from_le_bytes)
}

fn take_i64(input: &mut &[u8]) -> Result<i64, CheckpointError> {
    take_array(input).map(i64::from_le_bytes)
}

fn take_str<'a>(input: &mut &'a [u8]) -> Result<&'a str, CheckpointError> {
    let len = u32::from_le_bytes(take_array(input)?) as usize;
    if len > input.len() {
        return Err(CheckpointError::Malformed);
    }
    let (bytes, rest) = input.split_at(len);
    *input = rest;
    std::str::from_utf8(bytes).map_err(|_| CheckpointError::Malformed)
}

/// CRC-32C (Castagnoli, as iSCSI and ext4 use it). A restart checks every
/// checkpoint byte: with the CPU's CRC instruction (SSE 4.2, on every
/// x86-64 server of the last decade) that is several GB/s; elsewhere a
/// table eight bytes a step.
fn crc32c(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2, checked just above.
        return unsafe { crc32c_sse42(bytes) };
    }
    crc32c_sliced(bytes)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn crc32c_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut chunks = bytes.chunks_exact(8);
    let mut crc = u64::from(!0u32);
    for chunk in &mut chunks {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
    }
    let crc = chunks
        .remainder()
        .iter()
        .fold(crc as u32, |c, &b| _mm_crc32_u8(c, b));
    !crc
}

/// CRC-32C eight bytes a step ("slicing by 8").
fn crc32c_sliced(bytes: &[u8]) -> u32 {
    static TABLES: std::sync::OnceLock<[[u32; 256]; 8]> = std::sync::OnceLock::new();
    let t = TABLES.get_or_init(|| {
        let mut t = [[0u32; 256]; 8];
        for (i, entry) in t[0].iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 == 1 { CASTAGNOLI ^ (c >> 1) } else { c >> 1 };
            }
            *entry = c;
        }
        // Table k: a byte followed by k zero bytes.
        for i in 0..256 {
            for k in 1..8 {
                let previous = t[k - 1][i];
                t[k][i] = (previous >> 8) ^ t[0][(previous & 0xff) as usize];
            }
        }
        t
    });
    let at = |k: usize, v: u32, shift: u32| t[k][((v >> shift) & 0xff) as usize];
    let mut crc = !0u32;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let one = u32::from_le_bytes(chunk[..4].try_into().expect("4 bytes")) ^ crc;
        let two = u32::from_le_bytes(chunk[4..].try_into().expect("4 bytes"));
        crc = at(7, one, 0)
            ^ at(6, one, 8)
            ^ at(5, one, 16)
            ^ at(4, one, 24)
            ^ at(3, two, 0)
            ^ at(2, two, 8)
            ^ at(1, two, 16)
            ^ at(0, two, 24);
    }
    !chunks
        .remainder()
        .iter()
        .fold(crc, |c, &b| t[0][((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8))
}

/// The CRC-32C polynomial, bits reversed.
const CASTAGNOLI: u32 = 0x82F6_3B78;

#[cfg(test)]
mod tests;
