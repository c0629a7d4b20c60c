//! The local state checkpoint of one partition: what a restart on the same
//! machine starts from instead of reading the whole changelog, as Kafka
//! Streams keeps a local store with a `.checkpoint` of changelog offsets.
//!
//! A checkpoint holds the partition's state exactly as the processor held
//! it (every conversation's latest seq, every member's every field), taken
//! when everything was flushed, and the changelog offsets that state
//! covers. A state over it, with the changelogs applied from those offsets
//! as a restore applies them, answers every read as a full restore would:
//! each changelog record is a member's whole state, not a delta. (Where a
//! restore cannot know the live state, such as the cursor of a member who
//! left, the checkpoint keeps what the live processor had.) Pure: the
//! processor opens the file and gives it as a [`ReadAt`].
//!
//! A restart does not decode the file: it reads the header and a table of
//! checksums, and the state takes each conversation in from the file when a
//! record first touches it ([`PartitionState::over`]). So a restart costs
//! the same at any size of state. Each 4 KiB page of the body has its own
//! CRC-32C, checked whenever the page is read: a damaged page is found
//! before anything of it is used, and [`Checkpoint::check_all`] checks
//! every page beside the fold.
//!
//! Layout (version 5), integers little-endian, strings a u32 length and
//! UTF-8 bytes:
//! - the magic `RFCKPT`, the format version (u16), the header's length
//!   (u32), the header, and a CRC-32C of all that;
//! - the body: the conversations, each a u32 length and then its id, latest
//!   seq, member count and members (each its user id and fields); then an
//!   index of them, open addressing over a hash of the id (at most two
//!   thirds full), each bucket a conversation's offset plus one (zero is
//!   empty);
//! - a CRC-32C of each page of the body, then a CRC-32C of that table.
//!
//! A file of an earlier version (2 and 3 were decoded whole at the start;
//! 4 had no delivered cursor, mentions or mute) is refused by its version, and that
//! partition restores from its changelog once (and, with CQL on, snapshots
//! everything once).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use readfold_core::fold::{
    LoadError, Member, MembershipVersion, PartitionState, StoredConversation, StoredConversations,
    StoredFault, UnreadMark,
};
use readfold_core::{ConversationId, Mute, Seq, UserId};

