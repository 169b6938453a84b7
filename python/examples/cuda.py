"""The README's CUDA snippet in Python. Runs on the GPU when cf sees one, and
on the CPU otherwise (the same code: only the device differs)."""
import cf

device = "cuda" if cf.cuda.is_available() else "cpu"
gen = cf.Generator(0)
x = cf.randn([64, 128], generator=gen).to(device)          # or cf.randn(..., device="cuda")
y = cf.softmax(cf.matmul(x, cf.transpose(x, 0, 1)), -1)    # runs on x's device
print(device, y.shape, "row sums:", cf.sum(y, 1)[:4].tolist())  # item()/tolist() copy back
model = cf.nn.Linear(128, 10, generator=gen).to(device)     # parameters and buffers move
print(model(x).device)
