"""Desktops over a Ray cluster: the pool that maps rollouts onto nodes (:mod:`.pool`), the per-node
actor (:mod:`.node`) and a local cluster for one machine (:mod:`.local`). Needs ``ray`` (extra ``ray``)."""
