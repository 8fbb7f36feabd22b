"""ARM's edit of layer 0's MLP activations (the two variants of the package's docstring), on one row, on rows at
once and pooled over a batch: the same values on the host's path (kthvalue, only the moved elements hashed) and the
device's (a sort, every element hashed)."""

from __future__ import annotations

import math

from meaningless_tokens.arm.settings import ArmSettings
from meaningless_tokens.draws import uniforms

# the cut by kthvalue and hashes only the moved elements; elsewhere it selects by a sort and hashes every element.
# The values are the same (tests/test_arm.py checks both paths on the CPU).
ON_HOST = ("cpu",)


def _on_host(t) -> bool:
    """Whether the edit may read `t`'s counts on the host: not while torch.compile traces it (a value read there is a
    graph break), where the device path's values are the same."""
    import torch

    return t.device.type in ON_HOST and not torch.compiler.is_compiling()


def _kth(v, k: int):
    """The k-th smallest (0-based) element of a 1-D tensor."""
    import torch

    return torch.kthvalue(v, k + 1).values


def _quantile(v, q: float):
    """Linear-interpolation quantile (numpy's default, np.percentile's too) of a 1-D float32 tensor, without
    torch.quantile's limit of 2**24 elements."""
    import torch

    n_all = v.numel()
    pos = q * (n_all - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n_all - 1)
    if n_all - lo <= max(64, n_all // 16):
        # a high percentile (99.5 of a prompt's activations): one pass of topk over the tail, not two selections
        tail = torch.topk(v, n_all - lo, largest=True, sorted=True).values
        x_lo, x_hi = tail[-1], tail[-2] if hi > lo else tail[-1]
    else:
        x_lo = _kth(v, lo)
        x_hi = _kth(v, hi) if hi > lo and pos > lo else x_lo
    if hi == lo or pos == lo:
        return x_lo
    return x_lo + (x_hi - x_lo) * (pos - lo)


def _count(frac, n_all: int):
    """max(1, round(frac * n_all)) as Python computes it from float(frac): the float32 frac widened to float64, one
    float64 product, round half to even (torch.round's rule too); an int64 tensor of frac's shape."""
    import torch

    return torch.round(frac.double() * n_all).clamp_min(1).long()


def _moved_to(a, u, top, neg):
    """A moved element's new value: u * top where a is positive or +0, -u * |min a| where negative, -0.0 included.
    By the sign bit, not `a >= 0`: -0.0 is a negative activation that underflowed (GELU's and SiLU's tail far below
    zero), and which kernels round such an activation to -0.0 and which to -1e-7 differs between CPUs and kernel
    sets; by `>= 0` that rounding would send it to +u * top on one machine and -u * |min a| on another."""
    import torch

    return torch.where(torch.signbit(a), -u * neg, u * top)


def _first_n(absx, cut, n):
    """The n elements of smallest |a| along the last dimension, ties at the cut broken by position (the first
    ones move): all below the cut, then the first n - (count below) of those equal to it."""
    below = absx < cut
    tie = absx == cut
    return below | (tie & (tie.cumsum(-1) <= n - below.sum(-1, keepdim=True)))


def edit(v, s: ArmSettings, state, identity: bool = False):
    """ARM on the activations `v` (any shape; its statistics pool over all of v); returns a new tensor. `state`:
    the draws' `stream` (a Python int, or its lanes [2] on v's device); element i of v.reshape(-1) takes the uniform
    of index i.

    With `identity` every step runs but the moved elements get their own values back (a switch for tests:
    the hook then must change nothing)."""
    import torch

    flat = v.reshape(-1).float()
    n_all = flat.numel()
    absx = flat.abs()
    on_host = _on_host(flat)
    # |min a| over the negatives, 0 when there are none; order statistics by kthvalue and masks, never a full sort
    # on the host (a prompt's row holds tokens x channels elements: a sort of them costs more than the step)
    neg = (-flat.min()).clamp_min(0)
    if s.variant == "llama":
        med = _kth(absx, (n_all - 1) // 2)                # torch.median: the lower median
        mad = _kth((absx - med).abs_(), (n_all - 1) // 2).clamp_min(1e-12)
        eps = 1.4826 * mad * s.c
        share = (absx < eps).float().mean()
        n = _count(torch.clamp(s.k * share, min=s.pmin, max=s.pmax), n_all).reshape(1)
        if on_host:
            cut = _kth(absx, int(n) - 1)                  # the n-th smallest |a|
        else:  # n stays on the device: the sorted |a| at n - 1
            cut = torch.sort(absx).values.gather(0, n - 1)[0]
        moved = _first_n(absx, cut, n)
        top = _quantile(flat, s.percentage / 100)
    else:
        moved = absx <= _quantile(absx, min(max(s.c, 0.0), 1.0))  # ties included
        top = _quantile(absx, s.percentage)
    if on_host:
        idx = torch.nonzero(moved).flatten()
        picked = flat[idx]
        u = uniforms(state, idx)
        new = picked if identity else _moved_to(picked, u, top, neg)
        out = v.reshape(-1).clone()
        out[idx] = new.to(v.dtype)
        return out.view_as(v)
    u = uniforms(state, torch.arange(n_all, device=flat.device))
    new = flat if identity else _moved_to(flat, u, top, neg)
    return torch.where(moved, new.to(v.dtype), v.reshape(-1)).view_as(v)


def edit_rows(v, s: ArmSettings, states, identity: bool = False):
    """`edit` of each row of `v` ([rows, ...], statistics per row over all its elements) in one set of batched
    operations: a decode step's rows (every position real) cost about one row's operations, not one per row.
    `states`: lanes [rows, 2] of each row's `stream` on v's device. Equals `edit` row by row exactly (the same
    order statistics, the same float32 arithmetic, the same draws)."""
    import torch

    rows = v.shape[0]
    flat = v.reshape(rows, -1).float()
    n_all = flat.shape[1]
    absx = flat.abs()
    neg = (-flat.min(dim=1).values).clamp_min(0)
    if s.variant == "llama":
        half = (n_all - 1) // 2
        med = torch.kthvalue(absx, half + 1, dim=1).values
        mad = torch.kthvalue((absx - med[:, None]).abs_(), half + 1, dim=1).values.clamp_min(1e-12)
        eps = 1.4826 * mad * s.c
        share = (absx < eps[:, None]).float().mean(dim=1)
        n = _count(torch.clamp(s.k * share, min=s.pmin, max=s.pmax), n_all)[:, None]
        if _on_host(flat):  # a selection per row costs less than one sort of them all
            cut = torch.stack([torch.kthvalue(x, k).values for x, k in zip(absx, n[:, 0].tolist())])[:, None]
        else:
            cut = torch.sort(absx, dim=1).values.gather(1, n - 1)
        moved = _first_n(absx, cut, n)
        top = _quantile_rows(flat, s.percentage / 100)
    else:
        moved = absx <= _quantile_rows(absx, min(max(s.c, 0.0), 1.0))[:, None]
        top = _quantile_rows(absx, s.percentage)
    if identity:
        return v.clone()
    if _on_host(flat):
        r, i = torch.nonzero(moved, as_tuple=True)
        picked = flat[r, i]
        u = uniforms(states[r], i[:, None])[:, 0]
        out = v.reshape(rows, -1).clone()
        out[r, i] = _moved_to(picked, u, top[r], neg[r]).to(v.dtype)
        return out.view_as(v)
    u = uniforms(states, torch.arange(n_all, device=flat.device)[None, :])
    new = _moved_to(flat, u, top[:, None], neg[:, None])
    return torch.where(moved, new.to(v.dtype), v.reshape(rows, -1)).view_as(v)


def _quantile_rows(v, q: float):
    """`_quantile` of each row of a 2-D float32 tensor."""
    import torch

    pos = q * (v.shape[1] - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, v.shape[1] - 1)
    x_lo = torch.kthvalue(v, lo + 1, dim=1).values
    if hi == lo or pos == lo:
        return x_lo
    return x_lo + (torch.kthvalue(v, hi + 1, dim=1).values - x_lo) * (pos - lo)


def _sorted_masked(x, mask):
    """x's elements under `mask` ascending, in front of +inf for every other element (x flattened, static shape)."""
    import torch

    return torch.sort(torch.where(mask, x, float("inf")).reshape(-1)).values


def _quantile_sorted(values, n, q: float):
    """`_quantile` of the first n (a 0-d int64 tensor) of the ascending `values`: its float64 position, floor and
    weight as Python computes them, the weight rounded to float32 as a Python float's product with a float32 tensor is."""
    import torch

    pos = (n - 1).double() * q
    lo = torch.floor(pos)
    hi = torch.minimum(lo + 1, (n - 1).double())
    x_lo = values.gather(0, lo.long().clamp_min(0).reshape(1))[0]
    x_hi = values.gather(0, hi.long().clamp_min(0).reshape(1))[0]
    return torch.where((hi == lo) | (pos == lo), x_lo, x_lo + (x_hi - x_lo) * (pos - lo).float())


def edit_pooled(v, keep, s: ArmSettings, state, identity: bool = False):
    """`edit` of the rows of `v` ([rows, ...]) that the bool tensor `keep` [rows] marks, pooled over all their elements
    in batch order (`pool: batch`): equals `edit(v[keep], ...)` on those rows exactly, the other rows untouched, but
    every shape and count stays a tensor, so the one traced graph serves every set of rows (order statistics by one
    sort with the other rows' elements at +inf, never a count read on the host). `state`: the draws' lanes [2]."""
    import torch

    rows = v.shape[0]
    flat = v.reshape(rows, -1).float()
    per = flat.shape[1]
    mask = keep[:, None].expand_as(flat)
    n_all = keep.sum() * per
    absx = flat.abs()
    neg = (-torch.where(mask, flat, float("inf")).min()).clamp_min(0)

    def kth(values, k):  # the k-th smallest (0-based) of the sorted `values`
        return values.gather(0, k.clamp_min(0).reshape(1))[0]

    abs_sorted = _sorted_masked(absx, mask)
    if s.variant == "llama":
        half = torch.div(n_all - 1, 2, rounding_mode="floor")
        med = kth(abs_sorted, half)
        mad = kth(_sorted_masked((absx - med).abs_(), mask), half).clamp_min(1e-12)
        eps = 1.4826 * mad * s.c
        # the mean over the pooled elements: an exact float32 count over their number, as torch's CPU mean divides
        # (no pooled element: 0, not 0 / 0, whose NaN count would index nowhere)
        share = ((absx < eps) & mask).sum().float() / n_all.clamp_min(1).float()
        n = _count(torch.clamp(s.k * share, min=s.pmin, max=s.pmax), n_all).reshape(1)
        cut = kth(abs_sorted, n - 1)
        masked = torch.where(mask, absx, float("inf")).reshape(-1)  # other rows never below or at the cut
        moved = _first_n(masked, cut, n).view(rows, per)
        top = _quantile_sorted(_sorted_masked(flat, mask), n_all, s.percentage / 100)
    else:
        moved = absx <= _quantile_sorted(abs_sorted, n_all, min(max(s.c, 0.0), 1.0))  # ties included
        top = _quantile_sorted(abs_sorted, n_all, s.percentage)
    if identity:
        return v.clone()
    rank = (keep.long().cumsum(0) - 1).clamp_min(0)  # each kept row's place among the kept rows
    u = uniforms(state, rank[:, None] * per + torch.arange(per, device=flat.device)[None, :])
    new = _moved_to(flat, u, top, neg)
    return torch.where(mask & moved, new.to(v.dtype), v.reshape(rows, -1)).view_as(v)
