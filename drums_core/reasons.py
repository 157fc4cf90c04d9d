"""The registry of reasons: every ``reason`` code a :class:`~drums_core.errors.DrumsError` carries.

A reason is a :class:`Reason` member: a ``str`` (an :class:`enum.StrEnum`) equal to its code, so
``exc.reason == Reason.SESSION_DIED`` and ``exc.reason == "SESSION_DIED"`` both hold, and it
prints, formats and serialises (``json.dumps``, the daemon's wire, ``--json``) as the plain code.
Errors rebuilt from the wire (:func:`drums_core.errors.from_wire`) carry the plain string; compare
with ``==``, not ``is``.

Each member says what it means (``meaning``), whether the same call may succeed if tried again
(``retry``, a :class:`Retry`) and, where it is not obvious, what has to change first (``until``);
``raised_as`` names the error classes it is raised with. ``note`` marks a code no module of Drums
raises itself (one only clients or tests use); every other code is raised somewhere
(tests/unit/test_reasons.py checks both, and that README.md's table is :func:`markdown`'s)::

    python -m drums_core.reasons --markdown     # the README's table of reasons

This module imports nothing of Drums: :mod:`drums_core.errors` (the bottom of the engine) imports it.
"""
from __future__ import annotations

import enum
import sys

__all__ = ["Reason", "Retry", "markdown"]


class Retry(enum.StrEnum):
    """Whether the call that failed may succeed if made again."""

    RETRY = "retry"        # transient: the same call may succeed now or after a short wait
    NO = "no"              # the same call fails again until something changes (``until`` says what)
    BROKEN = "no, broken"  # maybe partly applied; the session or snapshot is marked broken: use another


R, N, B = Retry.RETRY, Retry.NO, Retry.BROKEN


