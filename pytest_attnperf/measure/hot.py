"""Hot mode's graph: how many back-to-back calls a sample holds (``hot_graph``), and the varying
inside it that gives each call contents of its own (``Varied``). docs/measurement.md, "Hot mode"."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["HOT_CALLS_PER_MS", "Varied", "hot_graph"]

Capture = Callable[[Callable[[], Any], int], tuple[Any, "str | None"]]


HOT_CALLS_PER_MS = 128  # hot mode's cap on a graph's calls, per ms of sample: 2560 at the default 20 ms,
# where a sub-8-us call reaches it (the graph's capture and outputs grow with its calls)


class Varied:
    """Hot mode's varying inside its graph: before each of the graph's calls, the first one or
    two elements of one input (``view``) are overwritten with a row of ``table`` (rows distinct,
    none the draw's own), and before the last call put back as the replay found them. So no two
    calls of a sample read the same contents (a cache the kernel keeps on the device, comparing
    its inputs with the last call's, misses on every call), and the last call reads the draw's
    own contents, which the checks after sampling hold its result to. A captured graph holds the
    raw addresses of ``saved`` and of each table, not the tensors: the object keeps them
    (``tables``, one for each graph length, which the timed graph and the copies' own share), and
    whoever replays the graphs keeps the object for as long. docs/measurement.md,
    "Hot mode", gives what it costs."""

    def __init__(self, x: Any) -> None:
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        self.name = f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}"
        self.width = 2 if x.ndim and x.shape[-1] >= 2 else 1
        self.view = x.narrow(-1, 0, self.width)[(0,) * (x.ndim - 1)] if x.ndim else x.reshape(1)
        self.saved = torch.empty_like(self.view)
        # distinct values of the input's dtype in [-2, 2], as fp32: width 2 gives len(values)**2 rows
        self.values = torch.unique(torch.linspace(-2, 2, 4096).to(x.dtype).float())
        self.dtype, self.device = x.dtype, x.device
        self.tables: dict[int, Any] = {}  # by calls: the table graphs of that many calls were captured over

    def distinct(self, calls: int) -> int:
        """How many distinct contents the ``calls`` calls of one replay read: each its own, while the
        dtype has values enough for the rows (``table``)."""
        rows: int = len(self.values) ** self.width
        return min(calls, rows)

    @classmethod
    def of(cls, x: Any) -> Varied | None:
        """The varying of input ``x``, or None where there is none to vary."""
        return cls(x) if x is not None and x.numel() else None

    def table(self, rows: int) -> Any:
        """``rows`` rows of ``width`` values, none equal to what ``view`` holds now, distinct
        while the dtype has values enough (two elements of bf16: 1,280 squared; one: 1,280, then
        they come round again)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        n = len(self.values)
        index = torch.arange(min(rows, n ** self.width) + 1)
        columns = [index // n % n, index % n] if self.width == 2 else [index % n]
        table = torch.stack([self.values[c] for c in columns], dim=-1)
        own = self.view.detach().float().cpu()
        table = table[~(table == own).all(dim=-1)]  # the draw's own row left out, if drawn
        table = table[torch.arange(rows) % len(table)]
        return table.to(device=self.device, dtype=self.dtype)

    def around(self, fn: Callable[[], Any], calls: int) -> Callable[[], None]:
        """``calls`` calls of ``fn``, each after its overwrite, to capture as one graph."""
        if calls not in self.tables:
            self.tables[calls] = self.table(max(calls - 1, 1))
        table = self.tables[calls]

        def body() -> None:
            self.saved.copy_(self.view)
            for k in range(calls):
                self.view.copy_(table[k] if k < calls - 1 else self.saved)
                fn()

        return body


def hot_graph(
    fn: Callable[[], Any], one_call: Any, one_ms: float, sample_ms: float,
    capture: Capture,
    varied: Varied | None = None,
) -> tuple[Any, int, int, str | None]:
    """Hot mode's graph: ``(graph, calls per sample, replays per sample, note)``.

    Enough back-to-back calls in one graph for a sample of about ``sample_ms`` (at most 64,
    or ``HOT_CALLS_PER_MS`` per ms of a sample longer than 0.5 ms),
    from ``one_ms``, the device time of one replay of ``one_call``. When that longer capture
    fails (the graph pool holds every call's outputs, so memory can run out), the one-call
    graph, which did capture, is replayed that many times per sample instead, and the note
    says so: the case stays graph-timed rather than falling back to eager launches, under its
    own clock name (``cuda-graph-replays``), since host-launched replays leave gaps between
    short calls that one long graph does not. With ``varied``, the longer graph overwrites part
    of an input before each call (``Varied``)."""
    most = max(64, math.ceil(HOT_CALLS_PER_MS * sample_ms))
    calls = max(1, min(most, math.ceil(sample_ms / max(one_ms, 1e-3))))
    if calls == 1:
        return one_call, 1, 1, None
    longer, failure = capture(*((varied.around(fn, calls), 1) if varied is not None else (fn, calls)))
    if longer is not None:
        return longer, calls, 1, None
    same = ", each call on the same contents" if varied is not None else ""
    return one_call, calls, calls, (f"a graph of {calls} calls failed ({failure}); each sample "
                                    f"replays the one-call graph {calls} times{same}")
