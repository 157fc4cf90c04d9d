"""The per-host daemon ``drumsd``: its socket server and dispatch (:mod:`.server`), what it does
when it starts over the state a dead run left (:mod:`.recovery`), and removing an instance's state
(:mod:`.purge`). Start it with ``python -m drums_core.daemon --instance NAME`` (the client does)."""
