"""The sidebar's device picker and badge: which devices are offered, and what the chosen
one is (kind, name, memory). torch is imported when a function runs, never on import.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import Any


def device_choices() -> list[str]:
    """What the device picker offers: auto, cpu, and cuda / mps where present."""
    import torch

    from rotviz.models import mps_available

    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    if mps_available():
        out.append("mps")
    return out


def device_summary(device: Any) -> dict[str, Any]:
    """Kind, name and memory (GiB) of a torch device, for the app's badge."""
    import torch

    device = torch.device(device)
    out: dict[str, Any] = {"kind": device.type, "name": device.type, "total_gib": None,
                           "free_gib": None}
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
    else:
        out["name"] = platform.processor() or platform.machine() or "CPU"
        try:
            pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
            avail = os.sysconf("SC_AVPHYS_PAGES")
            out.update(total_gib=pages * size / 2**30, free_gib=avail * size / 2**30)
        except (ValueError, OSError, AttributeError):
            pass
        out["threads"] = torch.get_num_threads()
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