const MAGIC: &[u8; 6] = b"RFCKPT";
const VERSION: u16 = 5;
/// The bytes each checksum of the body covers.
const PAGE: usize = 4096;
/// What a scan of the whole body reads at a time.
const CHUNK_PAGES: usize = 256;
/// A header past this is damage: it holds a few names and numbers.
const MAX_HEADER: usize = 1 << 20;
/// The magic, the version and the header's length.
const PROLOGUE: usize = 6 + 2 + 4;
/// One bucket of the index: a conversation's offset, plus one.
const BUCKET: usize = 8;
/// Buckets a lookup reads at a time.
const WINDOW: u64 = 8;
/// Bytes a lookup reads of a conversation before it knows its length:
/// most conversations fit.
const HEAD: usize = 512;

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
    #[error("checkpoint format version {0}, this readfold reads {VERSION}")]
    Version(u16),
    #[error("checksum mismatch: the file is corrupt")]
    Checksum,
    #[error("truncated or malformed checkpoint")]
    Malformed,
    #[error("invalid id: {0}")]
    Id(String),
    #[error("not one partition's state: {0}")]
    State(#[from] LoadError),
    #[error("cannot read the checkpoint: {0}")]
    Read(String),
    #[error("the state's own checkpoint: {0}")]
    Stored(#[from] StoredFault),
}

/// Bytes read at offsets: the processor's checkpoint file, or bytes in
/// memory.
pub trait ReadAt: Send + Sync {
    /// How many bytes there are.
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let from = usize::try_from(offset).ok().filter(|&o| o <= self.len());
        match from.and_then(|from| self.get(from..from + buf.len())) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

impl ReadAt for Vec<u8> {
    fn size(&self) -> u64 {
        self.as_slice().size()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.as_slice().read_exact_at(buf, offset)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for &T {
    fn size(&self) -> u64 {
        (**self).size()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        (**self).read_exact_at(buf, offset)
    }
}

/// The checkpoint of `state`, taken at `meta`'s offsets. Call only when
/// every change is flushed, so that the state is what the changelogs hold.
/// A state over a checkpoint writes what it has not taken in from it too
/// (which fails if that checkpoint turns out damaged).
pub fn encode(meta: &CheckpointMeta, state: &PartitionState) -> Result<Vec<u8>, CheckpointError> {
    let mut header = Vec::with_capacity(256);
    put_str(&mut header, &meta.group_id);
    put_str(&mut header, &meta.public_topic);
    put_str(&mut header, &meta.state_topic);
    header.extend_from_slice(&meta.partition.to_le_bytes());
    header.extend_from_slice(&meta.partition_count.to_le_bytes());
    header.extend_from_slice(&meta.public_offset.to_le_bytes());
    header.extend_from_slice(&meta.state_offset.to_le_bytes());
    header.extend_from_slice(&meta.written_at_ms.to_le_bytes());
    put_str(&mut header, meta.snapshotted_to.as_deref().unwrap_or(""));
    // The counts and lengths go last, filled in once the body is written.
    let counts_at = PROLOGUE + header.len();
    header.extend_from_slice(&[0; 5 * 8]);
    let mut out = Vec::with_capacity(PROLOGUE + header.len() + 4 + 80 * state.cursor_count().min(1 << 24));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&[0; 4]);
    let body_at = out.len();
    // Each conversation's (hash, offset), for the index.
    let mut placed: Vec<(u64, u64)> = Vec::new();
    let mut cursors = 0u64;
    state.all_conversations(&mut |id, latest_seq, members| {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        put_str(&mut out, id.as_str());
        out.extend_from_slice(&latest_seq.get().to_le_bytes());
        let count_at = out.len();
        out.extend_from_slice(&[0; 4]);
        let mut count = 0u32;
        for (user, member) in members {
            put_str(&mut out, user.as_str());
            put_member(&mut out, &member);
            count += 1;
        }
        out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        let len = out.len() - at;
        out[at..at + 4].copy_from_slice(&((len - 4) as u32).to_le_bytes());
        placed.push((hash(id.as_str().as_bytes()), (at - body_at) as u64));
        cursors += u64::from(count);
    })?;
    let records_len = (out.len() - body_at) as u64;
    // At most two thirds full: a lookup's first read of buckets mostly
    // ends it, and there is always an empty one.
    let buckets = (placed.len() + placed.len() / 2 + 1).next_power_of_two();
    let mut index = vec![0u64; buckets];
    let mask = buckets as u64 - 1;
    for &(h, offset) in &placed {
        let mut b = h & mask;
        while index[b as usize] != 0 {
            b = (b + 1) & mask;
        }
        index[b as usize] = offset + 1;
    }
    for offset in index {
        out.extend_from_slice(&offset.to_le_bytes());
    }
    let body_len = (out.len() - body_at) as u64;
    for (i, n) in [
        body_len,
        records_len,
        buckets as u64,
        placed.len() as u64,
        cursors,
    ]
    .into_iter()
    .enumerate()
    {
        out[counts_at + 8 * i..counts_at + 8 * (i + 1)].copy_from_slice(&n.to_le_bytes());
    }
    seal_in_place(&mut out, body_at);
    Ok(out)
}

/// Writes the checksums of a file whose body starts at `body_at` and runs
/// to its end: the header's (the four bytes before the body), and the
/// pages' after it.
fn seal_in_place(out: &mut Vec<u8>, body_at: usize) {
    let crc = crc32c(&out[..body_at - 4]);
    out[body_at - 4..body_at].copy_from_slice(&crc.to_le_bytes());
    let mut pages = Vec::with_capacity(4 * (out.len() - body_at).div_ceil(PAGE) + 4);
    for page in out[body_at..].chunks(PAGE) {
        pages.extend_from_slice(&crc32c(page).to_le_bytes());
    }
    let crc = crc32c(&pages);
    out.extend_from_slice(&pages);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// A file of this version with `header` (what follows the header's
/// length) and `body`, under right checksums: for fuzzing and testing
/// what lies past the checksums.
#[doc(hidden)]
pub fn seal(header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PROLOGUE + header.len() + 4 + body.len() + body.len() / 1000 + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(&[0; 4]);
    let body_at = out.len();
    out.extend_from_slice(body);
    seal_in_place(&mut out, body_at);
    out
}

/// The header and the body of a file [`encode`] wrote: what [`seal`]
/// takes. `None` for what is not one.
#[doc(hidden)]
pub fn unseal(file: &[u8]) -> Option<(&[u8], &[u8])> {
    let header_len = u32::from_le_bytes(file.get(8..PROLOGUE)?.try_into().ok()?) as usize;
    let header = file.get(PROLOGUE..PROLOGUE + header_len)?;
    let body_len = u64::from_le_bytes(
        header
            .get(header_len.checked_sub(40)?..header_len - 32)?
            .try_into()
            .ok()?,
    );
    let body_at = PROLOGUE + header_len + 4;
    let body = file.get(body_at..body_at.checked_add(usize::try_from(body_len).ok()?)?)?;
    Some((header, body))
}

/// A checkpoint whose header and page checksums hold, with its body left
/// in the file: conversations are read from it when asked for.
pub struct Checkpoint<S> {
    pub meta: CheckpointMeta,
    source: S,
    /// Where the body starts in the file, and how long it is.
    body_at: u64,
    body_len: u64,
    /// The conversations' bytes, before the index.
    records_len: u64,
    buckets: u64,
    conversations: u64,
    cursors: u64,
    page_crcs: Vec<u32>,
    /// The pages whose checksum held, a bit each: read again, they are
    /// read only as far as needed, unchecked (the file is never changed
    /// in place: a new checkpoint is written beside it and renamed).
    verified: Box<[AtomicU64]>,
    max_id_bytes: usize,
    fault: Mutex<Option<StoredFault>>,
    /// Whether `fault` holds one: the processor asks before every step.
    faulted: AtomicBool,
}

impl<S> fmt::Debug for Checkpoint<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("meta", &self.meta)
            .field("conversations", &self.conversations)
            .field("cursors", &self.cursors)
            .finish_non_exhaustive()
    }
}

/// Checks the header and the page checksums' table and reads them: what
/// a restart reads of a checkpoint before it is ready. Ids are checked as
/// input ids are (`max_id_bytes`) when read.
pub fn open<S: ReadAt>(source: S, max_id_bytes: usize) -> Result<Checkpoint<S>, CheckpointError> {
    let size = source.size();
    let read = |offset: u64, len: usize| -> Result<Vec<u8>, CheckpointError> {
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(CheckpointError::Malformed);
        }
        read_exact(&source, offset, len)
    };
    let prologue = read(0, PROLOGUE.min(size as usize))?;
    if prologue.len() < MAGIC.len() || &prologue[..MAGIC.len()] != MAGIC {
        return Err(CheckpointError::Magic);
    }
    if prologue.len() < PROLOGUE {
        return Err(CheckpointError::Malformed);
    }
    // The version first: an older format has an older layout, and
    // "version 3" says more than "corrupt".
    let version = u16::from_le_bytes([prologue[6], prologue[7]]);
    if version != VERSION {
        return Err(CheckpointError::Version(version));
    }
    let header_len = u32::from_le_bytes(prologue[8..12].try_into().expect("4 bytes")) as usize;
    if header_len > MAX_HEADER {
        return Err(CheckpointError::Malformed);
    }
    let mut framed = prologue;
    framed.extend(read(PROLOGUE as u64, header_len + 4)?);
    let (framed, crc) = framed.split_at(PROLOGUE + header_len);
    if crc32c(framed).to_le_bytes() != crc {
        return Err(CheckpointError::Checksum);
    }
    let mut header = &framed[PROLOGUE..];
    let meta = meta(&mut header)?;
    let [body_len, records_len, buckets, conversations, cursors] = [(); 5].map(|_| take_u64(&mut header));
    let (body_len, records_len, buckets, conversations, cursors) =
        (body_len?, records_len?, buckets?, conversations?, cursors?);
    let body_at = (PROLOGUE + header_len + 4) as u64;
    let pages = body_len.div_ceil(PAGE as u64);
    let expected = body_at
        .checked_add(body_len)
        .zip(pages.checked_mul(4))
        .and_then(|(end, table)| end.checked_add(table)?.checked_add(4));
    if !header.is_empty()
        || expected != Some(size)
        || !buckets.is_power_of_two()
        || buckets
            .checked_mul(BUCKET as u64)
            .and_then(|b| b.checked_add(records_len))
            != Some(body_len)
        || conversations >= buckets
        // What the records could hold at the least: the counts size what
        // a state over the file reserves and reports.
        || conversations > records_len / RECORD_MIN_BYTES as u64
        || cursors > records_len / MEMBER_MIN_BYTES as u64
    {
        return Err(CheckpointError::Malformed);
    }
    let table = read(body_at + body_len, pages as usize * 4 + 4)?;
    let (table, crc) = table.split_at(table.len() - 4);
    if crc32c(table).to_le_bytes() != crc {
        return Err(CheckpointError::Checksum);
    }
    let page_crcs: Vec<u32> = table
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let verified = (0..page_crcs.len().div_ceil(64))
        .map(|_| AtomicU64::new(0))
        .collect();
    Ok(Checkpoint {
        meta,
        source,
        body_at,
        body_len,
        records_len,
        buckets,
        conversations,
        cursors,
        page_crcs,
        verified,
        max_id_bytes,
        fault: Mutex::new(None),
        faulted: AtomicBool::new(false),
    })
}

/// Only the header: whether a checkpoint is worth using.
pub fn decode_meta(bytes: &[u8]) -> Result<CheckpointMeta, CheckpointError> {
    open(bytes, usize::MAX).map(|opened| opened.meta)
}

/// The whole checkpoint, every page checked and every conversation read:
/// its header and the state it holds. Ids are checked as input ids are
/// (`max_id_bytes`).
pub fn decode(
    bytes: &[u8],
    max_id_bytes: usize,
) -> Result<(CheckpointMeta, PartitionState), CheckpointError> {
    let opened = open(bytes, max_id_bytes)?;
    let mut state = PartitionState::new();
    let mut repeated = None;
    opened.scan(&mut |c| {
        if state.conversation(&c.id).is_some() {
            repeated.get_or_insert(c.id);
        } else {
            state.restore_conversation(c.id, c.latest_seq, c.members);
        }
    })?;
    if let Some(id) = repeated {
        return Err(LoadError::RepeatedConversation(id).into());
    }
    Ok((opened.meta, state))
}

impl<S: ReadAt + 'static> Checkpoint<S> {
    /// The state it holds, over it: conversations are read from it as
    /// records first touch them. Share the checkpoint (an `Arc`) to check
    /// it whole ([`Checkpoint::check_all`]) beside the fold.
    pub fn state(self: Arc<Self>) -> PartitionState {
        PartitionState::over(self)
    }
}

