//! Which thread is inside an operation on a communicator.
//!
//! NCCL forbids two threads from using one communicator at once: their
//! operations would be matched with the peers' in an order nobody chose,
//! and results silently mixed. A thread entering an operation claims the
//! communicator; a second thread that finds it claimed gets
//! `ncclInvalidUsage` instead of running. Inside a group the claim lasts
//! until the outermost `ncclGroupEnd`. The claim is one compare-and-swap on
//! a word the call touches anyway, so the single-thread path does not pay
//! for it measurably.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// A small number naming the calling thread (never 0).
fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: Cell<u64> = const { Cell::new(0) };
    }
    TOKEN.with(|t| {
        if t.get() == 0 {
            t.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// The thread inside an operation on a communicator, if any.
#[derive(Debug, Default)]
pub struct Owner(AtomicU64);

/// A held claim; dropping it releases the communicator unless the thread
/// held it already (nested use, or a group still open).
#[derive(Debug)]
pub struct Claim<'a> {
    owner: &'a Owner,
    fresh: bool,
}

impl Owner {
    /// Claims the communicator for the calling thread; `who` names it in
    /// the error a second thread gets.
    pub fn claim(&self, who: impl FnOnce() -> String) -> Result<Claim<'_>> {
        let me = thread_token();
        // Only this thread stores its own token, so a plain load that sees
        // it is a claim this thread already holds (nested, or a group's).
        if self.0.load(Ordering::Relaxed) == me {
            return Ok(Claim {
                owner: self,
                fresh: false,
            });
        }
        match self
            .0
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Ok(Claim {
                owner: self,
                fresh: true,
            }),
            Err(t) if t == me => Ok(Claim {
                owner: self,
                fresh: false,
            }),
            Err(_) => Err(Error::usage(format!(
                "{} is in use by another thread: NCCL does not allow one communicator \
                 to be used by two threads at once",
                who()
            ))),
        }
    }

    /// Releases a claim kept with [`Claim::keep`].
    pub fn release(&self) {
        self.0.store(0, Ordering::Release);
    }
}

impl Claim<'_> {
    /// Whether this claim took the communicator (it was free).
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// Keeps the communicator claimed after this guard is gone; the caller
    /// releases it later with [`Owner::release`].
    pub fn keep(mut self) {
        self.fresh = false;
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.fresh {
            self.owner.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_thread_is_refused_and_the_owner_may_nest() {
        let o = Owner::default();
        let c = o.claim(|| "comm".into()).unwrap();
        assert!(c.is_fresh());
        assert!(
            !o.claim(|| "comm".into()).unwrap().is_fresh(),
            "nested on one thread"
        );
        std::thread::scope(|s| {
            let e = s
                .spawn(|| o.claim(|| "comm 1234".into()).unwrap_err())
                .join()
                .unwrap();
            assert!(
                e.to_string()
                    .contains("comm 1234 is in use by another thread"),
                "{e}"
            );
        });
        drop(c);
        std::thread::scope(|s| {
            s.spawn(|| o.claim(|| "comm".into()).map(drop))
                .join()
                .unwrap()
                .unwrap();
        });
        let kept = o.claim(|| "comm".into()).unwrap();
        kept.keep();
        std::thread::scope(|s| {
            assert!(s
                .spawn(|| o.claim(|| "comm".into()).is_err())
                .join()
                .unwrap());
        });
        o.release();
        std::thread::scope(|s| {
            assert!(s
                .spawn(|| o.claim(|| "comm".into()).is_ok())
                .join()
                .unwrap());
        });
    }
}
