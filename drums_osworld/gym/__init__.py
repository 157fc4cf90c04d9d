"""The gymnasium environment (:mod:`.env`): ``gymnasium.make("drums_osworld:drums/Desktop-v0", task=...)``.

Nothing is imported here; ``import drums_osworld`` registers the environment id."""
