//! hetccl's network transports and the NCCL net-plugin adapters.
//!
//! Filled in by the net-plugin work (issue 4).
