// Named tensors in files — `.safetensors` (the PyTorch world's tensor file) and `.npz` (numpy's) —
// read into exact doubles and written from them, and the loaders that turn an inputs file and an
// outputs file into a KernelCase and a KernelResult (`deltaproof check`).
//
// Dtypes: bf16, fp16, fp32, fp64 (floating: every value decoded exactly into a double, its storage
// type kept in HostTensor::dtype) and int32, int64 (integer path, for cu_seqlens).
//   .safetensors  "BF16", "F16", "F32", "F64", "I32", "I64"; header parsed by nlohmann-json, byte
//                 ranges checked against the file. "__metadata__" is ignored on reading.
//   .npz          a zip archive (libzip; stored or deflated) of `<tensor>.npy` entries; .npy descr
//                 '<f2', '<f4', '<f8', '<i4', '<i8' (and their big-endian '>' forms).
//                 fortran_order True is refused: save C-contiguous arrays.
//   bf16 in .npz: numpy has no bfloat16, so a bf16 tensor is stored as its 16-bit patterns (the top
//                 half of the fp32 word), little-endian, under either descr:
//                   '<V2'  what numpy writes for an ml_dtypes.bfloat16 array (np.savez(f, q=x_bf16));
//                          deltaproof writes bf16 this way. Read back with `.view(ml_dtypes.bfloat16)`.
//                   '<u2'  a plain uint16 array of bf16 bit patterns, e.g. `x.view(np.uint16)` of an
//                          ml_dtypes array, `t.view(torch.uint16).numpy()` of a torch bf16 tensor, or
//                          `(f32.view(np.uint32) >> 16).astype(np.uint16)` for float32 values that
//                          are already bf16-exact. No tensor of this family is an unsigned integer,
//                          so '<u2' always means bf16 here.
//
// Errors: std::invalid_argument with one line "<file>: <tensor>: <what>" (or "<file>: <what>" when
// the container itself is bad): unreadable or truncated file, header offsets outside the data,
// unsupported dtype, missing or unexpected tensor, shape mismatch, NaN or Inf in any tensor read by
// the loaders, a negative beta, cu_seqlens not starting at 0, decreasing or not ending at T.
#pragma once

#include "verify/kernel_case.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace deltaproof::verify {

// An integer tensor (cu_seqlens): values widened to int64, `wide` says whether the file held int64.
struct IntegerTensor {
  std::vector<Index> shape;
  std::vector<std::int64_t> values;  // row-major
  bool wide = true;                  // int64 (else int32)
};

// The tensors of one file, by name (a file's names are unique, so one map per kind).
struct TensorFile {
  std::map<std::string, HostTensor> floating;
  std::map<std::string, IntegerTensor> integer;
};

// Reads by extension (.safetensors or .npz). Values are checked for nothing but their container:
// non-finite numbers are read as they are (the loaders below refuse them).
TensorFile read_tensor_file(const std::string& path);

// Writes by extension. Every finite value must be exactly representable in its tensor's dtype
// (throws std::invalid_argument naming the tensor, before anything is written); NaN and ±Inf are
// written as they are. int32 values must fit in 32 bits.
void write_tensor_file(const std::string& path, const TensorFile& contents);

// x rounded to the nearest value of `dtype` (ties to even, overflow to ±Inf), as a cast would.
double round_to(DType dtype, double x);

// What the command line says about a case that the file does not: op, layout, varlen, scale.
struct CaseFlags {
  Op op = Op::linear;
  Layout layout = Layout::bhld;
  bool varlen = false;           // the inputs hold cu_seqlens (int32 or int64)
  double scale = 1.0;
  bool l2_normalize_qk = false;
};

// Inputs file: q, k, v; beta (delta ops), g (gated-delta); optional h0; optional do and dht (the
// cotangents the gradients were computed for); cu_seqlens when flags.varlen. Any other name is an
// error. The case is validated (KernelCase::validate), errors prefixed with the file.
KernelCase read_kernel_case(const std::string& inputs_path, const CaseFlags& flags);

// Outputs file: o, optional ht. Gradients file (optional, "" = none): any of dq, dk, dv, dbeta, dg,
// dh0. Shapes are checked against the case (validate_result); NaN or Inf in any of them is an error.
KernelResult read_kernel_result(const KernelCase& c, const std::string& outputs_path,
                                const std::string& gradients_path = "");

// The inverse of the loaders (for tests, generators and the Python side): the case's inputs (and
// cotangents, cu_seqlens as int64); the result's o and ht; the result's gradients.
void write_kernel_case(const std::string& path, const KernelCase& c);
void write_kernel_outputs(const std::string& path, const KernelResult& r);
void write_kernel_gradients(const std::string& path, const KernelResult& r);

}  // namespace deltaproof::verify
