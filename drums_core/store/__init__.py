"""Snapshots at rest: the snapshot tracker and store (:mod:`.snapshots`), the store's budget and
evictions (:mod:`.budget`), and moving snapshots between hosts (:mod:`.transfer`)."""
