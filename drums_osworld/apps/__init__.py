"""Programs over the adapters: the demo (``python -m drums_osworld.apps.demo``), scripted rollouts of a
saved state (``drums rollouts``, :mod:`.rollouts`) and an OSWorld script run on Drums (:mod:`.run`)."""
