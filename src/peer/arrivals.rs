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
//! lags) it reads from disk as before.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;

/// The most landed bytes all of a node's restores keep for their hashers at once.
pub const HOLD_LIMIT: usize = 128 << 20;

/// Landed bytes kept for the hashers, counted across every file of every restore of the node,
/// so what a restore holds in memory is bounded however many files and restores there are.
#[derive(Debug)]
pub struct HoldBudget {
    limit: usize,
    held: AtomicUsize,
    peak: AtomicUsize,
}

impl HoldBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    /// Takes `bytes` from the budget; `false`, taking nothing, when they would pass the limit.
    fn reserve(&self, bytes: usize) -> bool {
        let reserved = self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(bytes).filter(|&total| total <= self.limit)
        });
        match reserved {
            Ok(before) => {
                self.peak.fetch_max(before + bytes, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes kept now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The most bytes kept at once since the budget was made.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
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
    /// Kept bytes by file offset (disjoint), each taken from the budget (given back as they are
    /// taken, and on drop).
    held: BTreeMap<u64, Bytes>,
}

impl State {
    fn held_bytes(&self) -> usize {
        self.held.values().map(Bytes::len).sum()
    }
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
        self.land_bytes_of(offset, length, Vec::new());
    }

    /// Records `frames`, laid end to end from `offset`, as on disk, and keeps their bytes that
    /// lie in the kept ranges while the limit allows.
    pub fn land_bytes(&self, offset: u64, frames: Vec<Bytes>) {
        let length = frames.iter().map(|f| f.len() as u64).sum();
        self.land_bytes_of(offset, length, frames);
    }

    fn land_bytes_of(&self, offset: u64, length: u64, frames: Vec<Bytes>) {
        if length == 0 {
            return;
        }
        let mut state = self.state.lock().expect("arrivals lock");
        if let Some(keep) = &self.keep {
            let mut at = offset;
            for frame in frames {
                let end = at + frame.len() as u64;
                for (start, stop) in within(&keep.ranges, at, end) {
                    if !keep.budget.reserve((stop - start) as usize) {
                        break;
                    }
                    let piece = frame.slice((start - at) as usize..(stop - at) as usize);
                    if let Some(old) = state.held.insert(start, piece) {
                        keep.budget.release(old.len());
                    }
                }
                at = end;
            }
        }
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
        if let Some(keep) = &self.keep {
            keep.budget.release(taken.iter().map(|(_, b)| b.len()).sum());
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

impl Drop for Arrivals {
    /// Bytes no hasher took (a transfer that failed, a hasher that stopped) go back to the budget.
    fn drop(&mut self) {
        if let (Some(keep), Ok(state)) = (&self.keep, self.state.get_mut()) {
            keep.budget.release(state.held_bytes());
        }
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

    #[test]
    fn landed_bytes_in_the_kept_ranges_are_kept_until_taken() {
        // Kept: 10..30 and 40..50; a frame of 0..25 and one of 25..60.
        let budget = HoldBudget::new(HOLD_LIMIT);
        let arrivals = Arrivals::keeping(vec![(10, 20), (40, 10)], budget.clone());
        let bytes: Vec<u8> = (0..60).collect();
        let all = Bytes::from(bytes.clone());
        arrivals.land_bytes(0, vec![all.slice(..25), all.slice(25..)]);
        assert_eq!(arrivals.wait(0, 60), Ok(()), "the whole range landed");
        let kept = |a: &Arrivals| a.state.lock().unwrap().held_bytes();
        assert_eq!(kept(&arrivals), 30, "only the kept ranges' bytes");
        // A range that cuts into kept pieces takes only its share; the rest stays.
        let taken = arrivals.take(15, 45);
        let got: Vec<(u64, Vec<u8>)> = taken.iter().map(|(o, b)| (*o, b.to_vec())).collect();
        assert_eq!(
            got,
            vec![
                (15, bytes[15..25].to_vec()),
                (25, bytes[25..30].to_vec()),
                (40, bytes[40..45].to_vec())
            ]
        );
        assert_eq!(kept(&arrivals), 10);
        assert_eq!(budget.held(), 10, "taken bytes are given back to the budget");
        let rest: Vec<u64> = arrivals.take(0, 60).iter().map(|(o, b)| *o + b.len() as u64).collect();
        assert_eq!(rest, vec![15, 50], "10..15 and 45..50 were left");
        assert!(arrivals.take(0, 60).is_empty(), "taken bytes are gone");
    }

    #[test]
    fn the_files_of_every_restore_keep_no_more_than_the_node_budget_between_them() {
        // Two files (of one restore or of two) and a budget of 100 bytes.
        let budget = HoldBudget::new(100);
        let first = Arrivals::keeping(vec![(0, 1000)], budget.clone());
        let second = Arrivals::keeping(vec![(0, 1000)], budget.clone());
        let frame = Bytes::from(vec![7u8; 60]);
        first.land_bytes(0, vec![frame.clone(), frame.clone()]);
        second.land_bytes(0, vec![frame.clone()]);
        let held = |a: &Arrivals| a.state.lock().unwrap().held_bytes();
        assert_eq!(held(&first), 60, "the second frame would pass the budget");
        assert_eq!(held(&second), 0, "the first file holds what the budget allows");
        assert_eq!(
            first.state.lock().unwrap().landed,
            [(0, 120)],
            "what is not kept still lands"
        );
        assert_eq!(budget.held(), 60);
        // Taken bytes go back to the budget: the other file may keep its next frame.
        assert_eq!(first.take(0, 120).len(), 1);
        assert_eq!(budget.held(), 0);
        second.land_bytes(60, vec![frame.clone()]);
        assert_eq!(held(&second), 60);
        // Bytes nobody took (the transfer failed) go back when the arrivals are dropped.
        drop(second);
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.peak(), 60, "never more than the budget at once");
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
