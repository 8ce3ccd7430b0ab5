#!/usr/bin/env bash
# Command-line contract of `deltaproof check`: numpy writes inputs and the float64 recurrence's
# outputs (rounded to the kernel dtype) in .npz and hand-built .safetensors files, fixed-length bhld and
# varlen blhd (an empty and a one-token sequence), forward and backward; deltaproof agrees (exit 0).
# One output entry moved well past rounding: exit 1 and that entry is the worst index printed. Outside a
# bound's premise (DeltaNet keys with β k² = 100): exit 3, inconclusive, with the premise and its measure.
# Bad files: exit 2, one line on stderr naming the file and the tensor, nothing on stdout; NaN and
# ±Inf in any tensor, input or output, are bad files (named to the entry), never judged.
source "$(dirname "$0")/cli_expect.sh"
python=/usr/bin/python3

"$python" - "$dir" <<'EOF' || { echo "FAIL: the numpy script did not run"; exit 1; }
import json, struct, sys
import numpy as np

d = sys.argv[1]
rng = np.random.default_rng(7)

def save_safetensors(path, tensors):
    """The safetensors layout by hand: u64 header length, JSON header, little-endian data."""
    codes = {"float16": "F16", "float32": "F32", "float64": "F64", "int32": "I32", "int64": "I64", "uint16": "BF16"}
    header, data = {}, b""
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": codes[a.dtype.name], "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)

def bf16_bits(x):
    """float64 -> bf16 bit patterns (uint16), rounded to nearest even through fp32."""
    u = np.atleast_1d(np.asarray(x, np.float32)).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).reshape(np.shape(x))

