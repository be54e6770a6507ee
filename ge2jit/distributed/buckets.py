"""How gradients are grouped into all-reduce buckets. Pure Python."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ArgumentValueError

#: the default bucket size in bytes (DistributedDataParallel's default: 25 MiB)
BUCKET_BYTES = 25 * 2**20


def plan_buckets(nbytes: Sequence[int], bucket_bytes: int = BUCKET_BYTES,
                 kinds: Sequence | None = None, *,
                 first_bucket_bytes: int | None = None) -> list[list[int]]:
    """Gradients' indices grouped into buckets for all-reduces issued under the backward.

    The backward makes the last layer's gradients first, so the buckets take the indices
    from the last to the first: each bucket is filled until adding the next gradient would
    take it past ``bucket_bytes`` (a gradient larger than that is a bucket of its own), and
    a bucket holds gradients of one kind only (``kinds``: one hashable per gradient, such as
    its dtype; an all-reduce call reduces one type). The first bucket is complete as soon as
    the last layers' gradients exist, so its communication starts while the layers below
    are still differentiated; ``first_bucket_bytes`` (default ``bucket_bytes``) caps that
    first one, so that it starts sooner (DistributedDataParallel's is 1 MiB).

    Args:
        nbytes: each gradient's size in bytes, in the parameters' order (first layer first).
        bucket_bytes: the size a bucket fills up to (at least 1).
        kinds: None (all one kind) or one value per gradient.
        first_bucket_bytes: None or the size the first bucket fills up to (at least 1).

    Returns:
        Buckets in the order they complete, each a list of indices (descending).
    """
    first = bucket_bytes if first_bucket_bytes is None else first_bucket_bytes
    for name, value in (("bucket_bytes", bucket_bytes), ("first_bucket_bytes", first)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentValueError(f"{name}: expected a positive integer, got {value!r}")
    sizes = list(nbytes)
    for i, n in enumerate(sizes):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ArgumentValueError(f"nbytes: expected sizes in bytes (integers >= 0), got "
                                     f"{n!r} at index {i}")
    if kinds is not None and len(kinds) != len(sizes):
        raise ArgumentValueError(f"kinds: expected one per gradient ({len(sizes)}), got "
                                 f"{len(kinds)}")
    buckets: list[list[int]] = []
    filled = 0
    for i in reversed(range(len(sizes))):
        current = buckets[-1] if buckets else None
        same_kind = kinds is None or (current is not None and kinds[current[0]] == kinds[i])
        cap = first if len(buckets) == 1 else bucket_bytes
        if current is not None and same_kind and filled + sizes[i] <= cap:
            current.append(i)
            filled += sizes[i]
        else:
            buckets.append([i])
            filled = sizes[i]
    return buckets
