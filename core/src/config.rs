//! The typed configuration (placeholder).
