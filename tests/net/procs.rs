//! Child processes and network namespaces for the harness.
