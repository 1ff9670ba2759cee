"""Where work runs: the device a choice means, where float64 work runs for it, each torchrun
process's own GPU, and what the app shows about a device.

One home for these, in the lowest layer, so that loading, evaluation, matching, the command
line and the app all ask the same functions. Importing this module imports no torch (the app's
first paint imports it): each function that needs torch imports it when called.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from rotviz.errors import RotvizError

if TYPE_CHECKING:
    import torch


def mps_available() -> bool:
    """Whether an Apple GPU (MPS) is usable (builds without MPS lack torch.backends.mps)."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


# OpenMP's settings for a process that shares its cores (read once, when torch loads, so the
# command line and the app set them before that; a library caller decides for itself). torch's
# CPU threads (GNU libgomp) spin for about a millisecond at the end of every parallel region,
# waiting for each other; when another process holds a core, the spinning threads take the
# CPU from the one still working, and small operations run many times slower (bench/threads.py:
# on 2 shared cores, a 256-wide linear layer 19.5 ms a call instead of 0.5, the default pair's
# 11-point curve 24.8 s instead of 3.4). Sleeping at once costs a wake-up of a few
# microseconds per region on an idle machine. The same threads split the same work: no
# number changes.
CALM = {"OMP_WAIT_POLICY": "PASSIVE"}


def calm_before_torch() -> None:
    """Put CALM's settings into this process's environment, each unless already set, while
    torch has not loaded yet (OpenMP reads them once, when it loads; after that they would
    change nothing). For the command line, the app and the benchmarks, which own their
    process."""
    import sys

    if "torch" in sys.modules:
        return
    for key, value in CALM.items():
        os.environ.setdefault(key, value)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's CPU operations run on this thread alone inside, and on as many threads as
    before after. For chains of small elementwise operations (a merge's slices of rows):
    each operation is too short for its threads to gain what their meeting at its end
    costs, and on a machine shared with other work a thread waits for the scheduler there
    (a TIES of 8M entries, 2 cores shared: 1.8 s on one thread, 9 to 31 s on two)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# Threads that work on slices at once, where the work on a slice is independent of the other
# slices' (`in_order`: a merge's, a streamed distance's); each runs torch on one thread
# (`one_thread`), so the slices are worked on exactly as on one thread. Two: slices are read
# from files and cast, and more threads would mostly wait for the disk and for each other.
SLICE_WORKERS = 2

Item = TypeVar("Item")
Done = TypeVar("Done")


def slice_workers() -> int:
    """Threads for `in_order`: SLICE_WORKERS, at most the processors this process may run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity: every processor
        cores = os.cpu_count() or 1
    return max(1, min(SLICE_WORKERS, cores))


def in_order(work: Callable[[Item], Done], items: Iterable[Item],
             workers: int | None = None) -> Iterator[Done]:
    """work(item) for each item, given back in the items' order, worked on `workers` threads
    (default `slice_workers()`) at most `workers` items ahead of the one given back, so that
    few results are held. For slices whose work needs no other slice's (a pass that counts
    or gathers, a merge of rows): torch lets go of Python's lock inside its operations, so
    two threads work two slices at once, each as it would alone (the same operations on the
    same numbers: the same bits). An error in one item's work is raised when its turn comes."""
    workers = slice_workers() if workers is None else workers
    if workers <= 1:
        yield from map(work, items)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    from itertools import islice

    left = iter(items)
    with ThreadPoolExecutor(workers, thread_name_prefix="rotviz-slices") as pool:
        coming = deque(pool.submit(work, item) for item in islice(left, workers))
        try:
            while coming:
                done = coming.popleft().result()
                for item in left:  # the next item, if any
                    coming.append(pool.submit(work, item))
                    break
                yield done
        finally:
            for f in coming:  # given up early (an error, or the merge stopped): drop the rest
                f.cancel()


# Parameters in a pair (both models) below which its matching runs on one CPU thread. A small
# pair's solvers make many small operations, each too short for two threads to gain what their
# meeting at its end costs: weight matching on the default pair takes 4.9 CPU s on one thread
# and 7.6 on two (bench/RESULTS.md `ladder`). One count for every caller (the command line, the
# app, the gallery, the tests) also means one answer: the alternation's choices follow the
# last bits of its sums, which the thread count can change (the default pair's weight barrier:
# 1.6891 on one thread, 1.6793 on two).
SMALL_PAIR = 5_000_000


def pair_params(*states: Mapping[str, Any]) -> int:
    """The number of entries in the given state dicts' tensors (the models of a pair)."""
    return sum(int(t.numel()) for state in states for t in state.values()
               if hasattr(t, "numel"))


@contextmanager
def threads_for(params: int, device: Any = "cpu") -> Iterator[None]:
    """One torch thread inside (`one_thread`) for a pair of at most SMALL_PAIR parameters
    on the CPU; torch's own count otherwise."""
    if params <= SMALL_PAIR and str(getattr(device, "type", device)).startswith("cpu"):
        with one_thread():
            yield
    else:
        yield


