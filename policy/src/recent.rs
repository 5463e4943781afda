//! The last few values a process computed from pure inputs, kept to be
//! handed out again (compiled pattern sets, parsed manifests): a bounded
//! list, most recent first, behind a mutex.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// At most `max` entries, most recent first.
#[derive(Debug)]
pub(crate) struct Recent<T> {
    kept: Mutex<VecDeque<T>>,
    max: usize,
}

impl<T> Recent<T> {
    pub(crate) const fn new(max: usize) -> Self {
        Self {
            kept: Mutex::new(VecDeque::new()),
            max,
        }
    }

    fn kept(&self) -> MutexGuard<'_, VecDeque<T>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The first answer `hit` gives for a kept entry.
    pub(crate) fn find<R>(&self, hit: impl Fn(&T) -> Option<R>) -> Option<R> {
        self.kept().iter().find_map(hit)
    }

    /// Keeps `entry` first, dropping the oldest beyond the bound.
    pub(crate) fn keep(&self, entry: T) {
        let mut kept = self.kept();
        kept.push_front(entry);
        kept.truncate(self.max);
    }
}
