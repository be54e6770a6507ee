"""The launcher's parameter packing, without a GPU (the driver call is replaced)."""

from __future__ import annotations

import ctypes
import struct
import threading

import pytest

pytest.importorskip("cupy")

from ge2jit.jit.launch import Launcher  # noqa: E402
from ge2jit.jit.params import double, int64, layout, pointer, tensor_maps  # noqa: E402


def _recording(launcher: Launcher, nparams: int, calls: list):
    """Replace the driver call by one that reads the parameters back through the pointers."""

    def launch(fptr, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        pointers = (ctypes.c_uint64 * nparams).from_address(params)
        raw = [ctypes.string_at(int(p), 8) for p in pointers]
        calls.append({"thread": threading.get_ident(), "params": params, "fptr": fptr,
                      "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
                      "stream": stream, "raw": raw})

    launcher._launch = launch


def test_layout_of_parameters():
    assert layout((pointer("a", "float"), *int64("n"), *double("x"), pointer("b", "float"))) == (
        (0, 8, 16, 24), 32, "<QqdQ")
    assert layout((*tensor_maps("ma", "mb"), pointer("a", "float"), *double("x"))) == (
        (0, 128, 256, 264), 272, "<128s128sQd")
    with pytest.raises(ValueError, match="at most 64 allowed"):
        layout(int64(*(f"n{i}" for i in range(65))))
    with pytest.raises(ValueError, match="named twice: n"):
        layout(int64("n", "m", "n"))


def test_parameters_reach_the_driver_and_threads_keep_their_own_buffers():
    calls: list = []
    launcher = Launcher("k", 1234, (pointer("p", "float"), *int64("n"), *double("x")))
    _recording(launcher, 3, calls)

    def call(x):
        launcher.launch((2, 3, 4), (32, 1, 1), 96, 555, x=x / 4, p=x, n=-x)

    call(7)
    other = threading.Thread(target=call, args=(9,))
    other.start()
    other.join()
    call(11)
    assert [c["raw"] for c in calls] == [
        [struct.pack("<Q", x), struct.pack("<q", -x), struct.pack("<d", x / 4)]
        for x in (7, 9, 11)]
    first, second, third = calls
    assert first["thread"] == third["thread"] != second["thread"]
    assert first["params"] == third["params"] != second["params"]
    assert (first["fptr"], first["grid"], first["block"], first["smem"], first["stream"]) == (
        1234, (2, 3, 4), (32, 1, 1), 96, 555)
