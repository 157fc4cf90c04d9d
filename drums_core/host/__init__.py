"""The host under the engine: its prerequisites (:mod:`.doctor`), what Drums left on it
(:mod:`.hoststate`), Linux calls (:mod:`.linux`), processes (:mod:`.procs`), paths resolved inside a
root (:mod:`.safepath`), host-side links (:mod:`.hostnet`) and the desktop images (:mod:`.images`)."""
