//! Tools: the built-in catalog (names, argument schemas, safety flags).

pub mod builtin;
