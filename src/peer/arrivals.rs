//! Which byte ranges of a staged file have landed, so the registry check can hash a part while
//! the rest of the file is still arriving. A part's digest is one SHA-256 over its bytes in
//! order: hashing it after the transfer costs one core the whole file's hash time while the
//! other idles; hashing behind the transfer hides most of it.
//!
//! Writers record each range once it is on disk (or left a hole, which reads back as zeros);
//! the hashing threads wait for the range they read next. The transfer's end settles every
//! wait: [`Arrivals::finish`] lets the hashers read what is there (a range the peer never sent
//! reads as zeros and fails its digest), [`Arrivals::abort`] stops them.
//!
//! The landed bytes themselves are kept too, within the node's [`HoldBudget`], until the hasher
//! takes them: reading a file back from the page cache costs a copy of every byte, which on a
//! busy node is a large share of a restore's CPU. Only bytes some digest covers are kept (the
//! registry's data segments of the file); what is not kept (the budget spent while a hasher
//! lags) it reads from disk as before. Kept bytes only ever live in [`ChunkBuffer`]s taken from
//! the budget, which counts each buffer's whole allocation until the last piece kept of it is
//! gone: a kept piece can pin no memory the budget does not count.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;

/// The most memory all of a node's restores hold for their hashers at once.
pub const HOLD_LIMIT: usize = 128 << 20;

/// Memory holding landed bytes for the hashers, counted across every file of every restore of
/// the node, so what a restore holds is bounded however many files and restores there are.
#[derive(Debug)]
pub struct HoldBudget {
    limit: usize,
    held: AtomicUsize,
    peak: AtomicUsize,
    spares: Mutex<Spares>,
}

/// Buffers given back while a restore uses the budget, still counted, reused before any new one
/// is allocated: a fresh buffer's pages fault in one by one, which over a restore's gigabyte
/// costs more CPU than the copies into them. With the user count under the same lock, a buffer
/// given back after the last user left is freed, never kept counted while nothing runs.
#[derive(Debug, Default)]
struct Spares {
    buffers: Vec<Vec<u8>>,
    /// Restores using the budget now ([`HoldBudget::enter`]).
    users: usize,
}

/// A restore's use of a [`HoldBudget`]; when the last one drops, the spare buffers are freed.
#[derive(Debug)]
pub struct BudgetUse(Arc<HoldBudget>);

impl Drop for BudgetUse {
    fn drop(&mut self) {
        let mut spares = self.0.spares_locked();
        spares.users -= 1;
        if spares.users == 0 {
            let freed: usize = spares.buffers.drain(..).map(|b| b.capacity()).sum();
            self.0.held.fetch_sub(freed, Ordering::AcqRel);
        }
    }
}

impl HoldBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            spares: Mutex::default(),
        })
    }

    /// Marks a restore as using the budget until the returned guard drops.
    pub fn enter(self: &Arc<Self>) -> BudgetUse {
        self.spares_locked().users += 1;
        BudgetUse(self.clone())
    }

    /// A buffer of `capacity` bytes counted against the budget until it is freed (given back
    /// while no restore uses the budget, or when the last one stops); `None`, taking nothing,
    /// when it would pass the limit.
    pub fn buffer(self: &Arc<Self>, capacity: usize) -> Option<ChunkBuffer> {
        let spare = self.spares_locked().buffers.pop();
        let bytes = match spare {
            Some(bytes) if bytes.capacity() == capacity => bytes,
            other => {
                // A spare of another size (only tests mix sizes) makes room for this one.
                if let Some(bytes) = other {
                    self.held.fetch_sub(bytes.capacity(), Ordering::AcqRel);
                }
                let reserved = self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    held.checked_add(capacity).filter(|&total| total <= self.limit)
                });
                let before = reserved.ok()?;
                self.peak.fetch_max(before + capacity, Ordering::Relaxed);
                Vec::with_capacity(capacity)
            }
        };
        Some(ChunkBuffer {
            bytes,
            budget: Some(self.clone()),
        })
    }

    fn spares_locked(&self) -> std::sync::MutexGuard<'_, Spares> {
        self.spares.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bytes counted now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The most bytes counted at once since the budget was made.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// A fixed-capacity buffer for one chunk of a staged file. One from a [`HoldBudget`] goes back
/// to it when it drops (after the write when nothing of it is kept, or once the hasher has taken
/// every kept piece of it), as a spare while a restore uses the budget.
#[derive(Debug)]
pub struct ChunkBuffer {
    bytes: Vec<u8>,
    budget: Option<Arc<HoldBudget>>,
}

