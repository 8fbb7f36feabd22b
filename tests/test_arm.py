"""ARM (meaningless_tokens/arm/): the edit against the paper's pseudo-code, its draws against a NumPy reference,
the hook's row isolation, seeding and padding invariance, no host-device synchronisation at a decode step, an
identity hook that changes nothing, and bad input refused before any work."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from meaningless_tokens import arm, draws, engines, hooks, measures, models, scoring
from meaningless_tokens.arm import redistribution
from stages import activations, evaluate
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.prompts import builder_for
from meaningless_tokens.store import read_h5

SEED = 1234


# ---- the draws against a NumPy reference -------------------------------------------------------------

def ref_splitmix64(x):
    """splitmix64's output for state x (uint64 array): Steele, Lea and Flood's mixer, in numpy's wrapping uint64."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def ref_uniforms(seed, keys, step, index):
    """u of elements `index`: h = seed, then h = splitmix64(h ^ w) for each word (each pooled key's length and
    words, the step, the element index); the top 24 bits / 2**24."""
    h = np.full(len(index), seed % 2**64, dtype=np.uint64)
    for w in [x for key in keys for x in (len(key), *key)] + [step]:
        h = ref_splitmix64(h ^ np.uint64(w))
    h = ref_splitmix64(h ^ np.asarray(index, dtype=np.uint64))
    return (h >> np.uint64(40)).astype(np.float32) / np.float32(2**24)


def test_the_reference_is_splitmix64():
    # the generator's published first outputs from state 0
    np.testing.assert_array_equal(ref_splitmix64([0, 0x9E3779B97F4A7C15]),
                                  np.array([0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4], dtype=np.uint64))


@pytest.mark.parametrize("seed", [0, SEED, 2**63 + 5, 2**64 - 1])
def test_draws_equal_a_numpy_reference(seed):
    """Every element's uniform, on the host (a Python state) and on lanes (what the device gets), bit for bit."""
    index = [0, 1, 2, 3, 1000, 2**24 + 3, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40 + 12345, 2**62 + 7, 2**63 - 1]
    t = torch.tensor(index, dtype=torch.int64)
    for keys in ([(0,)], [(17,)], [(3, 2)], [(499, 4)], [(17,), (4,)], [(5,), (6, 1), (7,)]):
        for step in (0, 1, 2, 2047, 2**40):
            want = ref_uniforms(seed, keys, step, index)
            state = draws.stream(seed, keys, step)
            np.testing.assert_array_equal(draws.uniforms(state, t).numpy(), want)
            np.testing.assert_array_equal(draws.uniforms(draws.lanes([state])[0], t).numpy(), want)
            base = draws.lanes([draws.key_state(seed, keys)] * 2)
            stepped = draws.step_states(base, step)
            assert torch.equal(stepped, draws.lanes([state] * 2))
            np.testing.assert_array_equal(draws.uniforms(stepped, t[None, :].expand(2, -1)).numpy(), [want, want])


def test_draws_are_uniform_and_distinct_per_key_step_and_seed():
    u = draws.uniforms(draws.stream(SEED, [(0,)], 0), torch.arange(1 << 20)).numpy()
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    counts = np.histogram(u, bins=16, range=(0, 1))[0]
    assert np.abs(counts - len(u) / 16).max() < 6 * np.sqrt(len(u) / 16)  # 6 sigma of a binomial count
    first = [draws.uniforms(draws.stream(seed, keys, step), torch.arange(64)).numpy()
             for seed, keys, step in ((SEED, [(0,)], 0), (SEED + 1, [(0,)], 0), (SEED, [(1,)], 0), (SEED, [(0,)], 1),
                                      (SEED, [(0, 0)], 0), (SEED, [(0,), (0,)], 0))]
    assert all(not np.array_equal(a, b) for i, a in enumerate(first) for b in first[i + 1:])


# ---- the edit on fixed tensors against a direct implementation of the paper's pseudo-code ---------------

