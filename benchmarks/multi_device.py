"""Two devices, two threads: each chain of products on its own device."""
import threading, time, numpy as np, coopmat
devs = coopmat.devices()
print("devices", [(d.index, d.name) for d in devs])
rng = np.random.default_rng(0)
w = (rng.standard_normal((8192, 8192), dtype=np.float32) / 90).astype(np.float16)
x = rng.standard_normal((8192, 8192), dtype=np.float32).astype(np.float16)
def chain(dev, n, out):
    X, W = coopmat.asarray(x, device=dev), coopmat.asarray(w, device=dev)
    coopmat.synchronize(dev)
    t = time.perf_counter()
    for _ in range(n):
        X = X @ W
    coopmat.synchronize(dev)
    out[dev] = (time.perf_counter() - t, X)
n = 20
res = {}
chain(0, 2, res)
for d in (0, 1):
    chain(d, n, res)
single = {d: res[d][0] for d in (0, 1)}
th = [threading.Thread(target=chain, args=(d, n, res)) for d in (0, 1)]
t = time.perf_counter()
for h in th: h.start()
for h in th: h.join()
both = time.perf_counter() - t
print(f"{n} chained 8192^3 products: device0 alone {single[0]*1e3:.1f} ms, device1 alone {single[1]*1e3:.1f} ms, both at once from two threads {both*1e3:.1f} ms")
a0 = res[0][1].numpy(); a1 = res[1][1].numpy()
print("same result on both devices:", np.array_equal(a0, a1))
try:
    res[0][1] @ res[1][1]
except coopmat.DeviceMismatchError as e:
    print("mismatch error:", e)