impl ChunkBuffer {
    /// A buffer no budget counts; its bytes are never kept.
    pub fn uncounted(capacity: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(capacity),
            budget: None,
        }
    }

    /// Copies as much of `from` as fits; how many bytes that was.
    pub fn fill(&mut self, from: &[u8]) -> usize {
        let n = from.len().min(self.bytes.capacity() - self.bytes.len());
        self.bytes.extend_from_slice(&from[..n]);
        n
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.bytes.len() == self.bytes.capacity()
    }

    /// Empties the buffer for the next chunk.
    pub fn clear(&mut self) {
        self.bytes.clear();
    }

    /// Whether a budget counts this buffer (only then are its bytes kept).
    pub fn is_counted(&self) -> bool {
        self.budget.is_some()
    }
}

impl AsRef<[u8]> for ChunkBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for ChunkBuffer {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            let mut bytes = std::mem::take(&mut self.bytes);
            let mut spares = budget.spares_locked();
            if spares.users > 0 {
                bytes.clear();
                spares.buffers.push(bytes);
            } else {
                budget.held.fetch_sub(bytes.capacity(), Ordering::AcqRel);
            }
        }
    }
}

/// The landed ranges of one staged file, and landed bytes its hasher has yet to take.
#[derive(Debug, Default)]
pub struct Arrivals {
    state: Mutex<State>,
    changed: Condvar,
    /// Which landed bytes are kept, and what they count against; none by default.
    keep: Option<Keep>,
}

#[derive(Debug)]
struct Keep {
    /// The `(offset, length)` ranges whose bytes are kept (sorted, disjoint).
    ranges: Vec<(u64, u64)>,
    budget: Arc<HoldBudget>,
}

#[derive(Debug, Default)]
struct State {
    /// Sorted, non-overlapping, non-adjacent `(start, end)` ranges.
    landed: Vec<(u64, u64)>,
    end: Option<End>,
    /// Kept bytes by file offset (disjoint), each a piece of a [`ChunkBuffer`] the budget counts
    /// until its last piece is taken (or dropped with the arrivals).
    held: BTreeMap<u64, Bytes>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The transfer is over: the file holds all it will.
    Finished,
    /// The transfer failed: nothing more will land and nobody wants the result.
    Aborted,
}

/// The transfer failed before the range arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aborted;

impl Arrivals {
    /// Arrivals that keep the landed bytes of `ranges` (`(offset, length)`, sorted, disjoint) for
    /// [`Self::take`], as far as `budget` allows.
    pub fn keeping(ranges: Vec<(u64, u64)>, budget: Arc<HoldBudget>) -> Self {
        Self {
            state: Mutex::default(),
            changed: Condvar::new(),
            keep: Some(Keep { ranges, budget }),
        }
    }

    /// Records `[offset, offset + length)` as on disk.
    pub fn land(&self, offset: u64, length: u64) {
        self.record(offset, length, Vec::new());
    }

    /// A buffer for the next chunk of the file, counted against the node's budget so its bytes
    /// can be kept ([`Self::land_chunk`]); `None` when the file keeps nothing or the budget is
    /// spent.
    pub fn buffer(&self, capacity: usize) -> Option<ChunkBuffer> {
        self.keep.as_ref()?.budget.buffer(capacity)
    }

    /// Records `chunk`'s bytes as on disk from `offset`, and keeps those in the kept ranges when
    /// the chunk came from [`Self::buffer`]. The buffer goes back to the budget once no piece
    /// of it is kept.
    pub fn land_chunk(&self, offset: u64, chunk: ChunkBuffer) {
        let length = chunk.len() as u64;
        let kept: Vec<(u64, Bytes)> = match &self.keep {
            Some(keep) if chunk.is_counted() => {
                let bytes = Bytes::from_owner(chunk);
                within(&keep.ranges, offset, offset + length)
                    .map(|(start, stop)| (start, bytes.slice((start - offset) as usize..(stop - offset) as usize)))
                    .collect()
            }
            _ => Vec::new(),
        };
        self.record(offset, length, kept);
    }

    /// Marks `[offset, offset + length)` landed with its `kept` pieces, and wakes the waiters.
    fn record(&self, offset: u64, length: u64, kept: Vec<(u64, Bytes)>) {
        if length == 0 {
            return;
        }
        let mut state = self.state.lock().expect("arrivals lock");
        state.held.extend(kept);
        merge(&mut state.landed, (offset, offset + length));
        drop(state);
        self.changed.notify_all();
    }

