"""Drums engine: checkpointable Linux desktop sessions (the lead fills in the public API)."""
