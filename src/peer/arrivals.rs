//! Which byte ranges of a staged file have landed, so the registry check can hash a part while
//! the rest of the file is still arriving. A part's digest is one SHA-256 over its bytes in
//! order: hashing it after the transfer costs one core the whole file's hash time while the
//! other idles; hashing behind the transfer hides most of it.
//!
//! Writers record each range once it is on disk (or left a hole, which reads back as zeros);
//! the hashing threads wait for the range they read next. The transfer's end settles every
//! wait: [`Arrivals::finish`] lets the hashers read what is there (a range the peer never sent
//! reads as zeros and fails its digest), [`Arrivals::abort`] stops them.

use std::sync::{Condvar, Mutex};

/// The landed ranges of one staged file.
#[derive(Debug, Default)]
pub struct Arrivals {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Sorted, non-overlapping, non-adjacent `(start, end)` ranges.
    landed: Vec<(u64, u64)>,
    end: Option<End>,
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
    /// Records `[offset, offset + length)` as on disk.
    pub fn land(&self, offset: u64, length: u64) {
        if length == 0 {
            return;
        }
        let mut state = self.state.lock().expect("arrivals lock");
        merge(&mut state.landed, (offset, offset + length));
        drop(state);
        self.changed.notify_all();
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
