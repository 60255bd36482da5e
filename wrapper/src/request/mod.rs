//! What the wrapper decides about a request before any mode runs it: which trigger sent it
//! ([`trigger`]).

pub(crate) mod trigger;
