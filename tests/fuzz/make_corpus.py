"""Writes the fuzzer's seed corpus (tests/fuzz/corpus/): good safetensors files and the bad cases of
tests/test_safetensors.cpp, each made byte by byte. Run it to regenerate: python3 tests/fuzz/make_corpus.py"""
import json
import os
import struct

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def made(header, data=b"", length=None):
    text = header if isinstance(header, bytes) else header.encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def tensor(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def good_all_dtypes():
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, size, shape in [("f64", "F64", 8, [2]), ("i64", "I64", 8, [1, 2]), ("f32", "F32", 4, [2, 2]),
                                     ("i32", "I32", 4, [3]), ("f16", "F16", 2, [4]), ("bf16", "BF16", 2, [2, 1]),
                                     ("u8", "U8", 1, [5]), ("bool", "BOOL", 1, [2]), ("scalar", "F32", 4, []),
                                     ("empty", "F32", 4, [0, 3])]:
        n = 1
        for d in shape:
            n *= d
        header[name] = tensor(dtype, shape, len(data), len(data) + n * size)
        data += bytes((i * 13) % 256 for i in range(n * size))
    text = json.dumps(header, separators=(",", ":"))
    return made(text + " " * ((8 - len(text) % 8) % 8), data)


f32x2 = b"\x00\x00\x80\x3f\x00\x00\x00\x40"
w = '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
cases = {
    "good_all_dtypes": good_all_dtypes(),
    "good_one": made(w, f32x2),
    "good_empty": made("{}"),
    "good_padded": made(w + "       ", f32x2),
    "bad_truncated_length": b"\x10\x00\x00",
    "bad_truncated_data": made('{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', f32x2),
    "bad_header_beyond_file": made(w, f32x2, len(w) + 100),
    "bad_huge_header_length": made("{}", b"", 1 << 62),
    "bad_not_json": made('{"w": {"dtype": "F32",', f32x2),
    "bad_binary_header": made(b"\xff\xfe\x00\x01"),
    "bad_array_root": made("[1, 2]"),
    "bad_overlap": made('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},'
                        '"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', b"\x02" * 16),
    "bad_out_of_range": made('{"a":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}', b"\x02" * 16),
    "bad_reversed": made('{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', b"\x02" * 16),
    "bad_hole": made('{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', b"\x02" * 16),
    "bad_trailing": made('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b"\x02" * 16),
    "bad_unknown_dtype": made('{"fp8":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}}', f32x2),
    "bad_byte_count": made('{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', f32x2),
    "bad_overflowing_shape": made('{"w":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}',
                                  f32x2),
    "bad_negative_shape": made('{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', f32x2),
    "bad_deep_nesting": made("[" * 5000 + "]" * 5000),
    "bad_metadata_not_string": made('{"__metadata__":{"step":12},"w":{"dtype":"F32","shape":[2],'
                                    '"data_offsets":[0,8]}}', f32x2),
    "bad_missing_shape": made('{"w":{"dtype":"F32","data_offsets":[0,8]}}', f32x2),
}
os.makedirs(here, exist_ok=True)
for name, content in cases.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(content)
print(f"{len(cases)} seeds in {here}")
