"""How a command ends: signals, ``--duration``, and one error line instead of a traceback.

Shared by every long-running ``p2p`` verb and the examples::

    async def serve() -> int:
        async with graceful(args.duration) as stop:   # SIGINT/SIGTERM caught from here on
            async with open_node(node_dir, cfg) as node:
                with stop.scope:                      # cancelled by a signal or the deadline
                    ...                               # the command's work
            # open_node's block ended normally: the node announced its LEAVE
        return stop.exit_code                         # 130 after SIGINT, else 0

    sys.exit(run_cli(lambda: trio.run(serve), debug=args.debug))

The cancellation happens *inside* ``open_node``, so the node closes as on a
normal end (LEAVE to every member, queued frames drained) and its peers see a
graceful leave, not a suspicion.  A second signal while leaving abandons the
leave and ends the process at once (a leave can wait on a thread, e.g.
zeroconf's, that no cancellation reaches).

It sits below the commands that use it (``p2p.cli``, ``p2p.telemetry``'s
collector, the examples) and imports neither of them.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from p2p._errors import P2PError

INTERRUPTED = 130
"""Exit status after SIGINT (128 + 2, as a shell reports Ctrl-C)."""


class Shutdown:
    """What ended a command: ``signum`` is the first signal received, if any.

    Invariant: ``scope`` is cancelled by the first SIGINT or SIGTERM or at the
    deadline; a second signal ends the process at once with the same status.
    """

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.signum: int | None = None

    @property
    def exit_code(self) -> int:
        """130 after SIGINT; 0 after SIGTERM, the deadline or a normal end."""
        return INTERRUPTED if self.signum == signal.SIGINT else 0

    async def _listen(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if self.signum is None:
                self.signum = signum
                self.scope.cancel()
            else:  # the leave can wait on threads no cancellation reaches: end now
                print("p2p: stopped by a second signal: leave abandoned", file=sys.stderr)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(self.exit_code)


@asynccontextmanager
async def graceful(duration: float | None = None) -> AsyncIterator[Shutdown]:
    """Catch SIGINT and SIGTERM for the block (main thread only) and, after
    ``duration`` seconds, cancel the yielded ``scope`` as a signal would."""
    stop = Shutdown()
    if duration is not None:
        stop.scope.deadline = trio.current_time() + duration
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop._listen, signals)
            yield stop
            nursery.cancel_scope.cancel()


def run_cli(command: Callable[[], int], *, debug: bool = False, prog: str = "p2p") -> int:
    """Run ``command`` and return its exit status.

    Invariant: a failure a user can cause (a :class:`P2PError`, an ``OSError``,
    Ctrl-C), alone or inside trio's exception groups, ends in exactly one line
    on stderr and its exit status (``P2PError.exit_code``; 1 for an OS
    failure; 130 for Ctrl-C); ``debug`` prints the traceback before that line.
    Anything else is a bug and propagates with its traceback.
    """
    caught: list[BaseException] = []
    try:
        return command()
    except* (KeyboardInterrupt, P2PError, OSError) as group:
        caught.append(group)
    if debug:
        traceback.print_exception(caught[0])
    code, message = explain(caught[0])
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
    return code


def explain(exc: BaseException) -> tuple[int, str]:
    """Exit status and message for an expected failure (the first leaf of a group
    decides, Ctrl-C first of all)."""
    leaves = _leaves(exc)
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        return INTERRUPTED, "interrupted"
    first = next((e for e in leaves if isinstance(e, P2PError)), leaves[0])
    exhausted = _out_of_files(first)
    if exhausted is not None:  # whichever layer met it, the remedy is the same
        return 1, f"error: {_os_message(exhausted)}"
    if isinstance(first, P2PError):
        return first.exit_code, f"error: {first}"
    if isinstance(first, OSError):
        return 1, f"error: {_os_message(first)}"
    return 1, f"error: {first!r}"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _out_of_files(exc: BaseException) -> OSError | None:
    """The EMFILE/ENFILE behind ``exc`` (itself, or what it was raised from), if any."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: errors wrap an OS error once or twice
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in (errno.EMFILE, errno.ENFILE):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _os_message(exc: OSError) -> str:
    """One line for an OS failure, with what the user can do about the common ones."""
    if exc.errno == errno.EADDRINUSE:
        return "address already in use: another process listens on this --port (pick another)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "cannot listen: --interface is not an address of this machine"
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return f"too many open files (this process may open {soft}; raise it with `ulimit -n`)"
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


__all__ = ["INTERRUPTED", "Shutdown", "explain", "graceful", "run_cli"]
