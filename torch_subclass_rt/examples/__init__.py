"""Small, documented subclasses that use opaque attrs (used by the CLI and benchmarks)."""
