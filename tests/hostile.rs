//! Tests: hostile.
