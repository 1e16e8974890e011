//! Shared foundations of hetccl: [`config`] and [`obs`].

pub mod config;
pub mod obs;