def paper_llama(a, c, percentage, k, pmin, pmax, u):
    """notes/paper-method.md section 2, Qwen2/Llama variant, in numpy; `u(idx)` gives the uniforms of elements idx."""
    x = a.ravel().astype(np.float32)
    absx = np.abs(x)
    med = np.sort(absx)[(x.size - 1) // 2]                                # torch.median: the lower median
    mad = max(np.sort(np.abs(absx - med))[(x.size - 1) // 2], np.float32(1e-12))
    eps = np.float32(np.float32(1.4826) * mad) * np.float32(c)
    share = np.float32(np.mean(absx < eps))
    frac = float(np.clip(np.float32(k) * share, np.float32(pmin), np.float32(pmax)))
    n = max(1, int(round(frac * x.size)))
    top = np.percentile(x, percentage)
    neg = abs(x[x < 0].min()) if (x < 0).any() else 0.0
    idx = np.sort(np.argsort(absx, kind="stable")[:n])  # ties at the cut by position
    s = np.where(np.signbit(x[idx]), -1.0, 1.0).astype(np.float32)  # +0 counts as +1, -0.0 as -1 (its sign bit)
    uu = u(idx)
    out = x.copy()
    out[idx] = s * np.where(s > 0, uu * top, uu * neg)
    return out.reshape(a.shape), idx


def paper_gemma(a, c, percentage, u):
    """The Gemma 3 variant: the c-quantile of |a| as the cut (ties included), top the percentage-quantile."""
    x = a.ravel().astype(np.float32)
    absx = np.abs(x)
    idx = np.nonzero(absx <= np.float32(np.quantile(absx, c)))[0]
    top = np.quantile(absx, percentage)
    neg = abs(x[x < 0].min()) if (x < 0).any() else 0.0
    s = np.where(np.signbit(x[idx]), -1.0, 1.0).astype(np.float32)  # +0 counts as +1, -0.0 as -1 (its sign bit)
    uu = u(idx)
    out = x.copy()
    out[idx] = s * np.where(s > 0, uu * top, uu * neg)
    return out.reshape(a.shape), idx


def fixed_tensors():
    rng = np.random.default_rng(7)
    smooth = (rng.standard_normal((6, 40)) * 0.3).astype(np.float32)
    ties = np.round(smooth, 1).astype(np.float32)             # many equal |a|, and exact zeros, at the cut
    ties[0, :7] = 0.0
    positive = np.abs(smooth) + np.float32(0.01)               # no negatives: |min a| = 0
    silu = (smooth / (1 + np.exp(-smooth))).astype(np.float32)  # the shape ARM sees on SiLU models
    underflow = silu.copy()  # activations far below zero rounded to -0.0, beside exact +0's
    underflow[:, :5] = -0.0
    underflow[1, 5:8] = 0.0
    return {"smooth": smooth, "ties": ties, "positive": positive, "silu": silu, "underflow": underflow}


def settings(variant, c, percentage, k=1.0, pmin=0.02, pmax=0.25, pool="row", apply="all"):
    return arm.ArmSettings(variant, c, percentage, k, pmin, pmax, pool, apply, SEED, {})


@pytest.fixture(params=["host", "device"])
def path(request, monkeypatch):
    """The edit's two paths, both run on the CPU: `host` (the CPU's: kthvalue at a count read on the host, draws
    at the moved elements only) and `device` (any other device's: no value read back, every element hashed)."""
    monkeypatch.setattr(redistribution, "ON_HOST", ("cpu",) if request.param == "host" else ())
    return request.param


@pytest.mark.parametrize("name", list(fixed_tensors()))
@pytest.mark.parametrize("variant,c,percentage,pmin,pmax", [
    ("llama", 0.13, 99.5, 0.02, 0.25), ("llama", 0.32, 90.0, 0.20, 0.25), ("llama", 2.0, 50.0, 0.02, 0.9),
    ("gemma", 0.25, 0.85, 0.02, 0.25), ("gemma", 0.5, 0.3, 0.02, 0.25)])
def test_edit_equals_the_papers_pseudo_code(name, variant, c, percentage, pmin, pmax, path):
    a = fixed_tensors()[name]
    s = settings(variant, c, percentage, pmin=pmin, pmax=pmax)
    got = arm.edit(torch.from_numpy(a), s, draws.stream(SEED, [(5,)], 3)).numpy()
    reference = lambda idx: ref_uniforms(SEED, [(5,)], 3, idx)  # noqa: E731
    want, idx = (paper_llama(a, c, percentage, 1.0, pmin, pmax, reference) if variant == "llama"
                 else paper_gemma(a, c, percentage, reference))
    moved = np.zeros(a.size, bool)
    moved[idx] = True
    assert moved.sum() >= 1
    np.testing.assert_array_equal(got.ravel()[~moved], a.ravel()[~moved])   # everything else untouched
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    if name == "positive":
        assert (got >= 0).all()  # no negatives: moved elements stay on [0, top]
    if name == "ties" and variant == "gemma":
        cut = np.quantile(np.abs(a), c)
        assert moved.sum() == (np.abs(a) <= cut).sum() > round(c * a.size)  # ties at the cut all move


@pytest.mark.parametrize("variant,c,percentage", [("llama", 0.13, 99.5), ("gemma", 0.25, 0.85)])
def test_an_activation_that_underflowed_moves_where_its_unrounded_value_does(variant, c, percentage, path):
    """A negative activation that one CPU's kernels round to -0.0 and another's to -1e-7 (GELU's and SiLU's tail far
    below zero) moves to the same side on both, -u * |min a|: by the sign bit, not `a >= 0`, which sent -0.0 to
    +u * top and made ARM's log-likelihoods differ between machines by whole tenths of a nat."""
    a = fixed_tensors()["silu"].copy()
    here, there = a.copy(), a.copy()
    here[:, :5], there[:, :5] = -0.0, np.float32(-1e-7)
    s = settings(variant, c, percentage)
    state = draws.stream(SEED, [(5,)], 0)
    got = [arm.edit(torch.from_numpy(x), s, state).numpy() for x in (here, there)]
    assert (got[0][:, :5] < 0).all() and (got[1][:, :5] < 0).all()
    np.testing.assert_array_equal(got[0], got[1])


@pytest.mark.parametrize("variant,c,percentage", [("llama", 0.13, 99.5), ("llama", 2.0, 50.0), ("gemma", 0.25, 0.85)])
def test_batched_rows_equal_the_edit_row_by_row(variant, c, percentage, path):
    """edit_rows (a decode step's rows at once) is `edit` of each row, bit for bit, ties and all."""
    t = fixed_tensors()
    v = torch.from_numpy(np.concatenate([t["smooth"], t["ties"], t["positive"], t["silu"], t["underflow"]])[:, None, :])
    s = settings(variant, c, percentage, pmax=0.9 if c == 2.0 else 0.25)
    states = [draws.stream(SEED, [(k,)], 1 + k % 3) for k in range(len(v))]
    rows = arm.edit_rows(v, s, draws.lanes(states))
    assert torch.equal(rows, torch.stack([arm.edit(v[r], s, st) for r, st in enumerate(states)]))
    assert torch.equal(arm.edit_rows(v, s, draws.lanes(states), identity=True), v)


@pytest.mark.parametrize("variant,c,percentage", [("llama", 0.13, 99.5), ("llama", 2.0, 50.0), ("gemma", 0.25, 0.85)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_host_path_equals_the_device_path(variant, c, percentage, dtype, monkeypatch):
    """What a GPU computes (every element hashed, the cut by a sort at a count kept on the device) equals what the
    CPU computes, bit for bit: a whole prompt's edit (llama's count rounded half to even) and a decode step's rows."""
    rng = np.random.default_rng(3)
    prompt = torch.from_numpy(rng.standard_normal((37, 96)).astype(np.float32)).to(dtype)
    rows = torch.from_numpy(np.concatenate([v for v in fixed_tensors().values()])[:, None, :]).to(dtype)
    s = settings(variant, c, percentage, pmax=0.9 if c == 2.0 else 0.25)
    states = draws.lanes([draws.stream(SEED, [(k, 2)], 4) for k in range(len(rows))])
    got = {}
    for on_host in (("cpu",), ()):
        monkeypatch.setattr(redistribution, "ON_HOST", on_host)
        got[on_host] = (arm.edit(prompt, s, draws.stream(SEED, [(9,)], 0)), arm.edit_rows(rows, s, states))
    for host, device in zip(got[("cpu",)], got[()]):
        assert host.dtype == dtype and torch.equal(host, device)


def test_count_rounds_as_python_does():
    """n = max(1, round(frac * N)) from a float32 frac: halves to even, the float64 product's own rounding."""
    fracs = np.array([0.25, 0.125, 0.375, 0.2, 0.02, 1e-9, 0.1, 0.3, 0.7], dtype=np.float32)
    for n_all in (1, 2, 3, 4, 10, 12, 40, 401, 1536, 8960 * 37, 18944 * 2048 + 1):
        want = [max(1, int(round(float(f) * n_all))) for f in fracs]
        assert redistribution._count(torch.from_numpy(fracs), n_all).tolist() == want


@pytest.mark.parametrize("variant,c,percentage", [("llama", 0.13, 99.5), ("gemma", 0.25, 0.85)])
def test_a_swap_at_the_cut_changes_the_two_swapped_elements_only(variant, c, percentage, path):
    """One element sits at the cut (the last to move), its partner one float above it (the first to stay), the two
    at the row's ends with about a quarter of the elements moving between them. Moving the one just across (the
    partner's value) and the partner the other way changes those two outputs and no other: every element has its
    own draw, not the next one in position order."""
    s = settings(variant, c, percentage, pmin=0.2, pmax=0.2)  # llama: n = 80 whatever the share near zero
    x = np.random.default_rng(11).standard_normal(401).astype(np.float32)
    state = draws.stream(SEED, [(2,)], 0)
    moved = (arm.edit(torch.from_numpy(x), s, state).numpy() != x)
    cut = np.flatnonzero(moved)[np.argmax(np.abs(x[moved]))]
    partner = np.flatnonzero(~moved)[np.argmin(np.abs(x[~moved]))]
    rest = [i for i in range(len(x)) if i not in (cut, partner)]
    x = x[[cut, *rest, partner]]  # to the ends: the other moved ones lie between
    x[-1] = np.sign(x[0]) * np.nextafter(np.abs(x[0]), np.float32(np.inf))
    before = arm.edit(torch.from_numpy(x), s, state).numpy()
    assert before[0] != x[0] and before[-1] == x[-1] and 50 < (before[1:-1] != x[1:-1]).sum() < 200
    y = x.copy()
    y[0], y[-1] = x[-1], x[0]
    after = arm.edit(torch.from_numpy(y), s, state).numpy()
    assert after[0] == y[0] and after[-1] != y[-1]  # the two changed sides
    np.testing.assert_array_equal(after[1:-1], before[1:-1])


def test_hook_edits_only_arm_rows_over_their_valid_positions(path):
    """The hook on a [batch, T, I] tensor: arm rows get `edit` of their non-pad positions with the draws of (seed,
    problem index, step 0); pad positions and the other rows keep their values."""
    torch.manual_seed(0)
    a = torch.randn(3, 5, 16)
    valid = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    s = settings("llama", 0.13, 99.5, pmin=0.1)
    mlp = torch.nn.Module()
    mlp.act_fn = torch.nn.SiLU()
    hook = arm.ArmHook(mlp, s)
    hook.begin([17, None, 4], valid)
    out = hook(None, (), a)
    for r, problem in ((0, 17), (2, 4)):
        assert torch.equal(out[r, valid[r]], arm.edit(a[r, valid[r]], s, draws.stream(SEED, [(problem,)], 0)))
        assert torch.equal(out[r, ~valid[r]], a[r, ~valid[r]])
        assert not torch.equal(out[r], a[r])
    assert torch.equal(out[1], a[1])
    hook.settings = arm.ArmSettings(**{**s.describe(), "seed": 9})
    hook.begin([17, None, 4], valid)
    assert not torch.equal(hook(None, (), a)[0], out[0])  # arm.seed reaches the draws
    hook.settings = s
    hook.begin([17, None, 4], valid)
    hook(None, (), a)
    # a decode step (step 1): every position is real; prefill-only leaves it alone
    step1 = hook(None, (), a[:, :1])
    assert torch.equal(step1[0], arm.edit(a[0, :1], s, draws.stream(SEED, [(17,)], 1)))
    assert torch.equal(step1[2], arm.edit(a[2, :1], s, draws.stream(SEED, [(4,)], 1)))
    assert torch.equal(step1[1], a[1, :1])
    hook.settings = settings("llama", 0.13, 99.5, apply="prefill")
    assert hook(None, (), a[:, :1]) is None
    # pool: batch, the paper's pooling: one edit over every position (pads included) of the batch's arm rows, its
    # key the arm rows' keys in batch order
    hook.settings = settings("llama", 0.13, 99.5, pool="batch")
    hook.begin([17, None, 4], valid)
    pooled = hook(None, (), a)
    want = arm.edit(a[[0, 2]], hook.settings, draws.stream(SEED, [(17,), (4,)], 0))
    assert torch.equal(pooled[[0, 2]], want) and torch.equal(pooled[1], a[1])
    pooled1 = hook(None, (), a[:, :1])
    assert torch.equal(pooled1[[0, 2]], arm.edit(a[[0, 2], :1], hook.settings, draws.stream(SEED, [(17,), (4,)], 1)))
    # a sampled row's key is (problem index, sample index)
    hook.settings = s
    hook.begin([(17, 2), None, None], valid)
    assert torch.equal(hook(None, (), a)[0, 2:], arm.edit(a[0, 2:], s, draws.stream(SEED, [(17, 2)], 0)))


def test_a_left_padded_arm_row_edits_as_the_same_prompt_alone(path):
    """Row isolation by construction: the statistics and the element indices run over the real tokens only, so an arm
    row left-padded among longer rows gets, at the prompt and at every decode step, what it gets alone; pads and the
    none row keep their values."""
    torch.manual_seed(1)
    a = torch.randn(4, 9, 24)
    valid = torch.ones(4, 9, dtype=torch.bool)
    valid[1, :3] = valid[3, :5] = False
    valid[2, 4] = False  # a hole (no engine makes one): the row is its real positions all the same
    mlp = torch.nn.Module()
    mlp.act_fn = torch.nn.SiLU()
    for s in (settings("llama", 0.13, 99.5, pmin=0.1), settings("gemma", 0.25, 0.85)):
        together, alone = arm.ArmHook(mlp, s), arm.ArmHook(mlp, s)
        together.begin([None, 7, (3, 1), 5], valid)
        out = together(None, (), a)
        assert torch.equal(out[0], a[0]) and torch.equal(out[~valid], a[~valid])
        for r, row in ((1, 7), (2, (3, 1)), (3, 5)):
            real = valid[r]
            alone.begin([row], valid[r:r + 1, real])
            assert torch.equal(alone(None, (), a[r:r + 1, real])[0], out[r, real])
            alone.begin([row])  # no mask: every position real
            assert torch.equal(alone(None, (), a[r:r + 1, real])[0], out[r, real])
        for step in range(1, 4):
            d = torch.randn(4, 1, 24)
            out = together(None, (), d)
            for r, row in ((1, 7), (2, (3, 1)), (3, 5)):
                alone.begin([row])
                alone.step = step
                assert torch.equal(alone(None, (), d[r:r + 1])[0], out[r])


# ---- no host-device synchronisation ---------------------------------------------------------------------

class Syncs:
    """Counts the Python-level calls that copy a device tensor's values to the host, or upload to a device, while
    the hook runs (on a CPU tensor: on a GPU each would wait for the device)."""

    METHODS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(getattr(torch.Tensor, name), name))
        monkeypatch.setattr(torch, "nonzero", self.counted(torch.nonzero, "torch.nonzero"))
        tensor, to = torch.tensor, torch.Tensor.to

        def new_tensor(*args, **kwargs):
            if kwargs.get("device") is not None:
                self.calls.append("torch.tensor(device=)")
            return tensor(*args, **kwargs)

        def moved(t, *args, **kwargs):
            if kwargs.get("device") is not None or any(isinstance(x, (str, torch.device)) for x in args):
                self.calls.append(".to(device)")  # an upload, or a copy back, on a GPU
            return to(t, *args, **kwargs)

        monkeypatch.setattr(torch, "tensor", new_tensor)
        monkeypatch.setattr(torch.Tensor, "to", moved)

    def counted(self, f, name):
        def wrapper(*args, **kwargs):
            self.calls.append(name)
            return f(*args, **kwargs)
        return wrapper

    def during(self, f, *args) -> list[str]:
        self.calls = []
        f(*args)
        return self.calls


@pytest.mark.parametrize("variant", ["llama", "gemma"])
@pytest.mark.parametrize("pool", ["row", "batch"])
def test_no_host_sync_at_a_decode_step_and_a_constant_at_the_prompt(variant, pool, monkeypatch):
    monkeypatch.setattr(redistribution, "ON_HOST", ())  # the device path, on the CPU
    s = settings(variant, 0.13 if variant == "llama" else 0.25, 99.5 if variant == "llama" else 0.85, pool=pool)
    mlp = torch.nn.Module()
    mlp.act_fn = torch.nn.SiLU()
    hook = arm.ArmHook(mlp, s)
    torch.manual_seed(2)
    syncs = Syncs(monkeypatch)
    at_prompt = []
    for rows in ([5, None, 6, None], [None, 1, 2, 3, 4, 5, 6, None], [(1, 0), None, 2, 3, None, (4, 1), 5, 6]):
        valid = torch.ones(len(rows), 7, dtype=torch.bool)
        valid[::2, :3] = False  # left padding
        valid[1, 4] = rows[1] is None  # an arm row with a hole: its real positions go to the device
        hook.begin(rows, valid)
        at_prompt.append(syncs.during(hook, None, (), torch.randn(len(rows), 7, 32)))
        for _ in range(3):
            assert syncs.during(hook, None, (), torch.randn(len(rows), 1, 32)) == []
    # the mask to the host (.cpu, .numpy), the rows' key states to the device, the holes' positions to the device
    assert all(len(calls) <= 4 for calls in at_prompt), at_prompt
    assert at_prompt[0] == at_prompt[2], at_prompt  # 2 or 6 arm rows: the same calls


def test_teacher_forcing_copies_once_per_call(monkeypatch):
    monkeypatch.setattr(redistribution, "ON_HOST", ())
    mlp = torch.nn.Module()
    mlp.act_fn = torch.nn.SiLU()
    hook = scoring.TeacherForcedArm(mlp, settings("llama", 0.13, 99.5))
    syncs = Syncs(monkeypatch)
    for rows in ([(3, 4, range(1, 7)), None], [(3, 4, range(1, 7)), (5, 2, [1, 2, 2, 3]), None, (8, 6, range(1, 5))]):
        hook.begin(rows)
        assert syncs.during(hook, None, (), torch.randn(len(rows), 10, 32)) == [".to(device)"]
# ---- on tiny models of three families ------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One model cache for this file's tests: each tiny model is prepared (converted and probed) once."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("arm-model-cache")
    mp.setenv("MLESS_CACHE", str(path))
    yield path
    mp.undo()


def arm_params(write_params, tiny_dirs, arch, conditions=("none", "mless", "mful", "arm"), arm_cfg=None, model_arm=None,
               **evaluate_cfg):
    raw = load_params(write_params()).model_dump()
    raw["runtime"]["threads"] = 1  # tiny models: one thread is fastest, and fair on a busy machine
    raw["prompt"]["conditions"] = list(conditions)
    raw["evaluate"].update(dict(n_samples=4, max_new_tokens=12, batch_size=8, stop_at_boxed=False) | evaluate_cfg)
    raw["arm"].update(arm_cfg or {})
    raw["models"] = {"tiny": {"display_name": f"Tiny {arch}", "family": arch, "arm": model_arm or {},
                              "source": {"kind": "local_dir", "path": str(tiny_dirs[arch])}}}
    return load_params(write_params(raw))


def loaded(params, identity=False):
    setup = models.setup_for(params, "tiny")
    model, tokenizer = models.load(setup, attn_implementation=engines.ATTENTION)
    s = arm.settings_for(params.arm, params.dataset.benchmark, setup)
    # on the test's own model for the rest of the test (the model is not shared)
    hook = hooks.Hooks().arm(arm.ArmHook(arm.layer0_mlp(model, setup), s, identity=identity))
    return model, tokenizer, hook, engines.stop_ids(model.generation_config, tokenizer), setup


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_pool_row_generates_the_same_tokens_alone_and_in_a_batch_of_8(arch, tiny_dirs, write_params, cache_dir):
    params = arm_params(write_params, tiny_dirs, arch)
    model, tokenizer, hook, eos, setup = loaded(params)
    assert hook.settings.variant == ("gemma" if arch == "gemma3" else "llama")
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    built = [builder.build(p) for p in problems[:6]]
    # 4 arm rows among none / mless / mful rows of other lengths (left padding differs per row)
    batch = [engines.Item(p.index, "arm", b["arm"].input_ids) for p, b in zip(problems[:4], built)]
    batch += [engines.Item(p.index, c, b[c].input_ids) for p, b in zip(problems[4:], built[4:]) for c in b][:4]
    assert len(batch) == 8 and len({len(it.input_ids) for it in batch}) > 4
    together = engines.generate(model, tokenizer, batch, 10, False, eos, hook)
    for it, out in zip(batch[:4], together):
        assert engines.generate(model, tokenizer, [it], 10, False, eos, hook) == [out], it.index
    # batched none generations equal one-at-a-time ones (test_evaluate.py), so one batch serves here
    none = engines.generate(model, tokenizer, [engines.Item(it.index, "none", it.input_ids) for it in batch[:4]],
                             10, False, eos)
    assert none != together[:4], "ARM changed no arm row's tokens: the comparison would hold for an idle hook too"


def test_identity_hook_generates_exactly_the_none_tokens(tiny_dirs, write_params, cache_dir):
    params = arm_params(write_params, tiny_dirs, "llama")
    model, tokenizer, hook, eos, setup = loaded(params, identity=True)
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    prompts = [builder.build(p) for p in problems[:4]]
    none = [engines.Item(p.index, "none", b["none"].input_ids) for p, b in zip(problems, prompts)]
    arms = [engines.Item(p.index, "arm", b["arm"].input_ids) for p, b in zip(problems, prompts)]
    assert engines.generate(model, tokenizer, arms, 10, False, eos, hook) == \
        engines.generate(model, tokenizer, none, 10, False, eos)
    assert hook.step == 10  # the hook ran at the prompt and at every decode step


def test_evaluate_with_arm_is_seeded_byte_identical_and_reports_arm_minus_none(tiny_dirs, write_params, cache_dir,
                                                                               tmp_path):
    params = arm_params(write_params, tiny_dirs, "llama", n_samples=3, max_new_tokens=8, batch_size=5)  # mixed batches
    out = evaluate.run(params, "tiny", root=tmp_path / "a")
    again = evaluate.run(params, "tiny", root=tmp_path / "b")
    assert again.read_bytes() == out.read_bytes()
    metrics = json.loads((tmp_path / "a/metrics/accuracy/tiny.json").read_text())
    assert set(metrics["accuracy"]) == {"none", "mless", "mful", "arm"}
    assert set(metrics["arm-none"]) >= {"delta", "ci95_low", "ci95_high", "mcnemar_p"}
    with read_h5(out, "eval", ("arm/output",)) as f:
        prov = json.loads(f.attrs["provenance"])
        assert prov["arm"]["variant"] == "llama" and prov["arm"]["origin"]["c"] == "fallback (llama variant)"
        assert prov["arm"]["c"] == 0.13 and prov["arm"]["percentage"] == 99.5
        assert (prov["arm"]["pmin"], prov["arm"]["pmax"]) == (0.2, 0.25)  # the Llama file's defaults


def test_activations_store_the_arm_transformed_histogram_from_the_same_hook(tiny_dirs, write_params, cache_dir,
                                                                            tmp_path):
    raw = arm_params(write_params, tiny_dirs, "qwen2").model_dump()
    raw["extract"]["n_samples"] = 3
    raw["activations"]["showcase"] = 1
    params = load_params(write_params(raw))
    out = activations.run(params, "tiny", root=tmp_path)
    with read_h5(out, "activations", ("arm/hist_original",)) as f:
        assert list(f.attrs["conditions"]) == ["none", "mless", "mful", "arm"]
        arm_a = f["showcase/000/arm/a"][0].astype(np.float32)
        index = int(f["showcase/000"].attrs["problem_index"])
        assert not np.array_equal(f["arm/hist_original"][()], f["none/hist_original"][()])
        assert f["arm/original/near_zero_fixed_diff"][0] < 0  # ARM empties the near-zero region
        np.testing.assert_allclose(f["arm/lambda"][()], 1, atol=1e-6)  # no span: all attention stays on originals
    # the stored arm activations are the edit of the float32 none activations of the same problem
    from meaningless_tokens.capture import install_capture

    setup = models.setup_for(params, "tiny")
    model, tokenizer = models.load(setup, layers=[0])
    install_capture(model)
    problem = next(p for p in load_math500(dataset_spec(params.dataset, params.file))[0] if p.index == index)
    ids = builder_for(params.prompt, setup, tokenizer).build(problem)["none"].input_ids
    none_a = torch.from_numpy(measures.activations.forward(model, measures.activations.gated_mlps(model, setup, [0]), [0], ids)[1][0])
    s = arm.settings_for(params.arm, params.dataset.benchmark, setup)  # the tiny qwen2
    want = arm.edit(none_a, s, draws.stream(s.seed, [(index,)], 0)).numpy()
    np.testing.assert_allclose(arm_a, want, rtol=1e-3, atol=1e-4)  # stored as float16


# ---- bad input ---------------------------------------------------------------------------------------

def test_bad_arm_input_is_one_line_naming_the_key_before_any_work(tiny_dirs, write_params, cache_dir, tmp_path):
    cases = [("gemma3", {"percentage": 99.5}, r"models.tiny.arm.percentage: 99.5 is outside \[0, 1\], the gemma"),
             ("llama", {"percentage": 150}, r"models.tiny.arm.percentage: 150.0 is outside \[0, 100\], the llama"),
             ("llama", {"pmin": 0.3}, r"models.tiny.arm.pmin: 0.3 is greater than pmax 0.25"),
             ("gemma3", {"c": 1.5}, r"models.tiny.arm.c: 1.5 is outside \(0, 1\]")]
    for arch, bad, message in cases:
        params = arm_params(write_params, tiny_dirs, arch, model_arm=bad)
        with pytest.raises(ConfigError, match=message) as e:
            evaluate.run(params, "tiny", root=tmp_path)
        assert "\n" not in str(e.value) and str(params.file) in str(e.value)
        assert not (tmp_path / "artifacts").exists()
    with pytest.raises(ConfigError, match=r"models.tiny.arm: pmin 0.3 is greater than pmax 0.2"):
        arm_params(write_params, tiny_dirs, "llama", model_arm={"pmin": 0.3, "pmax": 0.2})
    with pytest.raises(ConfigError, match=r"arm.pool: Input should be 'row' or 'batch'"):
        arm_params(write_params, tiny_dirs, "llama", arm_cfg={"pool": "rows"})


def test_arm_on_a_model_without_a_gated_mlp_is_refused(write_params, tiny_dirs):
    from transformers import AutoModelForCausalLM, PhiConfig

    params = arm_params(write_params, tiny_dirs, "llama")
    phi = AutoModelForCausalLM.from_config(PhiConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=2, num_attention_heads=4))
    with pytest.raises(ConfigError, match=r"prompt.conditions: 'arm' needs a gated MLP .* has PhiMLP \(model_type 'phi'\)"):
        arm.layer0_mlp(phi, models.setup_for(params, "tiny"))


def test_paper_defaults_by_repo_and_family():
    """The paper's (c, percentage) for its models, its files' pmin/pmax per family, fallbacks otherwise."""
    from meaningless_tokens.config import Params
    from tests.params import build

    raw = build(models={  # every model evaluated and scored
        "q": {"display_name": "q", "source": {"kind": "hf", "repo_id": "Qwen/Qwen2.5-Math-7B"}},
        "l": {"display_name": "l", "source": {"kind": "hf", "repo_id": "meta-llama/Llama-3.1-8B-Instruct"}},
        "g": {"display_name": "g", "source": {"kind": "hf", "repo_id": "google/gemma-3-4b-it"}},
        "o": {"display_name": "o", "source": {"kind": "local_dir", "path": "x"}, "arm": {"c": 0.2}}})
    params = Params.model_validate(raw)
    q, l, g, o = (arm_settings(params, n, t) for n, t in (("q", "qwen2"), ("l", "llama"), ("g", "gemma3_text"),
                                                           ("o", "mistral")))
    assert (q.variant, q.c, q.percentage, q.pmin, q.pmax) == ("llama", 0.1, 95.0, 0.02, 0.25)
    assert (l.variant, l.c, l.percentage, l.pmin, l.pmax) == ("llama", 0.32, 90.0, 0.2, 0.25)
    assert (g.variant, g.c, g.percentage) == ("gemma", 0.25, 0.85) and g.origin["c"].startswith("paper")
    assert (o.c, o.percentage, o.origin["c"], o.origin["percentage"]) == (0.2, 99.5, "params", "fallback (llama variant)")
    # the dataset selects the paper's column: Qwen2.5-Math-7B (0.05, 90) on AIME2024, Llama off on AIME 2025
    raw["dataset"]["benchmark"] = "aime2024"
    q = arm_settings(Params.model_validate(raw), "q", "qwen2")
    assert (q.c, q.percentage, q.origin["c"]) == (0.05, 90.0, "paper (Qwen/Qwen2.5-Math-7B, aime2024)")
    raw["dataset"]["benchmark"] = "aime2025"
    with pytest.raises(ConfigError, match=r"models.l.arm: the paper runs meta-llama/Llama-3.1-8B-Instruct on aime2025 "
                                          r"without ARM; set models.l.arm.c and percentage"):
        arm_settings(Params.model_validate(raw), "l", "llama")
    raw["models"]["l"]["arm"] = {"c": 0.32, "percentage": 90}   # params still override
    assert arm_settings(Params.model_validate(raw), "l", "llama").origin["c"] == "params"


def arm_settings(params, name: str, model_type: str) -> arm.ArmSettings:
    """ARM's settings for model `name` of a given model_type, without fetching it (hub sources): the setup a stage
    would resolve, its manifest holding only the model_type ARM reads."""
    prepared = models.PreparedModel(name=name, path=Path("unfetched"), weights_sha256="", files={}, source={},
                                    facts={"model_type": model_type}, probe={})
    setup = models.ModelSetup(models.ModelEntry.of(params, name), prepared, "cpu", "float32", None)
    return arm.settings_for(params.arm, params.dataset.benchmark, setup)
