//! The messages a message link (TCP, verbs) has in flight in one
//! direction: the executor's current one and at most one posted ahead
//! ([`super::SendLink::post_ahead`]), oldest first, each with the range it
//! moves and its transport state.

use std::collections::VecDeque;

use crate::error::{Error, Result};

/// Messages in flight per direction: the current one and the next.
const WINDOW: usize = 2;

/// A link direction's posted messages, oldest first.
#[derive(Debug)]
pub(crate) struct Window<R> {
    q: VecDeque<(usize, usize, R)>,
}

impl<R> Default for Window<R> {
    fn default() -> Self {
        Self { q: VecDeque::new() }
    }
}

impl<R: Copy> Window<R> {
    /// The state of the oldest posted message, which must move `len`
    /// bytes at `ptr`; `None` when nothing is posted. A message in flight
    /// over another range means an abandoned operation, which poisons the
    /// communicator, so this fails only on a poisoned one; `what` (such as
    /// "tcp: a send") names it in the error.
    pub(crate) fn head(&self, what: &str, ptr: usize, len: usize) -> Result<Option<R>> {
        match self.q.front() {
            None => Ok(None),
            Some(&(a, l, r)) if (a, l) == (ptr, len) => Ok(Some(r)),
            Some(&(a, l, _)) => Err(Error::Internal(
                format!("{what} of {l} B at {a:#x} is in flight; asked for {len} B at {ptr:#x}")
                    .into(),
            )),
        }
    }

    /// Whether a message may be posted ahead now: one is in flight and
    /// the window has room.
    pub(crate) fn room_ahead(&self) -> bool {
        !self.q.is_empty() && self.q.len() < WINDOW
    }

    /// Whether nothing is posted.
    pub(crate) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Records a message posted behind the others.
    pub(crate) fn push(&mut self, ptr: usize, len: usize, r: R) {
        self.q.push_back((ptr, len, r));
    }

    /// Drops the oldest message, once complete.
    pub(crate) fn pop(&mut self) {
        self.q.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_must_be_the_range_asked_for_and_one_goes_ahead() {
        let mut w = Window::default();
        assert_eq!(w.head("x: a send", 16, 8).unwrap(), None);
        assert!(!w.room_ahead(), "nothing to post ahead of");
        w.push(16, 8, 'a');
        assert!(w.room_ahead());
        w.push(64, 4, 'b');
        assert!(!w.room_ahead(), "two in flight at most");
        assert_eq!(w.head("x: a send", 16, 8).unwrap(), Some('a'));
        let e = w.head("x: a send", 64, 4).unwrap_err().to_string();
        assert!(e.contains("x: a send of 8 B at 0x10 is in flight"), "{e}");
        w.pop();
        assert_eq!(w.head("x: a send", 64, 4).unwrap(), Some('b'));
        w.pop();
        assert!(w.is_empty());
    }
}
