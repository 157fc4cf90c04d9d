"""One desktop session and what makes it: the :class:`~.supervisor.Supervisor` (create, checkpoint,
restore, branch, destroy), the restore steps, the session init (:mod:`.init`) and launcher, containment
(user namespace, cgroups, seccomp), the overlay root, the display, the session's processes, CRIU, its
network (netns, policy, NAT), the fault windows and the sharing audit.

Nothing is imported here: ``python -m drums_core.session.init`` runs inside every session on the
image's own Python."""
