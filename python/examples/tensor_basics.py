"""The README's first C++ example in Python: a small function of a tensor and its
gradient by backpropagation (README, "Using cf from your project")."""
import cf

x = cf.tensor([0.5, -1.0, 2.0], dtype=cf.float64)
x.requires_grad = True
y = cf.sum(cf.tanh(x) * x)
y.backward()
print(y)
print(x.grad)
