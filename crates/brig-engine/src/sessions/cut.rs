//! Keeping a session's files still while a snapshot copies them.
//!
//! The freezer stops the session's processes, but the daemon's files API writes
//! into the session from outside. A copy made while an upload renames files into
//! place would be a torn moment of the session, and would depend on timing the
//! tenant controls. So the two exclude each other: a change announces itself and
//! then looks for a copy; a copy announces itself and then waits for the changes
//! under way to end. With both flags sequentially consistent, at least one side
//! sees the other, so a change never runs during a copy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a copy looks whether the changes under way have ended.
const POLL: Duration = Duration::from_millis(5);

#[derive(Debug, Default)]
pub struct Cut {
    copying: AtomicBool,
    changing: AtomicU64,
}

/// A change through the files API, under way while held.
#[must_use]
pub struct Changing<'a>(&'a Cut);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        self.0.changing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A snapshot's copy, under way while held: changes are refused.
#[must_use]
pub struct Copying<'a>(&'a Cut);

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.0.copying.store(false, Ordering::SeqCst);
    }
}

impl Cut {
    /// Starts a change, unless a copy is under way.
    pub fn begin_change(&self) -> Option<Changing<'_>> {
        self.changing.fetch_add(1, Ordering::SeqCst);
        let change = Changing(self);
        (!self.copying.load(Ordering::SeqCst)).then_some(change)
    }

    /// Starts a copy: refuses new changes at once, then waits up to `wait` for the
    /// ones under way to end (`None` if they do not; new changes are then allowed
    /// again). Only one copy runs at a time: the session's gate serializes them.
    pub async fn begin_copy(&self, wait: Duration) -> Option<Copying<'_>> {
        self.copying.store(true, Ordering::SeqCst);
        let copying = Copying(self);
        let deadline = Instant::now() + wait;
        while self.changing.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
        Some(copying)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_is_refused_while_a_copy_is_under_way() {
        let cut = Cut::default();
        let copying = cut
            .begin_copy(Duration::ZERO)
            .await
            .expect("nothing changes");
        assert!(cut.begin_change().is_none());
        drop(copying);
        assert!(cut.begin_change().is_some());
    }

    #[tokio::test]
    async fn a_copy_waits_for_the_changes_under_way_and_gives_up_in_time() {
        let cut = Cut::default();
        let change = cut.begin_change().expect("no copy");
        assert!(cut.begin_copy(Duration::from_millis(20)).await.is_none());
        // Given up: changes are allowed again.
        let second = cut.begin_change().expect("the copy gave up");
        drop((change, second));
        assert!(cut.begin_copy(Duration::ZERO).await.is_some());
    }
}