impl<S: ReadAt> Checkpoint<S> {
    /// How many pages the body has (4 KiB each, each with a checksum).
    pub fn page_count(&self) -> usize {
        self.page_crcs.len()
    }

    /// Reads every page of the body and checks its checksum: a restart
    /// runs it beside the fold, so that damage in a page no record touches
    /// is found too. A fault is kept for [`StoredConversations::fault`].
    pub fn check_all(&self) -> Result<(), CheckpointError> {
        let mut at = 0;
        while at < self.body_len {
            let len = (CHUNK_PAGES * PAGE).min((self.body_len - at) as usize);
            if let Err(e) = self.pages(at, len) {
                self.failed(e.clone());
                return Err(e);
            }
            at += len as u64;
        }
        Ok(())
    }

    /// The body's bytes `[offset, offset + len)`, each page they touch read
    /// whole and checked: the pages, and where the bytes start in them.
    fn pages(&self, offset: u64, len: usize) -> Result<(Vec<u8>, usize), CheckpointError> {
        let end = self.end_of(offset, len)?;
        let first = offset / PAGE as u64;
        let from = first * PAGE as u64;
        let to = end
            .div_ceil(PAGE as u64)
            .saturating_mul(PAGE as u64)
            .min(self.body_len);
        let buf = read_exact(&self.source, self.body_at + from, (to - from) as usize)?;
        for (i, page) in buf.chunks(PAGE).enumerate() {
            let n = first as usize + i;
            if !self.is_verified(n) {
                if Some(&crc32c(page)) != self.page_crcs.get(n) {
                    return Err(CheckpointError::Checksum);
                }
                self.verified[n / 64].fetch_or(1 << (n % 64), Ordering::Relaxed);
            }
        }
        Ok((buf, (offset - from) as usize))
    }

