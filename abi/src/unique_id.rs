//! `ncclUniqueId`.

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ncclUniqueId {
    /// The bytes; their meaning is the library's own.
    pub internal: [u8; NCCL_UNIQUE_ID_BYTES],
}

impl Default for ncclUniqueId {
    fn default() -> Self {
        Self {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        }
    }
}

impl core::fmt::Debug for ncclUniqueId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print the secret part of an id.
        write!(f, "ncclUniqueId({:02x?}..)", &self.internal[..8])
    }
}
