"""The gymnasium environment (:mod:`.env`): ``gymnasium.make("drums_osworld:drums/Desktop-v0", task=...)``.

Its parts: :mod:`.spaces` (the observation and action spaces), :mod:`.states` (the states an env
saves and who deletes them), :mod:`.desktops` (booting, restoring and destroying its desktops),
:mod:`.task_setup` (the task's setup and its report).

Nothing is imported here; ``import drums_osworld`` registers the environment id."""