    /// The body's bytes `[offset, offset + len)`: only those when every
    /// page they touch was checked before, else [`Checkpoint::pages`].
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, CheckpointError> {
        let end = self.end_of(offset, len)?;
        let (first, last) = (offset / PAGE as u64, end.saturating_sub(1) / PAGE as u64);
        if (first..=last).all(|n| self.is_verified(n as usize)) {
            return read_exact(&self.source, self.body_at + offset, len);
        }
        let (mut pages, start) = self.pages(offset, len)?;
        pages.truncate(start + len);
        pages.drain(..start);
        Ok(pages)
    }

    fn end_of(&self, offset: u64, len: usize) -> Result<u64, CheckpointError> {
        offset
            .checked_add(len as u64)
            .filter(|&end| end <= self.body_len)
            .ok_or(CheckpointError::Malformed)
    }

    fn is_verified(&self, page: usize) -> bool {
        self.verified
            .get(page / 64)
            .is_some_and(|bits| bits.load(Ordering::Relaxed) & (1 << (page % 64)) != 0)
    }

    /// Every conversation, in the file's order, read a chunk at a time.
    fn scan(&self, each: &mut dyn FnMut(StoredConversation)) -> Result<(), CheckpointError> {
        let (mut at, mut found) = (0u64, 0u64);
        let mut carry: Vec<u8> = Vec::new();
        while at < self.records_len {
            let len = (CHUNK_PAGES * PAGE).min((self.records_len - at) as usize);
            let (pages, start) = self.pages(at, len)?;
            carry.extend_from_slice(&pages[start..start + len]);
            at += len as u64;
            let mut rest = carry.as_slice();
            while rest.len() >= 4 {
                let record_len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
                if rest.len() - 4 < record_len {
                    break;
                }
                let (record, after) = rest[4..].split_at(record_len);
                each(self.conversation(record)?);
                found += 1;
                rest = after;
            }
            let used = carry.len() - rest.len();
            carry.drain(..used);
        }
        if !carry.is_empty() || found != self.conversations {
            return Err(CheckpointError::Malformed);
        }
        Ok(())
    }

