"""Run a call in a forked child, so that a crash of C++ code under it (a signal
such as SIGFPE or SIGSEGV) becomes an exception in the caller instead of the end
of the process.

The child inherits the caller's memory (the arguments need no pickling) and sends
back the pickled result or the exception, rebuilt in the caller without running
its ``__init__`` (its message and members stay as raised). POSIX only: where
``os.fork`` is missing the call runs in-process.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import time
import traceback


class ChildCrashed(Exception):
    """The child running the call ended without an answer.

    Members
    -------
    signal : the signal that ended it (None when it exited without one).
    status : its exit status otherwise.
    """

    def __init__(self, sig: int | None, status: int | None):
        self.signal, self.status = sig, status
        how = f"was killed by {signal.Signals(sig).name}" if sig else f"exited with {status}"
        super().__init__(f"the child process {how}")


class ChildTimedOut(Exception):
    """The child running the call gave no answer within its time limit (it was
    killed): a hang in C++ code under it, or work far beyond what the call needs."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"the child process gave no answer within {seconds:g} s")


def run_isolated(fn, *args, timeout: float | None = None, **kwargs):
    """``fn(*args, **kwargs)`` in a forked child: its result, or its exception
    raised again here; :class:`ChildCrashed` when the child dies without one,
    :class:`ChildTimedOut` when it has not answered within ``timeout`` seconds."""
    if not hasattr(os, "fork"):
        return fn(*args, **kwargs)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        gc.disable()  # a collection would touch, and so copy, every page of the heap
        os.close(read_fd)
        try:
            _answer(write_fd, fn, args, kwargs)
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        data = _read_all(read_fd, timeout)
        if data is None:  # the finally kills the child
            raise ChildTimedOut(timeout)
        _, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        if pid:  # interrupted while the child runs: it must not outlive us
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if not data:
        raise ChildCrashed(os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                           os.waitstatus_to_exitcode(status))
    ok, payload = pickle.loads(data)
    if ok:
        return payload
    raise _rebuild(*payload)


def _read_all(fd: int, timeout: float | None) -> bytes | None:
    """Everything the child writes until it closes the pipe; None when that takes
    longer than ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    chunks = []
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if not select.select([pipe], [], [], left)[0]:
                return None
            chunk = pipe.read(1 << 16)  # unbuffered: what the pipe holds, b"" at EOF
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _answer(fd: int, fn, args, kwargs):
    try:
        answer = (True, fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - every exception goes back to the caller
        answer = (False, (type(e), e.args, vars(e), traceback.format_exc()))
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - an answer that cannot travel is a bug here
        data = pickle.dumps((False, (RuntimeError, (f"cannot send the result back: {e}",),
                                     {}, traceback.format_exc())))
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(data)


def _rebuild(cls, args, members, where) -> BaseException:
    exc = cls.__new__(cls, *args)
    exc.args = args
    vars(exc).update(members)
    exc.add_note(f"raised in the isolated child:\n{where}")
    return exc
