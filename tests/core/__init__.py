"""Hand-driven tests of the sans-I/O core, under the determinism trap (conftest.py)."""