    /// The conversation `id`, looked up in the index.
    fn lookup(&self, id: &ConversationId) -> Result<Option<StoredConversation>, CheckpointError> {
        let mask = self.buckets - 1;
        let mut bucket = hash(id.as_str().as_bytes()) & mask;
        let mut probed = 0;
        // The index is never full: an empty bucket ends every search.
        while probed < self.buckets {
            let n = WINDOW.min(self.buckets - bucket).min(self.buckets - probed);
            let window = self.read(self.records_len + bucket * BUCKET as u64, n as usize * BUCKET)?;
            for entry in window.chunks_exact(BUCKET) {
                let offset = u64::from_le_bytes(entry.try_into().expect("a bucket"));
                if offset == 0 {
                    return Ok(None);
                }
                let record = self.record_at(offset - 1)?;
                let mut peek = record.as_slice();
                if take_str(&mut peek)? == id.as_str() {
                    return self.conversation(&record).map(Some);
                }
            }
            probed += n;
            bucket = (bucket + n) & mask;
        }
        Err(CheckpointError::Malformed)
    }

    /// The record of the conversation at `offset`, without its length.
    fn record_at(&self, offset: u64) -> Result<Vec<u8>, CheckpointError> {
        if offset >= self.records_len {
            return Err(CheckpointError::Malformed);
        }
        let head = HEAD.min((self.records_len - offset) as usize);
        let mut record = self.read(offset, head)?;
        let len = u32::from_le_bytes(
            record
                .get(..4)
                .ok_or(CheckpointError::Malformed)?
                .try_into()
                .expect("4 bytes"),
        );
        let end = 4 + len as usize;
        if offset + end as u64 > self.records_len {
            return Err(CheckpointError::Malformed);
        }
        if end <= record.len() {
            record.truncate(end);
            record.drain(..4);
            Ok(record)
        } else {
            self.read(offset + 4, len as usize)
        }
    }