    /// Removes and returns the kept bytes within `[start, end)`, in order, each with its offset;
    /// the parts of kept pieces outside the range stay kept. The caller reads the gaps from disk.
    pub fn take(&self, start: u64, end: u64) -> Vec<(u64, Bytes)> {
        let mut state = self.state.lock().expect("arrivals lock");
        let first = match state.held.range(..start).next_back() {
            Some((&at, piece)) if at + piece.len() as u64 > start => at,
            _ => start,
        };
        let keys: Vec<u64> = state.held.range(first..end).map(|(&at, _)| at).collect();
        let mut taken = Vec::with_capacity(keys.len());
        for at in keys {
            let piece = state.held.remove(&at).expect("listed above");
            let stop = at + piece.len() as u64;
            let (from, to) = (at.max(start), stop.min(end));
            if at < from {
                state.held.insert(at, piece.slice(..(from - at) as usize));
            }
            if to < stop {
                state.held.insert(to, piece.slice((to - at) as usize..));
            }
            taken.push((from, piece.slice((from - at) as usize..(to - at) as usize)));
        }
        taken
    }

    /// Blocks until `[offset, offset + length)` has landed or the transfer ended; `Err` when it
    /// was aborted first.
    pub fn wait(&self, offset: u64, length: u64) -> Result<(), Aborted> {
        let mut state = self.state.lock().expect("arrivals lock");
        loop {
            match state.end {
                Some(End::Aborted) => return Err(Aborted),
                Some(End::Finished) => return Ok(()),
                None if covered(&state.landed, offset, offset + length) => return Ok(()),
                None => state = self.changed.wait(state).expect("arrivals lock"),
            }
        }
    }

    /// Every transfer of the file completed.
    pub fn finish(&self) {
        self.end(End::Finished);
    }

    /// A transfer of the file failed.
    pub fn abort(&self) {
        self.end(End::Aborted);
    }

    fn end(&self, end: End) {
        let mut state = self.state.lock().expect("arrivals lock");
        state.end.get_or_insert(end);
        drop(state);
        self.changed.notify_all();
    }
}

fn merge(landed: &mut Vec<(u64, u64)>, (mut start, mut end): (u64, u64)) {
    // Ranges that touch or overlap the new one are folded into it.
    let first = landed.partition_point(|&(_, e)| e < start);
    let mut last = first;
    while last < landed.len() && landed[last].0 <= end {
        start = start.min(landed[last].0);
        end = end.max(landed[last].1);
        last += 1;
    }
    landed.splice(first..last, [(start, end)]);
}

/// The parts of `[start, end)` inside `ranges` (`(offset, length)`, sorted, disjoint), as
/// `(start, end)` pairs.
fn within(ranges: &[(u64, u64)], start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let first = ranges.partition_point(|&(o, l)| o + l <= start);
    ranges[first..]
        .iter()
        .take_while(move |&&(o, _)| o < end)
        .map(move |&(o, l)| (o.max(start), (o + l).min(end)))
}

