"""Durable runs: the store protocol, the in-memory and SQLite stores, checkpoints,
resume and review."""
