"""The README's "Gradient-checking your own op" in Python: an op built from
differentiable cf ops, checked by finite differences (DESIGN.md section 4)."""
import sys

import cf


def softplus(x):
    return cf.log1p(cf.exp(x))


gen = cf.Generator(1)
x = cf.rand([4, 5], dtype=cf.float64, generator=gen, low=-2.0, high=2.0)
x.requires_grad = True
r = cf.gradcheck(lambda inputs: softplus(inputs[0]), [x])
print("%s (%s, %d entries)" % ("ok" if r.ok else r.message, r.mode, r.entries_checked))
sys.exit(0 if r.ok else 1)
