//! Receives an uploaded image archive in chunks, verifies it and pushes it into an OCI registry

pub mod fetch;
pub mod pipeline;