fn covered(landed: &[(u64, u64)], start: u64, end: u64) -> bool {
    let i = landed.partition_point(|&(_, e)| e < end);
    landed.get(i).is_some_and(|&(s, e)| s <= start && end <= e)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn ranges_merge_and_a_wait_returns_once_its_range_is_whole() {
        let arrivals = Arrivals::default();
        arrivals.land(10, 10);
        arrivals.land(30, 10);
        arrivals.land(0, 5);
        assert_eq!(arrivals.state.lock().unwrap().landed, [(0, 5), (10, 20), (30, 40)]);
        arrivals.land(20, 10);
        arrivals.land(5, 5);
        assert_eq!(arrivals.state.lock().unwrap().landed, [(0, 40)]);
        assert_eq!(arrivals.wait(12, 28), Ok(()));
        arrivals.land(50, 10);
        assert!(
            !covered(&arrivals.state.lock().unwrap().landed, 35, 55),
            "a gap at 40..50"
        );
    }

    #[test]
    fn a_waiter_wakes_when_its_range_lands_and_an_abort_stops_the_rest() {
        let arrivals = Arc::new(Arrivals::default());
        let waiter = {
            let a = arrivals.clone();
            std::thread::spawn(move || a.wait(4096, 4096))
        };
        arrivals.land(0, 4096);
        arrivals.land(4096, 4096);
        assert_eq!(waiter.join().unwrap(), Ok(()));
        let stopped = {
            let a = arrivals.clone();
            std::thread::spawn(move || a.wait(1 << 20, 1))
        };
        arrivals.abort();
        assert_eq!(stopped.join().unwrap(), Err(Aborted));
        arrivals.finish();
        assert_eq!(arrivals.wait(1 << 30, 1), Err(Aborted), "the first end stands");
    }

    /// A chunk of `bytes` in a buffer from `arrivals`' budget.
    fn chunk_of(arrivals: &Arrivals, bytes: &[u8]) -> ChunkBuffer {
        let mut chunk = arrivals.buffer(bytes.len()).expect("the budget has room");
        assert_eq!(chunk.fill(bytes), bytes.len());
        chunk
    }

    fn kept_bytes(arrivals: &Arrivals) -> usize {
        arrivals.state.lock().unwrap().held.values().map(Bytes::len).sum()
    }

    #[test]
    fn landed_bytes_in_the_kept_ranges_are_kept_until_taken() {
        // Kept: 10..30 and 40..50 of a chunk of 0..60.
        let budget = HoldBudget::new(HOLD_LIMIT);
        let restore = budget.enter();
        let arrivals = Arrivals::keeping(vec![(10, 20), (40, 10)], budget.clone());
        let bytes: Vec<u8> = (0..60).collect();
        arrivals.land_chunk(0, chunk_of(&arrivals, &bytes));
        assert_eq!(arrivals.wait(0, 60), Ok(()), "the whole range landed");
        assert_eq!(kept_bytes(&arrivals), 30, "only the kept ranges' bytes");
        assert_eq!(budget.held(), 60, "a kept piece counts the whole buffer it pins");
        // A range that cuts into kept pieces takes only its share; the rest stays.
        let taken = arrivals.take(15, 45);
        let got: Vec<(u64, Vec<u8>)> = taken.iter().map(|(o, b)| (*o, b.to_vec())).collect();
        assert_eq!(got, vec![(15, bytes[15..30].to_vec()), (40, bytes[40..45].to_vec())]);
        assert_eq!(kept_bytes(&arrivals), 10);
        drop(taken);
        assert_eq!(budget.held(), 60, "the pieces left still pin the buffer");
        let rest: Vec<u64> = arrivals.take(0, 60).iter().map(|(o, b)| *o + b.len() as u64).collect();
        assert_eq!(rest, vec![15, 50], "10..15 and 45..50 were left");
        assert!(arrivals.take(0, 60).is_empty(), "taken bytes are gone");
        assert_eq!(
            budget.spares_locked().buffers.len(),
            1,
            "the buffer went back once its last piece was hashed"
        );
        assert_eq!(budget.held(), 60, "a spare stays counted");
        drop(restore);
        assert_eq!(budget.held(), 0, "and is freed when the restore ends");
    }

    #[test]
    fn the_files_of_every_restore_hold_no_more_than_the_node_budget_between_them() {
        // Two files (of one restore or of two) and a budget of 100 bytes.
        let budget = HoldBudget::new(100);
        let (restore, other_restore) = (budget.enter(), budget.enter());
        let first = Arrivals::keeping(vec![(0, 1000)], budget.clone());
        let second = Arrivals::keeping(vec![(0, 1000)], budget.clone());
        first.land_chunk(0, chunk_of(&first, &[7; 60]));
        assert!(second.buffer(60).is_none(), "a second buffer would pass the budget");
        // Its writer lands the chunk from a buffer of its own, which nothing keeps.
        let mut own = ChunkBuffer::uncounted(60);
        own.fill(&[7; 60]);
        second.land_chunk(0, own);
        assert_eq!(kept_bytes(&second), 0);
        assert_eq!(
            second.state.lock().unwrap().landed,
            [(0, 60)],
            "what is not kept still lands"
        );
        assert_eq!(budget.held(), 60);
        // A buffer whose bytes were taken goes back to the budget: the other file reuses it.
        assert_eq!(first.take(0, 60).len(), 1);
        second.land_chunk(60, chunk_of(&second, &[7; 60]));
        assert_eq!(kept_bytes(&second), 60);
        assert_eq!(budget.held(), 60);
        // Bytes nobody took (the transfer failed) go back when the arrivals are dropped.
        drop(second);
        assert_eq!(budget.spares_locked().buffers.len(), 1);
        drop(restore);
        assert_eq!(budget.held(), 60, "spares are kept while a restore runs");
        drop(other_restore);
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.peak(), 60, "never more than the budget at once");
    }

    #[test]
    fn a_buffer_given_back_after_the_last_restore_ended_is_freed() {
        // A hasher that lets go of its kept bytes only after its restore returned (it was still
        // settling a failed transfer) must not leave their buffer counted with nothing to use it.
        let budget = HoldBudget::new(HOLD_LIMIT);
        let restore = budget.enter();
        let arrivals = Arrivals::keeping(vec![(0, 100)], budget.clone());
        arrivals.land_chunk(0, chunk_of(&arrivals, &[1; 100]));
        drop(restore);
        assert_eq!(budget.held(), 100, "its bytes are still kept");
        drop(arrivals);
        assert_eq!(budget.held(), 0);
        assert!(budget.spares_locked().buffers.is_empty());
    }

    #[test]
    fn a_finished_transfer_releases_a_wait_for_a_range_never_sent() {
        let arrivals = Arc::new(Arrivals::default());
        let waiter = {
            let a = arrivals.clone();
            std::thread::spawn(move || a.wait(0, 100))
        };
        arrivals.finish();
        assert_eq!(waiter.join().unwrap(), Ok(()));
    }
}