def bf16_values(bits):
    return (np.atleast_1d(bits).astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(np.shape(bits))

def recurrence(q, k, v, h0, scale, beta=None, g=None, do=None, dht=None):
    """One (sequence, head) in float64: S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T, o_t = S_t (scale q_t).
    Linear attention: a = b = 1 without the k k^T term. Backward only for linear attention."""
    S = h0.copy()
    states, o = [], np.zeros((len(q), v.shape[1]))
    for t in range(len(q)):
        if beta is None:
            S = S + np.outer(v[t], k[t])
        else:
            S = np.exp(g[t]) * S if g is not None else S
            S = S - beta[t] * np.outer(S @ k[t], k[t]) + beta[t] * np.outer(v[t], k[t])
        states.append(S.copy())
        o[t] = S @ (scale * q[t])
    if do is None:
        return o, S
    dS, dq, dk, dv = dht.copy(), np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for t in reversed(range(len(q))):
        dq[t] = scale * states[t].T @ do[t]
        dS = dS + np.outer(do[t], scale * q[t])
        dv[t], dk[t] = dS @ k[t], dS.T @ v[t]
    return o, S, dq, dk, dv, dS

# 1. linear attention, bhld, fp32, B=2 H=2 L=9 DK=5 DV=3, h0 and cotangents given: .npz
B, H, L, DK, DV = 2, 2, 9, 5, 3
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
q, k, v, h0, do, dht = f32(B, H, L, DK), f32(B, H, L, DK), f32(B, H, L, DV), f32(B, H, DV, DK), f32(B, H, L, DV), f32(B, H, DV, DK)
o, ht = np.zeros((B, H, L, DV)), np.zeros((B, H, DV, DK))
grads = {n: np.zeros(s) for n, s in [("dq", q.shape), ("dk", k.shape), ("dv", v.shape), ("dh0", h0.shape)]}
for b in range(B):
    for h in range(H):
        x = [a[b, h].astype(np.float64) for a in (q, k, v, h0)]
        o[b, h], ht[b, h], grads["dq"][b, h], grads["dk"][b, h], grads["dv"][b, h], grads["dh0"][b, h] = recurrence(
            *x, 1.0, do=do[b, h].astype(np.float64), dht=dht[b, h].astype(np.float64))
np.savez(f"{d}/in.npz", q=q, k=k, v=v, h0=h0, do=do, dht=dht)
np.savez(f"{d}/out.npz", o=o.astype(np.float32), ht=ht.astype(np.float32))
np.savez(f"{d}/grads.npz", **{n: g.astype(np.float32) for n, g in grads.items()})
moved = o.astype(np.float32)
moved[1, 0, 7, 2] += np.float32(0.01) * max(1.0, abs(moved[1, 0, 7, 2]))
np.savez(f"{d}/out_moved.npz", o=moved, ht=ht.astype(np.float32))
moved_dk = {n: g.astype(np.float32) for n, g in grads.items()}
moved_dk["dk"][0, 1, 2, 4] += np.float32(0.01) * max(1.0, abs(moved_dk["dk"][0, 1, 2, 4]))
np.savez(f"{d}/grads_moved.npz", **moved_dk)
# bad files derived from it
np.savez(f"{d}/in_no_v.npz", q=q, k=k, h0=h0)
np.savez(f"{d}/in_no_do.npz", q=q, k=k, v=v, h0=h0)
np.savez(f"{d}/in_k_shape.npz", q=q, k=k[..., :4], v=v)
np.savez(f"{d}/in_q_int16.npz", q=q.astype(np.int16), k=k, v=v)
np.savez(f"{d}/in_fortran.npz", q=np.asfortranarray(q), k=k, v=v)
nan_o = o.astype(np.float32)
nan_o[0, 1, 4, 0] = np.nan
np.savez(f"{d}/out_nan.npz", o=nan_o)
with open(f"{d}/in.npz", "rb") as f:
    whole = f.read()
with open(f"{d}/in_truncated.npz", "wb") as f:
    f.write(whole[: len(whole) // 2])

# 2. linear attention, blhd (fla), varlen: sequences of 0, 1, 4 and 3 tokens, scale 0.5, bf16 q/k/v
#    ('<u2' and '|V2' bit patterns in .npz; BF16 in .safetensors), fp32 states [N, H, DK, DV].
cu = np.array([0, 0, 1, 5, 8], np.int64)
T, H, DK, DV, N = int(cu[-1]), 3, 4, 6, len(cu) - 1
qb, kb, vb = bf16_bits(rng.standard_normal((1, T, H, DK))), bf16_bits(rng.standard_normal((1, T, H, DK))), bf16_bits(rng.standard_normal((1, T, H, DV)))
qv, kv, vv = bf16_values(qb), bf16_values(kb), bf16_values(vb)
h0 = f32(N, H, DK, DV)
o, ht = np.zeros((1, T, H, DV)), np.zeros((N, H, DK, DV))
for n in range(N):
    s = slice(cu[n], cu[n + 1])
    for h in range(H):
        o[0, s, h], S = recurrence(qv[0, s, h], kv[0, s, h], vv[0, s, h], h0[n, h].astype(np.float64).T, 0.5)
        ht[n, h] = S.T
np.savez(f"{d}/varlen_in.npz", q=qb, k=kb, v=vb.view("V2"), h0=h0, cu_seqlens=cu)
np.savez(f"{d}/varlen_out.npz", o=bf16_bits(o).view("V2"), ht=ht.astype(np.float32))
np.savez_compressed(f"{d}/varlen_out_deflated.npz", o=bf16_bits(o), ht=ht.astype(np.float32))
save_safetensors(f"{d}/varlen_in.safetensors", {"q": qb, "k": kb, "v": vb, "h0": h0, "cu_seqlens": cu.astype(np.int32)})
save_safetensors(f"{d}/varlen_out.safetensors", {"o": bf16_bits(o), "ht": ht.astype(np.float32)})
moved = bf16_bits(o)
moved[0, 0, 2, 5] = bf16_bits(bf16_values(moved[0, 0, 2, 5]) + 0.5)  # token 0: the one-token sequence
save_safetensors(f"{d}/varlen_out_moved.safetensors", {"o": moved, "ht": ht.astype(np.float32)})
save_safetensors(f"{d}/varlen_in_decreasing.safetensors", {"q": qb, "k": kb, "v": vb, "cu_seqlens": np.array([0, 2, 1, 8])})
save_safetensors(f"{d}/varlen_in_short.safetensors", {"q": qb, "k": kb, "v": vb, "cu_seqlens": np.array([0, 1, 5, 7])})
with open(f"{d}/varlen_out.safetensors", "rb") as f:
    whole = f.read()
with open(f"{d}/varlen_out_truncated.safetensors", "wb") as f:
    f.write(whole[:-4])

# 3. gated DeltaNet, blhd, fp32, fixed length: beta = sigmoid, g = logsigmoid (fla's regime), unit keys
B, T, H, DK, DV = 1, 7, 2, 4, 5
q, v = f32(B, T, H, DK), f32(B, T, H, DV)
k = f32(B, T, H, DK)
k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(np.float32)
beta = (1 / (1 + np.exp(-rng.standard_normal((B, T, H))))).astype(np.float32)
g = (-np.log1p(np.exp(-(rng.standard_normal((B, T, H)) + 3)))).astype(np.float32)
o = np.zeros((B, T, H, DV))
for h in range(H):
    x = [a[0, :, h].astype(np.float64) for a in (q, k, v, beta, g)]
    o[0, :, h], _ = recurrence(x[0], x[1], x[2], np.zeros((DV, DK)), 1.0, beta=x[3], g=x[4])
np.savez(f"{d}/gated_in.npz", q=q, k=k, v=v, beta=beta, g=g)
np.savez(f"{d}/gated_out.npz", o=o.astype(np.float32))
# Non-finite inputs: refused, the tensor and the entry named (the judge has no bound for them).
q_nan, beta_inf, g_minus_inf = q.copy(), beta.copy(), g.copy()
q_nan[0, 3, 1, 2], beta_inf[0, 5, 0], g_minus_inf[0, 2, 1] = np.nan, np.inf, -np.inf
np.savez(f"{d}/gated_in_q_nan.npz", q=q_nan, k=k, v=v, beta=beta, g=g)
np.savez(f"{d}/gated_in_beta_inf.npz", q=q, k=k, v=v, beta=beta_inf, g=g)
np.savez(f"{d}/gated_in_g_minus_inf.npz", q=q, k=k, v=v, beta=beta, g=g_minus_inf)

# DeltaNet outside a premise: DK = 1 keys with β k² = 100 for 20 tokens (|T| ~ 99^19, beyond a fp32 solve
# to first order); an output moved far off is inconclusive (exit 3), never a disagreement.
L = 20
q, k = np.full((1, 1, L, 1), 0.5, np.float32), np.full((1, 1, L, 1), 10.0, np.float32)
v, beta = np.round(rng.standard_normal((1, 1, L, 1)), 2).astype(np.float32), np.ones((1, 1, L), np.float32)
np.savez(f"{d}/steep_in.npz", q=q, k=k, v=v, beta=beta)
o = np.zeros((1, 1, L, 1))
S = 0.0
for t in range(L):
    S = S * (1 - 100.0) + 10.0 * float(v[0, 0, t, 0])
    o[0, 0, t, 0] = 0.5 * S
o[0, 0, 3, 0] += 1e3 * (1 + abs(o[0, 0, 3, 0]))
np.savez(f"{d}/steep_out_moved.npz", o=o)
EOF

# The row of one tensor in the table names this worst index and verdict.
expect_row() {
  local tensor="$1" index="$2" verdict="$3"
  grep -E "^ +$tensor " "$out" | grep -qF "$index" || fail "table row $tensor does not show worst index $index: $(cat "$out")"
  grep -E "^ +$tensor " "$out" | grep -q "$verdict" || fail "table row $tensor is not $verdict: $(cat "$out")"
}

# Agreement: fixed bhld forward and backward, the header names op, layout, shapes and dtypes.
expect_exit 0 check --op linear --inputs "$dir/in.npz" --outputs "$dir/out.npz"
grep -q "^deltaproof check --op linear --layout bhld:.*q \[2, 2, 9, 5\] fp32.*o \[2, 2, 9, 3\] fp32" "$out" \
  || fail "no header line with op, layout, shapes and dtypes: $(head -1 "$out")"
expect_row o "" agree
expect_row ht "" agree
expect_exit 0 check --op linear --inputs "$dir/in.npz" --outputs "$dir/out.npz" --grads "$dir/grads.npz"
for t in dq dk dv dh0; do expect_row "$t" "" agree; done

# Disagreement: the moved entry is the worst index, in the table and in the JSON.
expect_exit 1 check --op linear --inputs "$dir/in.npz" --outputs "$dir/out_moved.npz"
expect_row o "(1, 0, 7, 2)" DISAGREE
expect_row ht "" agree
expect_exit 1 check --op linear --inputs "$dir/in.npz" --outputs "$dir/out_moved.npz" --json
"$python" -c 'import json,sys; d=json.load(open(sys.argv[1])); o=[c for c in d["comparisons"] if c["tensor"]=="o"][0]
assert d["agrees"] is False and o["agrees"] is False and o["index"]==[1,0,7,2], o
assert d["case"]["layout"]=="bhld" and d["case"]["tensors"]["q"]=={"shape":[2,2,9,5],"dtype":"fp32"}' "$out" \
  || fail "check --json does not name the moved entry: $(head -c 800 "$out")"
expect_exit 1 check --op linear --inputs "$dir/in.npz" --outputs "$dir/out.npz" --grads "$dir/grads_moved.npz"
expect_row dk "(0, 1, 2, 4)" DISAGREE
expect_row dq "" agree

# Varlen, fla layout, bf16 (both .npz bf16 conventions, and .safetensors BF16 with int32 cu_seqlens).
expect_exit 0 check --op linear --layout blhd --cu-seqlens --scale 0.5 --inputs "$dir/varlen_in.npz" --outputs "$dir/varlen_out.npz"
grep -q "^deltaproof check --op linear --layout blhd, varlen 4 sequences, scale 0.5:.*q \[1, 8, 3, 4\] bf16.*h0 \[4, 3, 4, 6\] fp32" "$out" \
  || fail "varlen header: $(head -1 "$out")"
expect_exit 0 check --op linear --layout blhd --cu-seqlens --scale 0.5 --inputs "$dir/varlen_in.safetensors" --outputs "$dir/varlen_out.safetensors"
expect_exit 0 check --op linear --layout blhd --cu-seqlens --scale 0.5 --inputs "$dir/varlen_in.npz" --outputs "$dir/varlen_out_deflated.npz"
expect_exit 1 check --op linear --layout blhd --cu-seqlens --scale 0.5 --inputs "$dir/varlen_in.safetensors" --outputs "$dir/varlen_out_moved.safetensors"
expect_row o "(0, 0, 2, 5)" DISAGREE
expect_exit 1 check --op linear --layout blhd --cu-seqlens --inputs "$dir/varlen_in.npz" --outputs "$dir/varlen_out.npz"  # scale forgotten

# Gated DeltaNet, fla layout, fixed length; also with the kernel's chunk size and a declared 16-bit running state.
expect_exit 0 check --op gated-delta --layout blhd --inputs "$dir/gated_in.npz" --outputs "$dir/gated_out.npz"
expect_row o "" agree
expect_exit 0 check --op gated-delta --layout blhd --inputs "$dir/gated_in.npz" --outputs "$dir/gated_out.npz" \
  --chunk-size 64 --state-dtype bf16
expect_row o "" agree
expect_bad_input "--state-dtype" check --op gated-delta --layout blhd --inputs "$dir/gated_in.npz" \
  --outputs "$dir/gated_out.npz" --state-dtype int8
expect_bad_input "--chunk-size" check --op gated-delta --layout blhd --inputs "$dir/gated_in.npz" \
  --outputs "$dir/gated_out.npz" --chunk-size 0

# Inconclusive: exit 3, the row and the verdict line say so with the premise; --json has status and premise.
expect_exit 3 check --op delta --inputs "$dir/steep_in.npz" --outputs "$dir/steep_out_moved.npz"
expect_row o "" INCONCLUSIVE
grep -q "^verdict: INCONCLUSIVE (o): .* > " "$out" || fail "no inconclusive verdict line with its premise: $(cat "$out")"
expect_exit 3 check --op delta --inputs "$dir/steep_in.npz" --outputs "$dir/steep_out_moved.npz" --json
"$python" -c 'import json,sys; d=json.load(open(sys.argv[1])); o=[c for c in d["comparisons"] if c["tensor"]=="o"][0]
assert d["status"]=="inconclusive" and d["inconclusive"] is True and d["agrees"] is False, d["status"]
assert d["deltaproof_version"] == open(sys.argv[2]).read().strip(), d["deltaproof_version"]
assert o["status"]=="inconclusive" and o["premise"]["measured"] > o["premise"]["limit"], o' "$out" "$(dirname "$0")/../../VERSION" \
  || fail "check --json does not carry the inconclusive status and premise: $(head -c 800 "$out")"

# Bad input: exit 2, one line naming the file and the tensor, nothing on stdout.
expect_bad_input "in_truncated.npz|truncated" check --op linear --inputs "$dir/in_truncated.npz" --outputs "$dir/out.npz"
expect_bad_input "in_no_v.npz: v: missing" check --op linear --inputs "$dir/in_no_v.npz" --outputs "$dir/out.npz"
expect_bad_input "in_k_shape.npz: k: shape [2, 2, 9, 4], expected [2, 2, 9, 5]" check --op linear --inputs "$dir/in_k_shape.npz" --outputs "$dir/out.npz"
expect_bad_input "in_q_int16.npz: q: unsupported dtype '<i2'" check --op linear --inputs "$dir/in_q_int16.npz" --outputs "$dir/out.npz"
expect_bad_input "in_fortran.npz: q: fortran_order True" check --op linear --inputs "$dir/in_fortran.npz" --outputs "$dir/out.npz"
expect_bad_input "out_nan.npz: o: entry (0, 1, 4, 0) is NaN" check --op linear --inputs "$dir/in.npz" --outputs "$dir/out_nan.npz"
# NaN and ±Inf in any input (q, β, g = −∞ too, which would be α = 0): refused, exit 2, naming the entry.
for bad in "q_nan.npz: q: entry (0, 3, 1, 2) is NaN" "beta_inf.npz: beta: entry (0, 5, 0) is Inf" \
           "g_minus_inf.npz: g: entry (0, 2, 1) is Inf"; do
  expect_bad_input "gated_in_$bad" check --op gated-delta --layout blhd --inputs "$dir/gated_in_${bad%%:*}" --outputs "$dir/gated_out.npz"
done
expect_bad_input "out.npz: o: shape [2, 2, 9, 3], expected [1, 8, 3, 6]" \
  check --op linear --layout blhd --cu-seqlens --inputs "$dir/varlen_in.npz" --outputs "$dir/out.npz"
expect_bad_input "varlen_in_decreasing.safetensors: cu_seqlens: not non-decreasing" \
  check --op linear --layout blhd --cu-seqlens --inputs "$dir/varlen_in_decreasing.safetensors" --outputs "$dir/varlen_out.safetensors"
expect_bad_input "varlen_in_short.safetensors: cu_seqlens: must end at the packed length T = 8" \
  check --op linear --layout blhd --cu-seqlens --inputs "$dir/varlen_in_short.safetensors" --outputs "$dir/varlen_out.safetensors"
expect_bad_input "varlen_out_truncated.safetensors: ht: data_offsets|out of range" \
  check --op linear --layout blhd --cu-seqlens --inputs "$dir/varlen_in.safetensors" --outputs "$dir/varlen_out_truncated.safetensors"
expect_bad_input "varlen_in.npz: cu_seqlens: present, but the case is not varlen" \
  check --op linear --layout blhd --inputs "$dir/varlen_in.npz" --outputs "$dir/varlen_out.npz"
expect_bad_input "in.npz: beta: required for --op delta" check --op delta --inputs "$dir/in.npz" --outputs "$dir/out.npz"
expect_bad_input "grads.npz: gradients: given, but the inputs hold no cotangent do" \
  check --op linear --inputs "$dir/in_no_do.npz" --outputs "$dir/out.npz" --grads "$dir/grads.npz"
expect_bad_input "absent.npz|cannot open" check --op linear --inputs "$dir/absent.npz" --outputs "$dir/out.npz"
expect_bad_input "--inputs" check --op linear --outputs "$dir/out.npz"
expect_bad_input "--layout" check --op linear --layout bthd --inputs "$dir/in.npz" --outputs "$dir/out.npz"
expect_bad_input "--op" check --op softmax --inputs "$dir/in.npz" --outputs "$dir/out.npz"

finish "check cli"
