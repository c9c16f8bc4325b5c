//! Deny evidence: the packets the enforcement table drops, read from their NFLOG group.