class Reason(enum.StrEnum):
    """A stable reason code. Each member is ``CODE = code, retry, raised_as, meaning``, or with
    ``(meaning, until[, note])`` in place of ``meaning``."""

    meaning: str
    retry: Retry
    raised_as: tuple[str, ...]
    until: str
    note: str

    def __new__(cls, code: str, retry: Retry, raised_as: str, text: str | tuple[str, ...]) -> Reason:
        meaning, until, note = (*((text,) if isinstance(text, str) else text), "", "")[:3]
        member = str.__new__(cls, code)
        member._value_ = code
        member.retry = retry
        member.raised_as = tuple(raised_as.split())
        member.meaning = meaning
        member.until = until
        member.note = note
        return member

    ALIAS_CLASH = "ALIAS_CLASH", B, "Internal", (
        "No short alias for a snapshot layer could be made in the instance's alias directory (every candidate "
        "name is taken by another layer).")
    BAD_ACTION = "BAD_ACTION", N, "InvalidArgument InvalidAction", (
        "An action (or a rollout's per-branch action scripts) is not one OSWorld would run; nothing ran.")
    BAD_CHECKSUM = "BAD_CHECKSUM", N, "InvalidArgument", (
        "The expected sha256 given for a bundle is not 64 lowercase hex digits.")
    BAD_COMMAND = "BAD_COMMAND", N, "InvalidArgument", (
        "`exec` was given no command, or one that is not a list of strings.")
    BAD_COUNT = "BAD_COUNT", N, "InvalidArgument", (
        "A count (restore siblings, pool siblings, rollout branches) is not a positive integer, or is over the "
        "number of session slots.")
    BAD_DESKTOP = "BAD_DESKTOP", N, "InvalidArgument", (
        "The desktop named is not one Drums knows.")
    BAD_LAYERS = "BAD_LAYERS", B, "Internal", (
        "The lowest layer planned for a session's root is not its image's rootfs (a bug in planning the root).")
    BAD_LIMITS = "BAD_LIMITS", N, "InvalidArgument", (
        "A session limit (memory, pids, CPU weight) is not an integer in its allowed range.")
    BAD_LINK = "BAD_LINK", N, "Unavailable", (
        "The interface named is not a session link (`dvh<slot>`); nothing was changed.")
    BAD_NETWORK = "BAD_NETWORK", N, "InvalidArgument", (
        "A session spec's network policy is malformed.")
    BAD_NODES = "BAD_NODES", N, "InvalidArgument", (
        "The pool's node names are missing or repeated, or a copy was asked of the node that is a state's home.")
    BAD_NONBLANK = "BAD_NONBLANK", N, "InvalidArgument", (
        "`min_nonblank` is not a number in [0, 1).")
    BAD_OS_TYPE = "BAD_OS_TYPE", N, "InvalidArgument", (
        "OSWorld asked for an `os_type` other than Linux; Drums desktops are Linux.")
    BAD_PATH = "BAD_PATH", N, "InvalidArgument", (
        "A path argument is not absolute, contains `..`, or (OSWorld's `path_to_vm`) does not name a Drums "
        "image.")
    BAD_REPLY = "BAD_REPLY", R, "Internal", (
        "The daemon's reply was not JSON or not a reply object (a daemon of another version, or a bug).",
        "a daemon of this version")
    BAD_REQUEST = "BAD_REQUEST", N, "InvalidArgument", (
        "A request to the daemon (or a node) is not JSON, not an object, or has unknown, missing, repeated or "
        "mistyped arguments.")
    BAD_RESULT = "BAD_RESULT", N, "Internal", (
        "The daemon computed a result it cannot send as JSON (a bug); the operation itself may have happened.")
    BAD_REUSE_MODE = "BAD_REUSE_MODE", N, "InvalidArgument", (
        "The snapshot reuse mode is not `none` or `post_setup`.")
    BAD_SIZE = "BAD_SIZE", N, "InvalidArgument", (
        "A size setting (store budget) is not bytes, a number with k/m/g/t, or a percentage in (0, 100].")
    BAD_SPEC = "BAD_SPEC", N, "InvalidArgument", (
        "A session spec is malformed: unknown fields, bad screen, env, limits, tmpfs size, desktop or program "
        "entries, or a window manager given with a desktop session.")
    BAD_SPILL_DIR = "BAD_SPILL_DIR", N, "InvalidArgument", (
        "`DRUMS_SPILL_DIR` is not an absolute path.", "an absolute DRUMS_SPILL_DIR (or `off`)")
    BAD_USER = "BAD_USER", N, "InvalidArgument", (
        "`exec` named a user the session does not have.")
    BAD_WINDOW = "BAD_WINDOW", N, "InvalidArgument", (
        "`expect_window` is not a string.")
    BUNDLE_CORRUPT = "BUNDLE_CORRUPT", N, "Internal", (
        "A snapshot bundle cannot be listed or extracted, its manifest is missing or malformed, or a member "
        "escapes the bundle or the snapshots it declares; nothing of it was imported.", "a good bundle")
    BUNDLE_NOT_FOUND = "BUNDLE_NOT_FOUND", N, "NotFound", (
        "There is no bundle file at the path given.")
    BUNDLE_UNSAFE = "BUNDLE_UNSAFE", N, "Internal", (
        "A bundle's layer holds a file Drums will not import (a device, a link out of the layer, ...) or could "
        "not be measured; nothing of it was imported.", "a bundle without it")
    CGROUP_FAILED = "CGROUP_FAILED", R, "Unavailable Internal", (
        "The kernel refused to create a session's cgroup, move a process into it or read it; as Unavailable "
        "everything made was removed, as Internal something was left.")
    CGROUP_NOT_EMPTY = "CGROUP_NOT_EMPTY", B, "Internal", (
        "A session's cgroup could not be removed: processes survived SIGKILL or a directory stayed.")
    CGROUP_UNAVAILABLE = "CGROUP_UNAVAILABLE", N, "FailedPrecondition", (
        "No usable cgroup driver on this host: no cgroup2 mount, missing controllers, or no v1 hierarchy for "
        "a controller.", "the host's cgroup setup (scripts/provision)")
    CHAIN_TOO_DEEP = "CHAIN_TOO_DEEP", N, "FailedPrecondition", (
        "A root of this many layers needs a mount line longer than CRIU reads.",
        "restore from a shorter chain of checkpoints")
    CHECKPOINT_FAILED = "CHECKPOINT_FAILED", B, "Internal", (
        "A checkpoint failed and the session could not be put back as it was (it died, or its network could "
        "not be rewired).")
    CHECKPOINT_REWIRE_FAILED = "CHECKPOINT_REWIRE_FAILED", B, "Internal", (
        "The checkpoint was committed (the snapshot is good) but the session's network could not be put back, "
        "so the session is broken.")
    CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH", R, "Unavailable", (
        "A received bundle's sha256 differs from the sender's (a damaged transfer); nothing was imported.")
    CONTROLLER_NOT_ENABLED = "CONTROLLER_NOT_ENABLED", N, "FailedPrecondition", (
        "A cgroup controller a session needs is not enabled (or has no v1 hierarchy) for its cgroup.",
        "the host's cgroup setup")
    CRIU_FAILED = "CRIU_FAILED", R, "Unavailable", (
        "CRIU's dump or restore failed; what it did was rolled back (`detail.criu_log` has its lines).")
    CRIU_NO_PID = "CRIU_NO_PID", B, "Internal", (
        "CRIU reported a successful restore without the restored tree's pid.")
    CRIU_TIMEOUT = "CRIU_TIMEOUT", R, "Unavailable", (
        "CRIU did not finish its dump or restore in time and was killed; its work was rolled back.")
    DAEMON_DIED = "DAEMON_DIED", R, "Unavailable", (
        "The daemon closed or lost the connection during a call (it exited or crashed); the operation may have "
        "been cut short, and the daemon's recovery cleans up after it.")
    DAEMON_DOWN = "DAEMON_DOWN", R, "Unavailable", (
        "The daemon of this instance is not running; nothing was sent.", "the daemon started (Client starts it)")
    DAEMON_START_FAILED = "DAEMON_START_FAILED", R, "Unavailable", (
        "The daemon could not be started, exited at once, or did not answer in time (`message` has its stderr).")
    DESKTOP_MISSING = "DESKTOP_MISSING", N, "FailedPrecondition", (
        "The session spec names a desktop session whose program the image lacks; nothing was started.",
        "an image with it (`drums image build`)")
    DNS_UNREACHABLE = "DNS_UNREACHABLE", N, "InvalidArgument", (
        "The DNS server of a network policy is not reached through its upstream interface on this host.")
    DOWNLOAD_NOT_CACHED = "DOWNLOAD_NOT_CACHED", N, "DownloadNotCached", (
        "A task's `download` setup step names a file that is not in the local cache (Drums never downloads).",
        "the file put in the cache")
    EXEC_TIMEOUT = "EXEC_TIMEOUT", R, "Unavailable", (
        "A command run in a session by `exec` did not finish within its timeout and was killed.")
    FAILED_PRECONDITION = "FAILED_PRECONDITION", N, "FailedPrecondition", (
        "The request conflicts with the current state (the class's default; the message says which).")
    GUEST_BAD_REPLY = "GUEST_BAD_REPLY", N, "GuestProtocolError", (
        "The guest server answered 2xx with a body that is not what its API promises.")
    GUEST_CONNECTION_LOST = "GUEST_CONNECTION_LOST", N, "GuestError", (
        "The connection to the guest server broke after the request may have been sent; the guest may have "
        "acted.", "check the desktop's state before repeating an action")
    GUEST_ERROR = "GUEST_ERROR", N, "GuestError", (
        "A call to the guest server failed (the class's default).")
    GUEST_HTTP_ERROR = "GUEST_HTTP_ERROR", N, "GuestHTTPError", (
        "The guest server answered with a non-2xx status (`detail` has the status and body).")
    GUEST_TIMEOUT = "GUEST_TIMEOUT", N, "GuestTimeout", (
        "The guest server accepted the request but did not answer in time; it may have acted.",
        "check the desktop's state before repeating an action")
    GUEST_UNREACHABLE = "GUEST_UNREACHABLE", R, "GuestUnavailable", (
        "No connection to the guest server could be made; the request was never delivered.")
    HOSTNET_CORRUPT = "HOSTNET_CORRUPT", N, "Internal", (
        "A host network record shared by the runs on this host is unreadable or malformed.",
        "the record repaired or removed by hand")
    HOST_BUDGET = "HOST_BUDGET", N, "Unavailable", (
        "A per-user kernel count (inotify, user namespaces, mqueue, ...) is too low for the configured "
        "sessions, or ran out.", "scripts/provision raises it, or fewer slots; a shortage may pass")
    ID_BASE_MISMATCH = "ID_BASE_MISMATCH", N, "FailedPrecondition", (
        "The snapshot was made with another id base (DRUMS_ID_BASE) than this host uses.",
        "the same DRUMS_ID_BASE")
    IMAGES_CORRUPT = "IMAGES_CORRUPT", B, "Internal", (
        "A snapshot's CRIU images or layers are missing, of the wrong size or otherwise corrupt; the snapshot "
        "is marked broken.")
    IMAGE_BUILD_FAILED = "IMAGE_BUILD_FAILED", R, "Unavailable Internal", (
        "Building a desktop image failed (a step exited non-zero, no build directory could be made, or a "
        "device path in it is not a plain directory); the log path is in the message.")
    IMAGE_CHANGED = "IMAGE_CHANGED", R, "Unavailable", (
        "The session's image was rebuilt while the session was being made; nothing was left.")
    IMAGE_IDS_OUT_OF_RANGE = "IMAGE_IDS_OUT_OF_RANGE", N, "Unavailable", (
        "Files of an image have owner ids outside the range the image was shifted into.",
        "the image rebuilt")
    IMAGE_ID_BASE_MISMATCH = "IMAGE_ID_BASE_MISMATCH", N, "FailedPrecondition", (
        "The image was built for another id base than this host uses.", "`drums image build NAME --force`")
    IMAGE_INCOMPLETE = "IMAGE_INCOMPLETE", N, "FailedPrecondition", (
        "The image has a manifest but no rootfs (an interrupted build).", "`drums image build NAME --force`")
    IMAGE_IN_USE = "IMAGE_IN_USE", N, "FailedPrecondition", (
        "The image cannot be removed or rebuilt: sessions' mounts still use it.", "those sessions destroyed")
    IMAGE_MISMATCH = "IMAGE_MISMATCH", N, "FailedPrecondition", (
        "The snapshot was made on another version (content hash) of its image than this host has.",
        "that image version built")
    IMAGE_NOT_FOUND = "IMAGE_NOT_FOUND", N, "NotFound", (
        "The image is not built in this host's image store.", "`drums image build NAME` (as root)")
    IMPORT_FAILED = "IMPORT_FAILED", R, "Unavailable", (
        "Importing a bundle's snapshots into the store failed and was undone.")
    INJECTED = "INJECTED", R, "Unavailable", (
        "A failure injected at a named fault point by a test (`drums_core.session.faults`).")
    INTERNAL = "INTERNAL", B, "Internal DrumsError", (
        "An unexpected error (the class's default; also any non-Drums exception the daemon caught): may be "
        "partly applied.")
    INVALID_ARGUMENT = "INVALID_ARGUMENT", N, "InvalidArgument", (
        "The request is malformed (the class's default; also bad ledger kinds, keys and data, an unknown "
        "cgroup driver, a sweep selection without a run).")
    INVALID_IMAGE_SPEC = "INVALID_IMAGE_SPEC", N, "InvalidArgument", (
        "An image spec is malformed, names another image than asked, or no built-in spec has that name.")
    INVALID_NAME = "INVALID_NAME", N, "InvalidArgument", (
        "A name or id (session, snapshot, scope, run, instance, cgroup) has characters Drums refuses (`/`, "
        "`..`, control characters, ...).")
    KERNEL_CAPS_FAILED = "KERNEL_CAPS_FAILED", R, "Unavailable", (
        "The session's kernel limits could not be written into its user namespace (the namespace is not there "
        "yet, or the helper failed).")
    LAUNCH_FAILED = "LAUNCH_FAILED", R, "Unavailable", (
        "The session launcher exited with an error before the session's init ran (`message` has its stderr).")
    LAYER_OUTSIDE_STORE = "LAYER_OUTSIDE_STORE", N, "Internal", (
        "A snapshot names a layer that is not a snapshot layer of this store.")
    LEDGER_BUSY = "LEDGER_BUSY", R, "Busy", (
        "Another sweep holds the run's ledger lock.")
    LEDGER_CORRUPT = "LEDGER_CORRUPT", N, "LedgerCorrupt", (
        "A ledger file cannot be read as an entry; the run is not swept (the sweep fails closed).",
        "the file repaired or removed by hand (`detail` names it)")
    LEDGER_ENTRY_NOT_FOUND = "LEDGER_ENTRY_NOT_FOUND", N, "NotFound", (
        "The run's ledger has no entry of that kind and key.")
    LEDGER_NOT_FOUND = "LEDGER_NOT_FOUND", N, "NotFound", (
        "There is no ledger for that run.")
    LINK_BUSY = "LINK_BUSY", R, "Unavailable", (
        "A session link (veth) was still present after the wait for it to go.")
    LINK_MISSING = "LINK_MISSING", R, "Unavailable", (
        "A session link vanished while being configured, or the session's network namespace lacks its "
        "interface.")
    LIVENESS_FAILED = "LIVENESS_FAILED", B, "Internal", (
        "A restored session lost a process of the checkpointed set during its liveness check; it is marked "
        "broken.")
    MANIFEST_CORRUPT = "MANIFEST_CORRUPT", N, "Internal", (
        "A snapshot's manifest is unreadable, or its own layer is not first in its layers.")
    MMDEBSTRAP_MISSING = "MMDEBSTRAP_MISSING", N, "FailedPrecondition", (
        "mmdebstrap, which builds images, is not installed.", "apt-get install mmdebstrap, or scripts/provision")
    NAT_BLOCKED = "NAT_BLOCKED", N, "FailedPrecondition", (
        "nftables tables of older Drums daemons drop every session link's routed traffic, so a `nat` session "
        "would have no network.", "restart those daemons")
    NETLINK = "NETLINK", R, "Unavailable", (
        "Creating or configuring a session's veth link over netlink failed.")
    NFT_FAILED = "NFT_FAILED", R, "Unavailable Internal", (
        "`nft` could not apply a session's rules or create the run's table (`message` has its stderr).")
    NODE_DIED = "NODE_DIED", R, "Unavailable", (
        "A pool node's agent (a Ray actor) is gone; the node is marked down.")
    NODE_DOWN = "NODE_DOWN", R, "Unavailable", (
        "The pool node is marked down (the reason it went down is in the message).")
    NODE_INTERNAL = "NODE_INTERNAL", B, "Internal", (
        "A pool node's agent raised an unexpected (non-Drums) exception.")
    NODE_MISPLACED = "NODE_MISPLACED", N, "Internal", (
        "A pool node's agent runs on another Ray node than the one it was placed on.")
    NODE_START_FAILED = "NODE_START_FAILED", R, "Unavailable", (
        "A pool node's agent did not start.")
    NOT_DRUMS = "NOT_DRUMS", N, "InvalidArgument", (
        "Snapshot reuse was asked of a DesktopEnv whose provider is not Drums.")
    NOT_FOUND = "NOT_FOUND", N, "NotFound", (
        "The thing named does not exist (the class's default; a node's store file).")
    NOT_READY = "NOT_READY", R, "Unavailable", (
        "The desktop (expected windows, a non-blank screen) or the guest port was not ready in time.")
    NOT_ROOT = "NOT_ROOT", N, "FailedPrecondition", (
        "Building an image needs root.", "run it as root")
    NOT_STARTED = "NOT_STARTED", N, "Unavailable", (
        "The OSWorld provider has no running desktop (nothing to act on or save).", "start_emulator first")
    NO_CAPACITY = "NO_CAPACITY", R, "Unavailable", (
        "No node of the pool has room for the sessions asked.")
    NO_DNS = "NO_DNS", N, "InvalidArgument", (
        "A network policy names no DNS server and none of the host's resolvers is reached through its "
        "upstream.", "a policy naming one")
    NO_NODE = "NO_NODE", R, "Unavailable", (
        "No node of the pool is up.")
    NO_SLOT = "NO_SLOT", R, "Unavailable", (
        "Every session slot of this instance is in use.", "a session destroyed")
    NO_SOURCE = "NO_SOURCE", R, "Unavailable", (
        "No node holding the state asked for is up.")
    NO_SUCH_PROCESS = "NO_SUCH_PROCESS", N, "NotFound", (
        "The process to move into a cgroup does not exist.")
    OS_ERROR = "OS_ERROR", R, "Unavailable", (
        "The CLI hit an OS error of its own (e.g. the screenshot file cannot be written).",
        "the cause in the message fixed")
    PACK_FAILED = "PACK_FAILED", R, "Unavailable", (
        "Packing a snapshot into a bundle failed (tar exited non-zero).")
    PARENT_MISSING = "PARENT_MISSING", N, "FailedPrecondition", (
        "A bundle's snapshot stacks on an ancestor that is neither in the bundle nor in this store.",
        "a bundle with the ancestor, or the ancestor imported first")
    PID_BUDGET = "PID_BUDGET", N, "Unavailable", (
        "The host's pid space (pid_max, threads_max) is too small for the configured sessions, or ran out.",
        "scripts/provision raises it, or fewer slots; a shortage may pass")
    POST_DUMP_FAILED = "POST_DUMP_FAILED", R, "Unavailable", (
        "The checkpoint's step at CRIU's post-dump point (checking the images, committing) failed; the "
        "session's tasks run on.")
    PROGRAM_MISSING = "PROGRAM_MISSING", N, "FailedPrecondition", (
        "The session spec names a window manager or program the image lacks; nothing was started.",
        "an image with it, or a program it has")
    PURGE_REFUSED = "PURGE_REFUSED", N, "FailedPrecondition", (
        "A purge will not delete: the daemon still runs, sessions could not be stopped (mounts remain), or a "
        "path is not a plain deep directory; nothing was deleted.", "what the message names")
    RAY_ERROR = "RAY_ERROR", B, "Internal", (
        "A call to a pool node failed inside Ray itself.")
    RAY_NOT_INITIALISED = "RAY_NOT_INITIALISED", N, "Unavailable", (
        "A pool was made before Ray was initialised.", "ray.init(...)")
    RESEED_FAILED = "RESEED_FAILED", R, "Unavailable", (
        "A restored session's infrastructure reseed (hostname, the guest's reseed hook) failed; the restore was "
        "rolled back.")
    RESTORE_FAILED = "RESTORE_FAILED", R, "Unavailable", (
        "A restore failed on an OS, subprocess or value error and was rolled back.")
    RESTORE_SETUP_FAILED = "RESTORE_SETUP_FAILED", R, "Unavailable", (
        "The restore's namespace set-up at CRIU's setup-namespaces point failed; the restore was rolled back.")
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED", N, "Internal", (
        "Restores of the same snapshot failed retryably several times in a row (RETRY_LIMIT); the last failure "
        "is in the message.", "the cause fixed; the count restarts")
    RUN_EXISTS = "RUN_EXISTS", N, "FailedPrecondition", (
        "A ledger for that run id exists already.")
    SCREEN_SIZE_MISMATCH = "SCREEN_SIZE_MISMATCH", N, "FailedPrecondition", (
        "The desktop's screenshot size differs from the gym env's observation space.")
    SESSION_BROKEN = "SESSION_BROKEN", B, "Internal", (
        "The session was marked broken earlier (a failed checkpoint, liveness, OOM...); every call on it fails.",
        "destroy it")
    SESSION_BUSY = "SESSION_BUSY", R, "Busy", (
        "Another operation holds this session; nothing changed.")
    SESSION_DIED = "SESSION_DIED", R, "Unavailable", (
        "The session's init or a process it needs died while the session started or got ready; nothing was "
        "left.")
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND", N, "NotFound", (
        "There is no session with that id.")
    SESSION_REPLY_TIMEOUT = "SESSION_REPLY_TIMEOUT", R, "Unavailable GuestTimeout", (
        "Session-controlled data (a procfs file, a command's output, a guest reply) was not complete within "
        "its deadline.")
    SESSION_REPLY_TOO_LARGE = "SESSION_REPLY_TOO_LARGE", N, "Unavailable GuestReplyTooLarge", (
        "Session-controlled data (a procfs file, a command's output, a guest reply) was over its byte bound; "
        "what came was dropped.")
    SETUP_FAILED = "SETUP_FAILED", N, "SetupFailed", (
        "A task's setup failed on the desktop: the attempt is invalid and must not be scored.",
        "a new reset")
    SETUP_STEP_FAILED = "SETUP_STEP_FAILED", N, "SetupError", (
        "A task's setup step failed (`detail` names the step); the steps before it keep their effects.")
    SETUP_STEP_UNSUPPORTED = "SETUP_STEP_UNSUPPORTED", N, "SetupError", (
        "A task's setup step is of a type Drums cannot run.")
    SETUP_UNTIL_TIMEOUT = "SETUP_UNTIL_TIMEOUT", N, "SetupError", (
        "An `execute` setup step's `until` condition was not met in time.")
    SNAPSHOT_BROKEN = "SNAPSHOT_BROKEN", B, "Internal FailedPrecondition", (
        "The snapshot was marked broken earlier (corrupt images, ...); it is not restored or exported.",
        "another snapshot")
    SNAPSHOT_ID_CONFLICT = "SNAPSHOT_ID_CONFLICT", N, "FailedPrecondition", (
        "A checkpoint's snapshot id exists (or is being made) with other parameters.")
    SNAPSHOT_IN_USE = "SNAPSHOT_IN_USE", R, "FailedPrecondition", (
        "The snapshot cannot be dropped or spilled: snapshots or sessions use it, or it is being restored or "
        "checkpointed.", "its users gone")
    SNAPSHOT_NOT_FOUND = "SNAPSHOT_NOT_FOUND", N, "NotFound", (
        "No snapshot of that id or name (in that scope), it is not committed, or it was evicted from the "
        "store to make room.")
    SNAPSHOT_OTHER_BOOT = "SNAPSHOT_OTHER_BOOT", N, "FailedPrecondition", (
        "The snapshot was made on another boot of this host and cannot be restored.")
    SNAPSHOT_PREDATES_IMAGES = "SNAPSHOT_PREDATES_IMAGES", N, "FailedPrecondition", (
        "The snapshot was made over the host's root filesystem, before Drums built its own images.",
        "re-create it")
    SNAPSHOT_TOO_LARGE = "SNAPSHOT_TOO_LARGE", N, "Unavailable", (
        "This checkpoint may add more to the snapshot store than one checkpoint may.",
        "a session that occupies less, or a larger per-checkpoint cap")
    SOCKET_IN_FLIGHT = "SOCKET_IN_FLIGHT", R, "Unavailable", (
        "A unix socket's queue holds a message carrying a socket no process holds, which CRIU cannot restore "
        "reliably (the dump is retried).")
    SOURCE_UNAVAILABLE = "SOURCE_UNAVAILABLE", R, "Unavailable", (
        "Pulling a snapshot bundle from another pool node failed.")
    SPILL_DISABLED = "SPILL_DISABLED", N, "FailedPrecondition", (
        "Spilling snapshots is off (no spill directory is configured).", "a DRUMS_SPILL_DIR")
    SPILL_FAILED = "SPILL_FAILED", R, "FailedPrecondition", (
        "A snapshot could not be spilled: it came into use meanwhile, or the copy failed (see the daemon's log).")
    START_FAILED = "START_FAILED", R, "Unavailable", (
        "Starting a session failed on an OS, subprocess or value error; it was rolled back.")
    STORE_FULL = "STORE_FULL", R, "Unavailable", (
        "The state store or the snapshot store's budget has no room for what a checkpoint may need.",
        "snapshots dropped or evicted")
    SYSCTL_FAILED = "SYSCTL_FAILED", R, "Unavailable Internal", (
        "A host network sysctl (forwarding, ...) could not be read or written.")
    TASK_AMBIGUOUS = "TASK_AMBIGUOUS", N, "TaskError", (
        "A task name prefix matches several tasks.", "a longer name")
    TASK_INVALID = "TASK_INVALID", N, "TaskError", (
        "A task file is malformed (`detail.problems` lists every problem); nothing was run.")
    TASK_NOT_FOUND = "TASK_NOT_FOUND", N, "TaskError", (
        "No task has that name.")
    TASK_NOT_JSON = "TASK_NOT_JSON", N, "TaskError", (
        "The task file is not valid JSON.")
    TASK_UNREADABLE = "TASK_UNREADABLE", N, "TaskError", (
        "The task file cannot be read.")
    TIMEOUT = "TIMEOUT", R, "Unavailable", (
        "The daemon or a pool node did not answer within the call's timeout; the call may still complete "
        "there.", "a retry of a create or restore may find the first one's sessions")
    TRANSFER_TRUNCATED = "TRANSFER_TRUNCATED", R, "Unavailable", (
        "A snapshot bundle pulled from another node ended early.")
    UNAVAILABLE = "UNAVAILABLE", R, "Unavailable", (
        "Nothing happened, or everything was rolled back (the class's default; the message says why).")
    UNKNOWN_NODE = "UNKNOWN_NODE", N, "InvalidArgument", (
        "The pool has no node of that name.")
    UNKNOWN_OP = "UNKNOWN_OP", N, "InvalidArgument", (
        "The daemon (or a transfer) has no operation of that name (a client of another version).")
    UNSAFE_PATH = "UNSAFE_PATH", N, "FailedPrecondition", (
        "A path inside a session root resolves outside it or is not a regular file; the host refused it.")
    UPSTREAM_MISSING = "UPSTREAM_MISSING", N, "FailedPrecondition", (
        "The snapshot's network upstream interface is not on this host.", "a host with that interface")
    UPSTREAM_NOT_FOUND = "UPSTREAM_NOT_FOUND", N, "InvalidArgument", (
        "A network policy's upstream interface does not exist on this host.")
    UPSTREAM_UNUSABLE = "UPSTREAM_UNUSABLE", N, "InvalidArgument", (
        "A network policy's upstream interface has no IPv4 address to masquerade behind.")
    X_UNREACHABLE = "X_UNREACHABLE", R, "Unavailable", (
        "The session's X display could not be reached.")


del R, N, B


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _advice(reason: Reason) -> str:
    return f"{reason.retry.value}: {reason.until}" if reason.until else reason.retry.value


def markdown() -> str:
    """The README's table of reasons (between its ``<!-- reasons:begin -->`` / ``end`` markers)."""
    rows = ["| Reason | Raised as | Retry | Meaning |", "|---|---|---|---|"]
    for r in Reason:
        meaning = r.meaning + (f" ({r.note})" if r.note else "")
        rows.append(f"| `{r.value}` | {', '.join(r.raised_as)} | {_cell(_advice(r))} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--markdown"]:
        print("usage: python -m drums_core.reasons --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
