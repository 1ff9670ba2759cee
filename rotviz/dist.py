"""Work spread over processes with torch.distributed, launched by `torchrun`.

rotviz runs no job runner of its own: `torchrun --nproc-per-node N -m rotviz ...` (or across
nodes, with torchrun's own rendezvous options) starts the processes and sets RANK and
WORLD_SIZE; `init` joins the group, with NCCL where the processes use GPUs and gloo on CPUs.
Without torchrun everything runs in one process and nothing here is used. Rank 0 writes all
outputs; the others compute their share and hand it over.

When one process fails (a NaN in its block, a bad file) it prints its one line and exits;
torchrun then sends SIGTERM to the others (the command line turns it into an exception, so
rank 0 removes its temporaries), and a process still waiting in a collective for the one that
left gets a communication error, which `_together` turns into one line too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rotviz.errors import RotvizError


def _together(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A collective of torch.distributed; when a peer process has gone (it failed and said
    why in its own line), one line here too instead of the backend's traceback."""
    try:
        return op(*args, **kwargs)
    except RuntimeError as e:  # gloo and NCCL raise DistBackendError, a RuntimeError
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0][:120]
        raise RotvizError(f"another torchrun process stopped ({first}); its own line says "
                          "why; nothing was written") from None


@dataclass(frozen=True)
class Group:
    """This process's place in the run: rank among world processes."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mine(self, items: list[int]) -> list[int]:
        """This rank's share of `items`, dealt round-robin (layers cost alike)."""
        return items[self.rank::self.world]

    def each(self, count: int, evaluate: Callable[[int], Any],
             progress: Callable[[int, int, str], None] | None = None,
             said: Callable[[int, int, int], str] = lambda done, total, j: ""
             ) -> dict[int, Any] | None:
        """Items 0 .. count - 1 dealt among the ranks (`mine`), each evaluated where it falls
        (`progress` after each: done, total, `said(done, total, item)`), then gathered: every
        item's value by index on rank 0, None on the others (the points of a path or of a
        slice's grid, under torchrun or in one process)."""
        mine = self.mine(list(range(count)))
        done: dict[int, Any] = {}
        for n, j in enumerate(mine):
            done[j] = evaluate(j)
            if progress:
                progress(n + 1, len(mine), said(n + 1, len(mine), j))
        parts = self.gather(done)
        if parts is None:
            return None
        for part in parts:
            done.update(part)
        return done

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` on rank 0 (in rank order); None on the others."""
        if self.world == 1:
            return [obj]
        import torch.distributed as td

        out: list[Any] | None = [None] * self.world if self.main else None
        _together(td.gather_object, obj, out, dst=0)
        return out

    def share(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s `obj`, on every rank (small objects: numbers, reports, maps)."""
        if self.world == 1:
            return obj
        import torch.distributed as td

        box = [obj if self.rank == src else None]
        _together(td.broadcast_object_list, box, src=src)
        return box[0]

    def all(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as td

        out: list[Any] = [None] * self.world
        _together(td.all_gather_object, out, obj)
        return out

    def ordered_sum(self, part, n: int, like: torch.Tensor) -> torch.Tensor:
        """The sum of per-item tensors over items 0..n-1 dealt as `mine` deals them, added
        in item order on every rank (the bits one process gets; an all-reduce would add in
        another order). `part(i)` gives this rank's item i; `like` its shape, dtype and
        device."""
        total = torch.zeros_like(like)
        for j in range(0, n, self.world):
            own = j + self.rank
            here = part(own) if own < n else None
            for r in range(min(self.world, n - j)):
                if self.world == 1:
                    total.add_(here)
                    continue
                import torch.distributed as td

                t = here if r == self.rank else torch.empty_like(like)
                _together(td.broadcast, t, src=r)
                total.add_(t)
        return total


SINGLE = Group()


def launched() -> bool:
    """Whether torchrun started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: torch.device) -> Group:
    """Join the process group torchrun set up (once per process); one process: SINGLE."""
    if not launched():
        return SINGLE
    import torch.distributed as td

    if not td.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        td.init_process_group(backend=backend)
    return Group(td.get_rank(), td.get_world_size())


def finish() -> None:
    if launched():
        import torch.distributed as td

        if td.is_initialized():
            td.destroy_process_group()
