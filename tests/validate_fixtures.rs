//! Tests: validate_fixtures.