    /// One conversation's record.
    fn conversation(&self, mut input: &[u8]) -> Result<StoredConversation, CheckpointError> {
        let id = ConversationId::parse(take_str(&mut input)?, self.max_id_bytes)
            .map_err(|e| CheckpointError::Id(e.to_string()))?;
        let latest_seq = Seq(take_u64(&mut input)?);
        let count = u32::from_le_bytes(take_array(&mut input)?) as usize;
        if count > input.len() / MEMBER_MIN_BYTES {
            return Err(CheckpointError::Malformed);
        }
        let mut members = Vec::with_capacity(count);
        for _ in 0..count {
            let user = UserId::parse(take_str(&mut input)?, self.max_id_bytes)
                .map_err(|e| CheckpointError::Id(e.to_string()))?;
            members.push((user, take_member(&mut input)?));
        }
        if !input.is_empty() {
            return Err(CheckpointError::Malformed);
        }
        Ok(StoredConversation {
            id,
            latest_seq,
            members,
        })
    }

    /// Keeps the first fault found, and gives it as the state's.
    fn failed(&self, error: CheckpointError) -> StoredFault {
        let fault = StoredFault(error.to_string());
        let kept = self
            .fault
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_or_insert(fault)
            .clone();
        self.faulted.store(true, Ordering::Release);
        kept
    }
}

impl<S: ReadAt> StoredConversations for Checkpoint<S> {
    fn find(&self, id: &ConversationId) -> Result<Option<StoredConversation>, StoredFault> {
        self.lookup(id).map_err(|e| self.failed(e))
    }

    fn for_each(&self, each: &mut dyn FnMut(StoredConversation)) -> Result<(), StoredFault> {
        self.scan(each).map_err(|e| self.failed(e))
    }

    fn counts(&self) -> (usize, usize) {
        (self.conversations as usize, self.cursors as usize)
    }

