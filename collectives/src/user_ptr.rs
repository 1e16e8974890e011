//! The one type for addresses in the caller's memory.
//!
//! NCCL's contract for every buffer, stream and output slot a caller passes:
//! the memory stays valid, and the caller does not touch it, from the call
//! until the operation completes (the call returns, its stream passes it,
//! the outermost `ncclGroupEnd` returns, or `ncclCommGetAsyncError` stops
//! saying `ncclInProgress`), whichever thread runs the operation meanwhile.
//! [`UserPtr`] carries such an address across threads under that contract,
//! stated once here, instead of each struct that holds one claiming `Send`.
//! Dereferencing it stays `unsafe`, with the range and the moment justified
//! where it happens.

use std::ffi::c_void;

/// An address in the caller's memory (a buffer, a stream, an output slot),
/// under NCCL's contract (module docs). It may be NULL where the call
/// allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UserPtr(*mut c_void);

// SAFETY: a UserPtr is only an address; the memory behind it belongs to
// the caller, who keeps it valid and leaves it alone until the operation
// completes, on whichever thread the operation runs (NCCL's contract). No
// Rust owner shares it, so moving the address to another thread cannot
// race with anything hetccl does.
unsafe impl Send for UserPtr {}
// SAFETY: as above; a shared UserPtr only hands out its address.
unsafe impl Sync for UserPtr {}

impl UserPtr {
    /// NULL.
    pub const NULL: UserPtr = UserPtr(std::ptr::null_mut());

    /// Wraps an address the caller passed.
    pub fn new<T>(p: *const T) -> Self {
        Self(p.cast_mut().cast())
    }

    /// The address as a pointer.
    pub fn get(self) -> *mut c_void {
        self.0
    }

    /// The address as a byte pointer.
    pub fn bytes(self) -> *mut u8 {
        self.0.cast()
    }

    /// The address as a number.
    pub fn addr(self) -> usize {
        self.0 as usize
    }

    /// Whether it is NULL.
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

impl Default for UserPtr {
    fn default() -> Self {
        Self::NULL
    }
}
