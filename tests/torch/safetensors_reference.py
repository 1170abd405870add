"""The Hugging Face half of the outside check of shardwise's safetensors reader and writer.

1. safetensors' numpy API writes every dtype it has (and its torch API writes BF16, which numpy lacks), with
   metadata; shardwise (safetensors_check read) loads them and checks every value.
2. shardwise (safetensors_check write) writes every dtype with metadata; safetensors' numpy and torch APIs load
   the file and every value is checked here.
Both sides compute the values from the same simple formulas (inputs, not results). Prints one line per check
and "N passed, M failed" at the end.

usage: safetensors_reference.py SAFETENSORS_CHECK_BINARY DIR
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file as torch_load_file
from safetensors.torch import save_file as torch_save_file

I64 = [-2**63, -1, 0, 1, 2**63 - 1, 1234567890123]
I32 = [-2**31, -5, 7, 2**31 - 1]


def value(k):
    return (((k * 7) % 13) - 6) * 0.25


def formula(n, dtype, shape):
    return np.array([value(k) for k in range(n)], dtype=np.float64).astype(dtype).reshape(shape)


def tensors():
    return {
        "f64": formula(12, np.float64, (3, 4)),
        "f32": formula(12, np.float32, (2, 3, 2)),
        "f16": formula(15, np.float16, (5, 3)),
        "i64": np.array(I64, dtype=np.int64),
        "i32": np.array(I32, dtype=np.int32).reshape(2, 2),
        "u8": np.array([(k * 37) % 256 for k in range(7)], dtype=np.uint8),
        "bool": np.array([k % 3 == 0 for k in range(9)], dtype=np.bool_).reshape(3, 3),
        "f16_special": np.array([2.0**-24, 65504.0, np.inf, -np.inf, -0.0], dtype=np.float16),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def bf16_tensor():
    return torch.tensor([value(k) for k in range(8)], dtype=torch.float64).to(torch.bfloat16).reshape(4, 2)


def same(got, expected):
    """Same dtype, shape and values, with the sign of zero (NaN-free data)."""
    return (got.dtype == expected.dtype and got.shape == expected.shape and np.array_equal(got, expected)
            and np.array_equal(np.signbit(got), np.signbit(expected)))


def main():
    binary, directory = sys.argv[1], sys.argv[2]
    os.makedirs(directory, exist_ok=True)
    results = []

    # 1. Hugging Face writes, shardwise reads.
    np_save_file(tensors(), os.path.join(directory, "from_python.safetensors"),
                 metadata={"producer": "safetensors.numpy", "format": "np"})
    torch_save_file({"bf16": bf16_tensor()}, os.path.join(directory, "from_python_bf16.safetensors"),
                    metadata={"producer": "safetensors.torch"})
    for mode in ("read", "write"):
        run = subprocess.run([binary, mode, directory], capture_output=True, text=True)
        sys.stdout.write(run.stderr)
        lines = run.stdout.splitlines()
        for line in lines:
            if line.startswith("ok "):
                results.append(("shardwise " + mode + ": " + line[3:], True, ""))
            elif line.startswith("FAIL "):
                results.append(("shardwise " + mode + ": " + line[5:], False, ""))
        if run.returncode != 0:
            results.append((f"safetensors_check {mode} exit code", False, str(run.returncode)))
        if mode == "read" and len([r for r in lines if r.startswith(("ok ", "FAIL "))]) < 13:
            results.append(("shardwise read: every check ran", False, f"{len(lines)} lines"))

    # 2. shardwise writes, Hugging Face reads (numpy API, torch API for BF16, and the raw header).
    path = os.path.join(directory, "from_shardwise.safetensors")
    if os.path.exists(path):
        expected = tensors()
        # numpy cannot hold BF16: safe_open with numpy reads the others one by one, torch reads BF16.
        with safe_open(path, framework="np") as f:
            results.append(("metadata", f.metadata() == {"producer": "shardwise", "format": "pt"}, str(f.metadata())))
            names = set(f.keys())
            results.append(("tensor names", names == set(expected) | {"bf16"}, str(sorted(names))))
            for name, want in expected.items():
                results.append((name, name in names and same(f.get_tensor(name), want), name))
            # A slice through safetensors' own slicing: rows 1..2 of f64.
            results.append(("f64 rows 1..2", same(f.get_slice("f64")[1:3], expected["f64"][1:3]), ""))
        loaded = torch_load_file(path)
        results.append(("bf16", loaded["bf16"].dtype == torch.bfloat16 and torch.equal(loaded["bf16"], bf16_tensor()),
                        ""))
        with open(path, "rb") as f:
            length = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(length))
        results.append(("header padded to 8 bytes", length % 8 == 0, str(length)))
        results.append(("data aligned to each element size",
                        all(v["data_offsets"][0] % {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2}.get(
                            v["dtype"], 1) == 0 for k, v in header.items() if k != "__metadata__"), ""))
    else:
        results.append(("shardwise wrote from_shardwise.safetensors", False, path))

    passed = sum(1 for _, ok, _ in results if ok)
    for name, ok, detail in results:
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else "  " + detail))
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
