"""Counter-based draws: every random number a pure function of (seed, what it is for, its index), computed in integer
arithmetic on the device that holds the tensor, so every device draws the same numbers and no device generator is used.
ARM's edit (meaningless_tokens/arm/) and seeded sampling (meaningless_tokens/sampling.py) draw from it."""

from __future__ import annotations

# absorbing, one word at a time, h = splitmix64(h xor word): h starts at arm.seed (mod 2**64), then takes the
# edit's key (per row pooled: its length, then its words), the step and the element's index; u = the top 24 bits
# of h / 2**24, a float32 on [0, 1). A pure function of those integers, so every device draws the same numbers.
# The host folds the words it knows (`stream`) in Python ints; the device folds the rest (`uniforms`).

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix(x: int) -> int:
    z = (x + _GAMMA) & _M64
    z = ((z ^ (z >> 30)) * _MIX1) & _M64
    z = ((z ^ (z >> 27)) * _MIX2) & _M64
    return z ^ (z >> 31)


def absorb(h: int, *words: int) -> int:
    """The state h after absorbing `words` (Python ints, taken mod 2**64)."""
    for w in words:
        h = _splitmix(h ^ (w & _M64))
    return h


def row_key(row) -> tuple:
    """A row's key: its problem index (greedy), or (problem index, sample index) for a sampled output."""
    return row if isinstance(row, tuple) else (row,)


def key_state(seed: int, keys: list) -> int:
    """The state after arm.seed and the keys of the rows one edit pools (one row's under `pool: row`; the arm
    rows' keys in batch order under `pool: batch`), each key as its length and then its words."""
    h = seed & _M64
    for key in keys:
        h = absorb(h, len(key), *key)
    return h


def stream(seed: int, keys: list, step: int) -> int:
    """The state of one edit's draws: (arm.seed, the pooled rows' keys, step), step 0 being the prompt and step t
    the t-th decode step; `edit` takes it, and `lanes` of several make `edit_rows`' states."""
    return absorb(key_state(seed, keys), step)


def lanes(states: list[int]):
    """States as a CPU int64 tensor [len, 2] of their 32-bit halves (high, low): torch has no uint64."""
    import torch

    return torch.tensor([[h >> 32, h & _M32] for h in states], dtype=torch.int64).reshape(-1, 2)


# torch has no unsigned 64-bit integers, and int64 overflow is undefined in its kernels: a 64-bit state is two
# 32-bit lanes (hi, lo) held in int64, and every product is a 32-bit lane times a 16-bit half of a constant
# (< 2**48), so no intermediate reaches 2**63 and every value stays non-negative: right shifts never drag in a
# sign bit, and a mask after each sum and shifted-left term keeps a lane at 32 bits. The same code runs on Python
# ints (a host state) and on tensors of any device.

def _mul32(x, c: int):
    """x * c mod 2**32 (x a 32-bit lane, c a 32-bit constant)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mul64(hi, lo, c: int):
    """(hi, lo) * c mod 2**64."""
    c_hi, c_lo = c >> 32, c & _M32
    t, u = lo * (c_lo & 0xFFFF), lo * (c_lo >> 16)
    s = t + ((u & 0xFFFF) << 16)
    carry = (s >> 32) + (u >> 16)  # the high half of lo * c_lo
    return (carry + _mul32(hi, c_lo) + _mul32(lo, c_hi)) & _M32, s & _M32


def _xorshift(hi, lo, k: int):
    """(hi, lo) ^ ((hi, lo) >> k), 0 < k < 32."""
    return hi ^ (hi >> k), lo ^ ((((hi << (32 - k)) & _M32) | (lo >> k)))


def _absorb_lanes(hi, lo, w_hi, w_lo):
    """`absorb` of one word on lanes: splitmix64(h xor w)."""
    hi, lo = hi ^ w_hi, lo ^ w_lo
    lo = lo + (_GAMMA & _M32)
    hi = (hi + (_GAMMA >> 32) + (lo >> 32)) & _M32
    lo = lo & _M32
    hi, lo = _mul64(*_xorshift(hi, lo, 30), _MIX1)
    hi, lo = _mul64(*_xorshift(hi, lo, 27), _MIX2)
    return _xorshift(hi, lo, 31)


def _state_lanes(state):
    """A state (a Python int, or int64 lanes [..., 2] on a device) as (hi, lo) broadcasting over elements [..., n]."""
    if isinstance(state, int):
        return state >> 32, state & _M32
    return state[..., 0:1], state[..., 1:2]


def uniforms(state, index):
    """The uniforms (float32 on [0, 1)) of elements `index` (int64 tensor, >= 0) under `state` (a Python int from
    `stream`, or lanes [2] / [rows, 2] for index [n] / [rows, n]); computed on index's device."""
    import torch

    hi, lo = _state_lanes(state)
    hi, _ = _absorb_lanes(hi, lo, index >> 32, index & _M32)
    return (hi >> 8).to(torch.float32) * (1.0 / (1 << 24))


def step_states(base, step):
    """Lanes [rows, 2] of the states at `step` (a Python int, or a 0-d int64 tensor on base's device: the hook's
    clock) from lanes [rows, 2] of `key_state`s, on their device (no copy)."""
    import torch

    return torch.cat(_absorb_lanes(base[:, 0:1], base[:, 1:2], step >> 32, step & _M32), dim=1)


# ---- the edit --------------------------------------------------------------------------------------

# device types whose tensors the host reads without waiting for a device: there the edit reads its count to select
