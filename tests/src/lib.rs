//! Shared fixtures for end-to-end tests.
