"""Host cost of launch paths for an empty kernel with ge2jit's 19 parameters (8 bytes each).

    python bench/launch_micro.py [--quick]
"""

from __future__ import annotations

import argparse
import struct
import sys

import numpy as np
from common import add_quick, cp, per_call_us  # the benchmark's timing loop of host times

#: calls timed per case (back to back), and --quick's
CALLS, QUICK_CALLS = 20000, 2000

SRC = r'''
struct Params { unsigned long long v[19]; };
extern "C" __global__ void many(const float* a, long long p1, const float* b, long long p3,
    const float* c, long long p5, const float* d, long long p7, float* y, long long p9,
    float* z, long long p11, long long m, long long n, long long k, double al, double be,
    double sl, long long kt) {}
extern "C" __global__ void one(const Params p) {}
'''


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick(ap, f"{QUICK_CALLS} calls per case (default {CALLS})")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    calls = QUICK_CALLS if args.quick else CALLS
    mod = cp.RawModule(code=SRC)
    many, one = mod.get_function("many"), mod.get_function("one")
    x = cp.empty(16, cp.float32)
    args = (x, 1, x, 2, None, 0, x, 1, x, 3, None, 0, 64, 64, 64, 1.0, 0.0, 0.01, 1)
    pack = struct.Struct("<QqQqQqQqQqQqqqqdddq")
    vals = np.zeros(19, np.uint64)
    ptrs = np.array([vals.ctypes.data + 8 * i for i in range(19)], np.uintp)
    launch = cp.cuda.driver.launchKernel
    ptr = x.data.ptr
    many_ptr = many.kernel.ptr
    blob = np.zeros(1, dtype=np.dtype((np.void, 152)))

    def driver_path():
        pack.pack_into(vals, 0, ptr, 1, ptr, 2, 0, 0, ptr, 1, ptr, 3, 0, 0, 64, 64, 64, 1.0, 0.0,
                       0.01, 1)
        launch(many_ptr, 1, 1, 1, 128, 1, 1, 0, cp.cuda.get_current_stream().ptr,
               ptrs.ctypes.data, 0)

    def struct_path():
        pack.pack_into(blob, 0, ptr, 1, ptr, 2, 0, 0, ptr, 1, ptr, 3, 0, 0, 64, 64, 64, 1.0,
                       0.0, 0.01, 1)
        one((1,), (128,), (blob,))

    # the `extra` form: one buffer of all parameters (CU_LAUNCH_PARAM_BUFFER_POINTER = 1,
    # CU_LAUNCH_PARAM_BUFFER_SIZE = 2, CU_LAUNCH_PARAM_END = 0)
    size = np.array([152], np.uintp)
    extra = np.array([1, vals.ctypes.data, 2, size.ctypes.data, 0], np.uintp)
    extra_ptr, ptrs_ptr = extra.ctypes.data, ptrs.ctypes.data
    one_ptr = one.kernel.ptr
    stream = cp.cuda.get_current_stream().ptr

    def extra_path():
        pack.pack_into(vals, 0, ptr, 1, ptr, 2, 0, 0, ptr, 1, ptr, 3, 0, 0, 64, 64, 64, 1.0, 0.0,
                       0.01, 1)
        launch(many_ptr, 1, 1, 1, 128, 1, 1, 0, stream, 0, extra_ptr)

    cases = {
        "driver.launchKernel alone, 19 params (pre-packed)":
            lambda: launch(many_ptr, 1, 1, 1, 128, 1, 1, 0, stream, ptrs_ptr, 0),
        "driver.launchKernel alone, extra buffer (pre-packed)":
            lambda: launch(many_ptr, 1, 1, 1, 128, 1, 1, 0, stream, 0, extra_ptr),
        "driver.launchKernel alone, one 152-byte struct param":
            lambda: launch(one_ptr, 1, 1, 1, 128, 1, 1, 0, stream, ptrs_ptr, 0),
        "pack + driver.launchKernel, extra buffer": extra_path,
        "Function.__call__, 19 Python args": lambda: many((1,), (128,), args),
        "pack + driver.launchKernel, 19 params": driver_path,
        "pack + Function.__call__, one 152-byte struct": struct_path,
        "Function.__call__, empty kernel, 1 arg": lambda: one((1,), (128,), (blob,)),
        "pack_into alone": lambda: pack.pack_into(vals, 0, ptr, 1, ptr, 2, 0, 0, ptr, 1, ptr, 3,
                                                  0, 0, 64, 64, 64, 1.0, 0.0, 0.01, 1),
    }
    for name, fn in cases.items():
        print(f"{name:50s} {per_call_us(fn, calls):6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
