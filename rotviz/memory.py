"""Giving freed memory back to the system between the blocks of a streamed run.

glibc's allocator serves tensors of a few MB from its heap once large frees have raised its
mmap threshold, and keeps what they free: a streamed match then grows by a block's worth of
fragments per block although it holds no more tensors than before. `release()` collects
the young reference cycles (a block's tensors are freed by reference counting; a cycle that
holds one was made during that block, so it is still young) and asks glibc to return free
heap pages (malloc_trim); elsewhere it only collects. Not a full collection: in a process
holding a large library (transformers) that walks every object it holds, about 0.2 s a
block, which dominated small streamed runs; the peak is the same (tests/test_streaming.py).

Trimming between blocks does not reach what the heap keeps *within* a block. glibc maps an
allocation on its own only above a threshold that it raises, after each large free, up to
32 MB; below it, tensors of 1-32 MB (a d x d float32 map, a head's weights) come from the
heap, whose freed pieces stay resident until the next trim and interleave with live ones.
While a streamed match runs, `mapped_alone()` fixes the threshold at 1 MB: such tensors are
then mapped alone and freed at once. Weight matching at LLaMA-1B width (2 layers, one round
a phase, streamed) peaked at 2.42 GB instead of 2.67 GB, for about 24% more page faults
(bench/RESULTS.md, `stream-cpu-llama-1b-weight`). Not for the whole process: every mapping
is a fresh set of zeroed pages, and a forward pass's few-MB activations then cost ten times
the page faults. On leaving, the threshold is set to 32 MB, where glibc's own rule would
have brought it after the run's large frees (glibc keeps a set threshold: it cannot be given
back to its own rule).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)
MMAP_THRESHOLD = 1 << 20  # bytes: during a streamed match, allocations from here up are mapped
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for its own rule on 64-bit systems


@cache
def _libc_function(name: str):
    """glibc's function `name`, None where there is no glibc (macOS, musl without it)."""
    lib = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(lib) if lib else None
        return getattr(libc, name, None)
    except OSError:
        return None


def _mmap_threshold(nbytes: int) -> None:
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, nbytes)


@contextmanager
def mapped_alone() -> Iterator[None]:
    """Within: allocations of MMAP_THRESHOLD bytes and more are mapped on their own, so that
    freeing them returns them at once (see module); a decorator too. Where there is no glibc
    it does nothing. The setting is the process's: two streamed matches in threads share it."""
    _mmap_threshold(MMAP_THRESHOLD)
    try:
        yield
    finally:
        _mmap_threshold(MMAP_THRESHOLD_MAX)


def release() -> None:
    gc.collect(1)
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


def _proc_bytes(path: str, key: str) -> int | None:
    """The kB value of `key` in a /proc file such as /proc/meminfo, in bytes; None where
    there is no /proc (not Linux) or no such key."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def resident_now() -> int | None:
    """This process's resident memory now (VmRSS), in bytes; None where /proc is not there."""
    return _proc_bytes("/proc/self/status", "VmRSS")


def resident_peak() -> int | None:
    """This process's peak resident memory in bytes: the kernel's high-water mark of its own
    address space (VmHWM). Not getrusage's ru_maxrss, which after fork and exec also counts
    the parent's resident memory at the fork: a small child of a large process would report
    the parent's size. None where /proc is not there."""
    return _proc_bytes("/proc/self/status", "VmHWM")


def available_memory() -> int | None:
    """The memory this machine can give now (MemAvailable), None where unknown."""
    return _proc_bytes("/proc/meminfo", "MemAvailable")


class Watch:
    """The resident memory of this process while a block of work runs, sampled every
    `every` seconds by a thread (`with Watch() as w: ...`, then `w.start`, `w.peak` in bytes;
    None where /proc is not there). The kernel's own high-water mark (`resident_peak`) cannot
    be read per run: in a long-lived process (the app) it holds the largest run so far."""

    def __init__(self, every: float = 0.05) -> None:
        import threading

        self.every = every
        self.start: int | None = None
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rotviz-memory", daemon=True)

    def _sample(self) -> None:
        now = resident_now()
        if now is not None:
            self.peak = now if self.peak is None else max(self.peak, now)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> Watch:
        self.start = resident_now()
        self.peak = self.start
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def held(self) -> int | None:
        """The most this block held above what the process held when it began."""
        if self.start is None or self.peak is None:
            return None
        return max(0, self.peak - self.start)
