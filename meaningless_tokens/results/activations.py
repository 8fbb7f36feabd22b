"""One model's layer-0 MLP activations as the charts and the verdict read them: means, paired differences to none
and the paper's claim per measure (artifacts/activations/<model>.h5, first measured layer)."""

from __future__ import annotations

from meaningless_tokens.results.context import Context
from meaningless_tokens.results.trace import Num, artifact, excludes_zero

# the paper's claim for each measure under mless: -1 lower, +1 higher than none
CLAIM = {"near_zero_robust": -1, "near_zero_fixed": -1, "l1": +1, "l2": +1}
NAMES = {"near_zero_robust": "near-zero share (robust eps, %)", "near_zero_fixed": "near-zero share (fixed eps, %)",
         "l1": "mean |a| (L1)", "l2": "RMS of a (L2)", "gini": "Gini of |a|", "z_var": "variance of z over channels"}


class ActivationView:
    """Numbers of one model's activations file (first measured layer)."""

    def __init__(self, ctx: Context, name: str):
        self.ctx, self.name, self.act = ctx, name, ctx.activations[name]
        self.file = artifact("activations", name)
        self.disp = ctx.disp(name)
        self.layer = self.act["layers"][0]
        self.conds = self.act["conditions"]
        self.set = ctx.params.figures.activation_set  # the token set the charts show

    def n(self, ds: str, fmt: str = ".4g", op: str = "value", scale: float = 1.0, **at) -> Num:
        return self.ctx.src.h5(self.file, ds, op, scale, fmt, **at)

    def mean(self, c: str, m: str, s: str | None = None) -> tuple[Num, Num, Num]:
        """Mean over problems and its interval; shares in percent."""
        s = s or self.set
        kw = dict(fmt=".2f", scale=100) if m.startswith("near_zero") else dict(fmt=".4g")
        return (self.n(f"{c}/{s}/{m}_mean", layer=0, **kw), self.n(f"{c}/{s}/{m}_ci", bound="low", layer=0, **kw),
                self.n(f"{c}/{s}/{m}_ci", bound="high", layer=0, **kw))

    def diff(self, c: str, m: str, s: str | None = None) -> tuple[Num, Num, Num, Num]:
        """Paired difference to none, its interval (shares in percentage points) and the Wilcoxon p."""
        s = s or self.set
        kw = dict(fmt="+.2f", scale=100) if m.startswith("near_zero") else dict(fmt="+.3g")
        return (self.n(f"{c}/{s}/{m}_diff", layer=0, **kw), self.n(f"{c}/{s}/{m}_diff_ci", bound="low", layer=0, **kw),
                self.n(f"{c}/{s}/{m}_diff_ci", bound="high", layer=0, **kw), self.n(f"{c}/{s}/{m}_diff_p", ".2g", layer=0))

    def verdict(self, c: str, s: str | None = None) -> tuple[list[str], list[str], list[str]]:
        """Measures of CLAIM whose paired interval lies on the claimed side, on the other side, or spans 0."""
        agree, against, unclear = [], [], []
        for m, sign in CLAIM.items():
            d, lo, hi, _ = self.diff(c, m, s)
            if not excludes_zero(lo, hi):
                unclear.append(m)
            elif (d.value > 0) == (sign > 0):
                agree.append(m)
            else:
                against.append(m)
        return agree, against, unclear


def views(ctx: Context) -> list[ActivationView]:
    return [ActivationView(ctx, n) for n in ctx.names]
