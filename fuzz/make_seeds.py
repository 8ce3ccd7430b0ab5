"""Seed inputs for the fuzz targets: command lines from the README and the CLI tests; small valid
tensor files of every dtype
and container variant the readers take, most of them whole kernel cases so that the fuzzer starts
inside the loaders, not at their first check. numpy only (Debian's /usr/bin/python3).

    /usr/bin/python3 fuzz/make_seeds.py OUT_DIR     # writes OUT_DIR/{command_line,npz,safetensors,npy,kernel_case}/

The committed corpora (fuzz/corpus/) are these seeds after fuzzing, minimised with -merge=1."""
import io
import json
import os
import struct
import sys
import zipfile

import numpy as np

rng = np.random.default_rng(20261201)
B, H, L, DK, DV = 1, 2, 3, 2, 2


def small(shape, dtype=np.float32):
    return (rng.integers(-8, 9, size=shape) / 8).astype(dtype)


def kernel_case(op, layout="bhld", varlen=False, extras=()):
    token = (lambda d: (B, H, L, d)) if layout == "bhld" else (lambda d: (B, L, H, d))
    gate = (B, H, L) if layout == "bhld" else (B, L, H)
    n = 2 if varlen else B
    state = (n, H, DV, DK) if layout == "bhld" else (n, H, DK, DV)
    t = {"q": small(token(DK)), "k": small(token(DK)), "v": small(token(DV))}
    if op != "linear":
        t["beta"] = (rng.integers(0, 9, size=gate) / 8).astype(np.float32)
    if op == "gated-delta":
        t["g"] = (-rng.integers(0, 9, size=gate) / 8).astype(np.float32)
    if "h0" in extras:
        t["h0"] = small(state)
    if "do" in extras:
        t["do"] = small(token(DV))
    if "dht" in extras:
        t["dht"] = small(state)
    if varlen:
        t["cu_seqlens"] = np.array([0, 1, L], dtype=np.int64)
    return t


def bf16_bits(x):  # float32 values that are bf16-exact, as their top 16 bits
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def npz_bytes(tensors, compressed=False):
    out = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(out, **tensors)
    return out.getvalue()


def safetensors_bytes(tensors):
    names = {np.dtype("<f2"): "F16", np.dtype("<f4"): "F32", np.dtype("<f8"): "F64",
             np.dtype("<i4"): "I32", np.dtype("<i8"): "I64"}
    header, data = {}, b""
    for name, (kind, array) in tensors.items():
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": kind or names[array.dtype.newbyteorder("<")], "shape": list(array.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


COMMAND_LINES = [
    "verify",
    "verify --scalar double --L 33 --C 5",
    "verify --scalar float --L 40 --C 64 --dk 1 --dv 3",
    "gradcheck --form recurrent --L 9 --C 4 --dk 3 --dv 2 --json",
    "gradcheck --L 5 --C 2 --dk 2 --dv 2 --step 1e-20 --digits 90",
    "verify --op delta --beta 0.5 --keys unnormalized --L 17 --C 4",
    "verify --op gated-delta --alpha 0.25 --beta random --scalar high",
    "gradcheck --op gated-delta --alpha 1 --beta 2.5e-1 --step 1e-30",
    "verify --op ttt --L 8 --C 4 --dk 3 --dv 2 --seed 7",
    "verify --op lact --impl reference",
    "masks --schedule apply-update --L 8 --C 4 --window 2 --fast-weight swiglu",
    "masks --schedule single --dk 2 --dv 2 --seed 3",
    "check --op linear --inputs in.npz --outputs out.npz",
    "check --op gated-delta --inputs in.safetensors --outputs out.safetensors --grads g.npz --layout blhd"
    " --cu-seqlens --scale 0.125 --qk-l2norm --tf32 --json",
    "verify --impl cuda --op delta",
    "--help",
    "verify --help",
]


