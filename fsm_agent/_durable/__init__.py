"""Durable runs: the store protocol, the in-memory, SQLite and PostgreSQL stores, owners and
leases, resume and review. The public names are in :mod:`fsm_agent.stores`."""
