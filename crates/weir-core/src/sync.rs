//! Locks after a panic: weir's one rule for a lock poisoned by a panic in
//! another task.
//!
//! weir's `std::sync` locks guard short sections that assign whole values
//! (a query's state, a cache entry, a progress list) and call nothing that
//! can fail halfway, so a panic while one was held leaves no value half
//! written. A poisoned lock is therefore taken as it is: the panic is
//! reported once, where it happened, instead of again in every task that
//! touches the lock afterwards (a sink's close, a query's handle).

use std::sync::{LockResult, PoisonError};

/// Takes a lock's guard whether or not a panic poisoned the lock.
pub trait Recover<G> {
    /// The guard, also from a poisoned lock.
    fn recover(self) -> G;
}

impl<G> Recover<G> for LockResult<G> {
    fn recover(self) -> G {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::Recover;

    #[test]
    fn a_lock_poisoned_by_a_panic_gives_its_last_value() {
        let shared = Arc::new(Mutex::new(vec![1]));
        let held = shared.clone();
        let panicked = std::thread::spawn(move || {
            let mut v = held.lock().recover();
            v.push(2);
            panic!("a panic while the lock is held");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.lock().recover(), vec![1, 2]);
    }
}
