import cupy as cp, ge2jit, ml_dtypes, numpy as np, sys

def main():
    bf = ml_dtypes.bfloat16
    for (m, n, k) in [(4096, 4096, 4096), (8192, 1024, 1024), (8192, 16384, 4096), (512, 1024, 4096)]:
        a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(bf)
        b = cp.random.standard_normal((k, n), dtype=cp.float32).astype(bf)
        bias = cp.random.standard_normal(n, dtype=cp.float32).astype(bf)
        r = ge2jit.tune(a, b, bias, act="gelu_tanh", reps=10)
        print(m, n, k, repr(r).splitlines()[:8], flush=True)

if __name__ == '__main__':
    main()