    fn fault(&self) -> Option<StoredFault> {
        if !self.faulted.load(Ordering::Acquire) {
            return None;
        }
        self.fault
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// `len` bytes of `source` from `offset`.
fn read_exact<S: ReadAt + ?Sized>(source: &S, offset: u64, len: usize) -> Result<Vec<u8>, CheckpointError> {
    let mut buf = vec![0; len];
    source
        .read_exact_at(&mut buf, offset)
        .map_err(|e| CheckpointError::Read(e.to_string()))?;
    Ok(buf)
}

/// The index's hash of a conversation id: FNV-1a, then a finalizer that
/// spreads it over the low bits the buckets use. Fixed, as it is part of
/// the file.
fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// A user id's length prefix, then cursor, private cursor, join seq, flags, epoch,
/// updated_at.
const MEMBER_MIN_BYTES: usize = 4 + 8 * 3 + 1 + 8 * 2;

/// A conversation's length, its id's length prefix, latest seq and member
/// count.
const RECORD_MIN_BYTES: usize = 4 + 4 + 8 + 4;

const LEFT: u8 = 1;
const LISTED: u8 = 2;
const MEMBERSHIP: u8 = 4;
const MARK: u8 = 8;
const MARK_SEQ: u8 = 16;
/// The delivered cursor is ahead of the cursor, and follows the mark.
const DELIVERED: u8 = 32;
/// Unread mentions follow (a u32 count, then the seqs).
const MENTIONS: u8 = 64;
/// A mute follows (its time and until).
const MUTE: u8 = 128;

fn put_member(out: &mut Vec<u8>, m: &Member) {
    let mut flags = 0;
    for (on, flag) in [
        (m.left, LEFT),
        (m.listed, LISTED),
        (m.membership.is_some(), MEMBERSHIP),
        (m.mark.is_some(), MARK),
        (m.mark.is_some_and(|k| k.seq.is_some()), MARK_SEQ),
        (m.delivered > m.cursor, DELIVERED),
        (!m.mentions.is_empty(), MENTIONS),
        (m.mute.is_some(), MUTE),
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
    if m.delivered > m.cursor {
        out.extend_from_slice(&m.delivered.get().to_le_bytes());
    }
    if !m.mentions.is_empty() {
        out.extend_from_slice(&(m.mentions.len() as u32).to_le_bytes());
        for seq in &m.mentions {
            out.extend_from_slice(&seq.get().to_le_bytes());
        }
    }
    if let Some(mute) = m.mute {
        out.extend_from_slice(&mute.at.to_le_bytes());
        out.extend_from_slice(&mute.until.to_le_bytes());
    }
}

fn take_member(input: &mut &[u8]) -> Result<Member, CheckpointError> {
    let cursor = Seq(take_u64(input)?);
    let private_cursor = Seq(take_u64(input)?);
    let join_seq = Seq(take_u64(input)?);
    let [flags] = take_array::<1>(input)?;
    if flags & MARK_SEQ != 0 && flags & MARK == 0 {
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
    let delivered = if flags & DELIVERED != 0 {
        Seq(take_u64(input)?)
    } else {
        cursor
    };
    let mut mentions = Vec::new();
    if flags & MENTIONS != 0 {
        let count = u32::from_le_bytes(take_array(input)?) as usize;
        // Each takes 8 bytes: a count past what is left is damage.
        if count > input.len() / 8 {
            return Err(CheckpointError::Malformed);
        }
        for _ in 0..count {
            mentions.push(Seq(take_u64(input)?));
        }
    }
    let mute = if flags & MUTE != 0 {
        Some(Mute {
            at: take_i64(input)?,
            until: take_i64(input)?,
        })
    } else {
        None
    };
    Ok(Member {
        cursor,
        delivered,
        mentions,
        mute,
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

fn meta(input: &mut &[u8]) -> Result<CheckpointMeta, CheckpointError> {
    Ok(CheckpointMeta {
        group_id: take_str(input)?.to_owned(),
        public_topic: take_str(input)?.to_owned(),
        state_topic: take_str(input)?.to_owned(),
        partition: i32::from_le_bytes(take_array(input)?),
        partition_count: i32::from_le_bytes(take_array(input)?),
        public_offset: take_i64(input)?,
        state_offset: take_i64(input)?,
        written_at_ms: take_i64(input)?,
        snapshotted_to: Some(take_str(input)?.to_owned()).filter(|store| !store.is_empty()),
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
