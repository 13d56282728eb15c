"""torch's intra-op thread count for a block of work, with the caller's count put back after it.

One definition for every place that runs tiny tensors on one thread inside a longer-lived process
(rtpo compare's in-process jobs, rtpo verify's report figures, the test fixtures): a bare
`torch.set_num_threads` there would hold for whatever the process does next.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch with `n` intra-op threads inside the block; the count it had is restored on the way out."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
