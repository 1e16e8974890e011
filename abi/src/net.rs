//! The `ncclNet_vN` plugin ABI types, one file per version under `net/`.
//!
//! Filled in by the net-plugin work (issue 4).