def main(out):
    seeds = {"npz": {}, "safetensors": {}, "npy": {}, "kernel_case": {}}
    # Command lines (fuzz_command_line: the arguments after `deltaproof`, one per line).
    seeds["command_line"] = {f"line_{i:02}": "\n".join(line.split()).encode() for i, line in enumerate(COMMAND_LINES)}
    cases = {
        "linear": kernel_case("linear"),
        "linear_blhd_h0": kernel_case("linear", "blhd", extras=("h0",)),
        "delta_grads": kernel_case("delta", extras=("h0", "do", "dht")),
        "gated_varlen": kernel_case("gated-delta", varlen=True),
        "gated_blhd_varlen_do": kernel_case("gated-delta", "blhd", True, ("do",)),
    }
    for name, t in cases.items():
        seeds["npz"][name] = npz_bytes(t)
        seeds["safetensors"][name] = safetensors_bytes({k: (None, v) for k, v in t.items()})
    # Every dtype and descr spelling the .npz reader takes, deflated and stored.
    x = small((2, 3))
    seeds["npz"]["dtypes"] = npz_bytes({"a": x.astype("<f2"), "b": x.astype("<f8"), "c": x.astype(">f4"),
                                        "d": np.arange(3, dtype="<i4"), "e": np.arange(3, dtype=">i8"),
                                        "f": bf16_bits(x), "g": bf16_bits(x).view("V2")})
    seeds["npz"]["deflated"] = npz_bytes(cases["delta_grads"], compressed=True)
    seeds["npz"]["empty_and_scalar"] = npz_bytes({"z": np.zeros((0, 4), np.float32), "s": np.float64(2.5)})
    npy = io.BytesIO()
    np.lib.format.write_array(npy, x, version=(2, 0))
    member = io.BytesIO()
    with zipfile.ZipFile(member, "w") as z:
        z.writestr("q.npy", npy.getvalue())
    seeds["npz"]["npy_version2"] = member.getvalue()
    seeds["safetensors"]["dtypes"] = safetensors_bytes({"a": (None, x.astype("<f2")), "b": (None, x.astype("<f8")),
                                                        "c": ("BF16", bf16_bits(x)), "d": (None, np.arange(3, dtype="<i4")),
                                                        "e": (None, np.arange(3, dtype="<i8"))})
    seeds["safetensors"]["empty"] = safetensors_bytes({"z": (None, np.zeros((0, 4), np.float32))})
    # .npy members for fuzz_npy: a name byte (index into npy_fuzz.cpp's member_names), then the member.
    def npy_bytes(array, version=(1, 0)):
        out = io.BytesIO()
        np.lib.format.write_array(out, array, version=version)
        return out.getvalue()
    q = small((1, 3, 3, 2))
    seeds["npy"] = {
        "q_f4": bytes([0]) + npy_bytes(q),
        "k_f2": bytes([1]) + npy_bytes(q.astype("<f2")),
        "v_f8_big_endian": bytes([2]) + npy_bytes(q.astype(">f8")),
        "beta_bf16_V2": bytes([3]) + npy_bytes(bf16_bits(np.abs(small((1, 3, 3)))).view("V2")),
        "g_bf16_u2": bytes([4]) + npy_bytes(bf16_bits(-np.abs(small((1, 3, 3))))),
        "cu_seqlens_i4": bytes([5]) + npy_bytes(np.array([0, 2, 3], dtype="<i4")),
        "h0_version2": bytes([6]) + npy_bytes(small((1, 3, 2, 2)), version=(2, 0)),
        "do_fortran": bytes([7]) + npy_bytes(np.asfortranarray(small((3, 2)))),
        "dht_scalar": bytes([8]) + npy_bytes(np.float32(1.5)),
    }
    # Kernel cases as fuzz_kernel_case decodes them: op, layout, flags, B, H, L, DK, DV, then
    # (varlen) a count and steps; tensors left out read as zero bytes (intact shapes, values -15.75).
    seeds["kernel_case"] = {
        "linear": bytes([0, 0, 0x06, 2, 3, 5, 4, 3]),
        "delta_blhd_h0_do_dht": bytes([1, 1, 0x3E, 1, 2, 4, 3, 2]),
        "gated_varlen": bytes([2, 0, 0x07, 1, 2, 5, 2, 2, 4, 0, 2, 1, 2]),
        "gated_scale_norm": bytes([2, 1, 0xC6, 2, 1, 3, 2, 2]),
    }
    for kind, files in seeds.items():
        os.makedirs(os.path.join(out, kind), exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(out, kind, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