def pick_device(device: str = "auto") -> torch.device:
    """`auto` picks cuda, then mps, then cpu."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device not in ("cpu", "cuda", "mps") and not device.startswith("cuda:"):
        raise RotvizError(f"unknown device '{device}': use auto, cpu, cuda or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RotvizError(
            "--device cuda asked for, but no CUDA GPU is visible; use --device auto or cpu"
        )
    if device == "mps" and not mps_available():
        raise RotvizError("--device mps asked for, but no Apple GPU (MPS) is available; "
                          "use --device auto or cpu")
    return torch.device(device)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A torch.device from 'auto', 'cpu', 'cuda', 'mps' or a torch.device."""
    import torch

    if isinstance(device, torch.device):
        return device
    return pick_device(device or "auto")


def wide_device(device: torch.device | str) -> torch.device:
    """Where float64 work for `device` runs: the device itself, except MPS, which has no
    float64, so the solvers, learned maps and float64 sums run on the CPU instead."""
    import torch

    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


def device_for(device: torch.device) -> torch.device:
    """Under torchrun with GPUs, each process uses the GPU of its local rank."""
    import torch

    from rotviz.dist import launched

    if launched() and device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


# ---- what the app offers and shows ---------------------------------------------------------


# What a GPU that torch could use exposes on Linux and Windows: NVIDIA's driver device nodes
# (CUDA; a container is given them with the GPU), AMD's compute node (ROCm, which torch calls
# "cuda") and WSL 2's GPU node. Apple GPUs (MPS) exist only on macOS.
GPU_NODES = ("/dev/nvidia*", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")


def surely_cpu_only() -> bool:
    """True when no GPU torch could use can be on this machine (not macOS, and none of
    GPU_NODES exists), known without importing torch. `import torch` takes 2-3 s of pure
    Python on a CPU machine, and the app's device picker comes before its first page: on such
    a machine it is drawn at once, with the choices torch would give (auto and cpu, auto
    meaning cpu). False means only that torch must be asked."""
    import glob

    if platform.system() == "Darwin":
        return False
    return not any(glob.glob(pattern) for pattern in GPU_NODES)


def device_kind(device: str = "auto") -> str:
    """The kind of device (cpu, cuda or mps) that `pick_device(device)` gives, with its
    refusals, without importing torch for cpu, nor for auto where `surely_cpu_only` says so."""
    if device == "cpu" or (device == "auto" and surely_cpu_only()):
        return "cpu"
    return pick_device(device).type


def device_choices() -> list[str]:
    """What the device picker offers: auto, cpu, and cuda / mps where present."""
    if surely_cpu_only():
        return ["auto", "cpu"]
    import torch

    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    if mps_available():
        out.append("mps")
    return out


def device_summary(device: Any) -> dict[str, Any]:
    """Kind, name and memory (GiB) of a device (a torch.device, or a string such as "cpu" or
    "cuda:1"), for the app's badge. The CPU's needs no torch."""
    if device == "cpu" or getattr(device, "type", None) == "cpu":
        out: dict[str, Any] = {"kind": "cpu", "name": platform.processor() or platform.machine()
                               or "CPU", "total_gib": None, "free_gib": None}
        try:
            pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
            avail = os.sysconf("SC_AVPHYS_PAGES")
            out.update(total_gib=pages * size / 2**30, free_gib=avail * size / 2**30)
        except (ValueError, OSError, AttributeError):
            pass
        return out
    import torch

    device = torch.device(device)
    out = {"kind": device.type, "name": device.type, "total_gib": None, "free_gib": None}
    if device.type == "cuda":
        idx = device.index or 0
        props = torch.cuda.get_device_properties(idx)
        free, total = torch.cuda.mem_get_info(idx)
        out.update(name=props.name, total_gib=total / 2**30, free_gib=free / 2**30)
    elif device.type == "mps":
        out["name"] = "Apple GPU (MPS)"
        rec = getattr(getattr(torch, "mps", None), "recommended_max_memory", None)
        if rec is not None:
            out["total_gib"] = rec() / 2**30
    return out


def device_note(device: Any) -> str | None:
    """What a user should know about where the work runs on `device`, if anything."""
    if getattr(device, "type", device) == "mps":
        return ("Forward passes run on the Apple GPU; matching runs on the CPU, because its "
                "solvers work in float64, which MPS does not have.")
    return None


def device_badge(summary: Mapping[str, Any]) -> str:
    """'cuda · NVIDIA H100 · 79.1 of 80.0 GiB free' style text."""
    parts = [str(summary["kind"]), str(summary["name"])]
    if summary.get("total_gib"):
        if summary.get("free_gib") is not None:
            parts.append(f"{summary['free_gib']:.1f} of {summary['total_gib']:.1f} GiB free")
        else:
            parts.append(f"{summary['total_gib']:.1f} GiB")
    return " · ".join(parts)


# Sequences this short (tokens, or image patches) are attended unfused on the CPU: torch's
# fused CPU kernel works in blocks sized for long sequences, and at the default pair's 17
# positions it took half of an evaluation (95 ms against 55 ms unfused, 2 threads). Both the
# transformers models (rotviz.sources.running.attending_module) and rotviz.sources.plain_torch's
# follow it, so that the app's light models and the library's agree bit for bit.
SHORT_ATTENTION = 32
