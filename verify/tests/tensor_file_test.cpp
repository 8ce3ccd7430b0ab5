// Tensor files: every dtype round-trips bit for bit through .safetensors and .npz in both layouts;
// hand-assembled bytes (as numpy, ml_dtypes and the safetensors spec lay them out) decode to known
// values, so a flipped byte order or a wrong bf16/fp16 bit layout cannot hide behind a round trip;
// every bad file is refused with one line naming the file and the tensor.
#include "verify/tensor_file.hpp"

#include <gtest/gtest.h>
#include <zip.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numbers>
#include <unistd.h>

namespace {

using namespace deltaproof::verify;
using Bytes = std::vector<unsigned char>;

std::string temp_path(const std::string& name) {
  static const auto dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("deltaproof_tensor_file_test." + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return (dir / name).string();
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}
Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
Bytes text_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
Bytes le64(std::uint64_t u) {
  Bytes b;
  for (int i = 0; i < 8; ++i) b.push_back((unsigned char)(u >> (8 * i)));
  return b;
}

// A safetensors file from a header text and raw data, laid out as the spec says.
Bytes safetensors_bytes(const std::string& header, const Bytes& data) {
  return concat(concat(le64(header.size()), text_bytes(header)), data);
}

// A .npy entry from its header dict literal and raw data (format 1.0, or 2.0 with a 4-byte length).
Bytes npy_bytes(const std::string& dict, const Bytes& data, int major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major, 0};
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) b.push_back((unsigned char)(header.size() >> (8 * i)));
  return concat(concat(b, text_bytes(header)), data);
}

// An .npz archive of raw entries, assembled with libzip independently of the writer under test.
void write_npz(const std::string& path, const std::vector<std::pair<std::string, Bytes>>& entries) {
  int code = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
  ASSERT_NE(z, nullptr);
  for (const auto& [name, bytes] : entries) {
    zip_source_t* s = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
    ASSERT_GE(zip_file_add(z, name.c_str(), s, ZIP_FL_OVERWRITE), 0);
  }
  ASSERT_EQ(zip_close(z), 0);
}

// The raw bytes of one .npz entry.
Bytes npz_entry(const std::string& path, const std::string& name) {
  int code = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY, &code);
  EXPECT_NE(z, nullptr);
  zip_stat_t st;
  EXPECT_EQ(zip_stat(z, name.c_str(), 0, &st), 0);
  Bytes bytes(st.size);
  zip_file_t* f = zip_fopen(z, name.c_str(), 0);
  EXPECT_EQ(zip_fread(f, bytes.data(), st.size), zip_int64_t(st.size));
  zip_fclose(f);
  zip_discard(z);
  return bytes;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

void expect_same(const HostTensor& a, const HostTensor& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.dtype, b.dtype);
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) EXPECT_TRUE(same_bits(a.values[i], b.values[i])) << "entry " << i << ": " << a.values[i] << " vs " << b.values[i];
}

// The call must throw std::invalid_argument: one line, starting with the file, naming the tensor
// ("<file>: <tensor>: …") where there is one, and containing `what`.
void expect_bad(const std::function<void()>& call, const std::string& path, const std::string& tensor, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << "no error for " << path << " (" << tensor << ", " << what << ")";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << m;
    if (!tensor.empty()) {
      EXPECT_NE(m.find(path + ": " + tensor + ": "), std::string::npos) << m;
    }
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

// Values that probe each format's corners: subnormals, the largest finite, −0, the last mantissa bit.
std::vector<double> corner_values(DType d) {
  switch (d) {
    case DType::bf16: return {1.0, -2.5, 0x1p-133, 0x1p-126, -0.0, 0x1.FEp127, 3.140625, 1.0078125, -0x1.FEp127, 0.0, 0.5, -0x1p-130};
    case DType::f16: return {1.0, -2.5, 0x1p-24, 0x1p-14, -0.0, 65504.0, 1.0 + 0x1p-10, 0.99951171875, -65504.0, 0x1.FF8p-15, 3.0, -0x1p-20};
    case DType::f32: return {1.0, -2.5, 0x1p-149, 0x1p-126, -0.0, double(FLT_MAX), 1.0 + 0x1p-23, double(0.1f), -double(FLT_MAX), 0.0, 7.0, -0x1p-140};
    default: return {0.1, -2.5, 0x1p-1074, DBL_MIN, -0.0, DBL_MAX, 1.0 + 0x1p-52, std::numbers::pi, -DBL_MAX, 0.0, 1e300, -1e-310};
  }
}

const DType all_dtypes[] = {DType::bf16, DType::f16, DType::f32, DType::f64};
const char* formats[] = {".safetensors", ".npz"};

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(TensorFileRoundTrip, EveryFloatingDtypeBitForBitInBothFormats) {
  for (const char* ext : formats)
    for (DType d : all_dtypes) {
      TensorFile f;
      HostTensor t;
      t.dtype = d;
      t.values = corner_values(d);
      t.shape = {3, 1, 4};
      f.floating["x"] = t;
      HostTensor nonfinite;  // NaN and Inf are data too: the container keeps them, the loaders refuse them
      nonfinite.dtype = d;
      nonfinite.shape = {3};
      nonfinite.values = {HUGE_VAL, -HUGE_VAL, std::nan("")};
      f.floating["nonfinite"] = nonfinite;
      HostTensor scalar;
      scalar.dtype = d;
      scalar.shape = {};
      scalar.values = {-1.5};
      f.floating["scalar"] = scalar;
      HostTensor empty;
      empty.dtype = d;
      empty.shape = {2, 0, 3};
      f.floating["empty"] = empty;
      const std::string path = temp_path(std::string("roundtrip_") + deltaproof::verify::name_of(d) + ext);
      write_tensor_file(path, f);
      const TensorFile back = read_tensor_file(path);
      ASSERT_EQ(back.floating.size(), 4u) << path;
      for (const auto& [name, tensor] : f.floating) expect_same(back.floating.at(name), tensor, path + " " + name);
      EXPECT_TRUE(std::signbit(back.floating.at("x").values[4])) << path << ": −0 lost its sign";
    }
}

TEST(TensorFileRoundTrip, Int32AndInt64InBothFormats) {
  for (const char* ext : formats) {
    TensorFile f;
    f.integer["a"] = IntegerTensor{{5}, {0, 0, 1, 2147483647, -2147483648LL}, false};
    f.integer["b"] = IntegerTensor{{2, 2}, {0, -1, 1LL << 40, -(1LL << 62)}, true};
    const std::string path = temp_path(std::string("integers") + ext);
    write_tensor_file(path, f);
    const TensorFile back = read_tensor_file(path);
    for (const auto& [name, t] : f.integer) {
      EXPECT_EQ(back.integer.at(name).shape, t.shape) << path;
      EXPECT_EQ(back.integer.at(name).values, t.values) << path;
      EXPECT_EQ(back.integer.at(name).wide, t.wide) << path;
    }
  }
}

// A gated-delta case with every optional input, in one layout, values k/8 (exact in every dtype).
KernelCase full_case(Layout layout, DType d, bool varlen) {
  KernelCase c;
  c.op = Op::gated_delta;
  c.layout = layout;
  const Index B = varlen ? 1 : 2, H = 3, L = 6, DK = 4, DV = 2;
  if (varlen) c.cu_seqlens = {0, 0, 1, 6};  // an empty and a one-token sequence
  const Index N = varlen ? 3 : B;
  int counter = 0;
  auto fill = [&](std::vector<Index> shape, DType type) {
    HostTensor t;
    t.shape = std::move(shape);
    t.dtype = type;
    for (Index i = 0; i < t.size(); ++i) t.values.push_back(double((counter++ * 7) % 23 - 11) / 8.0);
    return t;
  };
  auto tokens = [&](Index dim) { return layout == Layout::bhld ? std::vector<Index>{B, H, L, dim} : std::vector<Index>{B, L, H, dim}; };
  auto gates = [&] { return layout == Layout::bhld ? std::vector<Index>{B, H, L} : std::vector<Index>{B, L, H}; };
  auto state = [&] { return layout == Layout::bhld ? std::vector<Index>{N, H, DV, DK} : std::vector<Index>{N, H, DK, DV}; };
  c.q = fill(tokens(DK), d);
  c.k = fill(tokens(DK), d);
  c.v = fill(tokens(DV), d);
  c.beta = fill(gates(), d);
  c.g = fill(gates(), DType::f32);
  for (double& x : c.g->values) x = -std::fabs(x);
  c.h0 = fill(state(), DType::f32);
  c.d_o = fill(tokens(DV), d);
  c.d_ht = fill(state(), DType::f32);
  return c;
}

TEST(TensorFileRoundTrip, KernelCaseInBothLayoutsFormatsAndDtypes) {
  for (const char* ext : formats)
    for (Layout layout : {Layout::bhld, Layout::blhd})
      for (DType d : all_dtypes)
        for (bool varlen : {false, true}) {
          const KernelCase c = full_case(layout, d, varlen);
          const std::string path = temp_path("case_" + name_of(layout) + "_" + deltaproof::verify::name_of(d) + (varlen ? "_varlen" : "") + ext);
          write_kernel_case(path, c);
          const KernelCase back = read_kernel_case(path, {Op::gated_delta, layout, varlen, 0.5, true});
          const std::string what = path;
          expect_same(back.q, c.q, what + " q");
          expect_same(back.k, c.k, what + " k");
          expect_same(back.v, c.v, what + " v");
          expect_same(*back.beta, *c.beta, what + " beta");
          expect_same(*back.g, *c.g, what + " g");
          expect_same(*back.h0, *c.h0, what + " h0");
          expect_same(*back.d_o, *c.d_o, what + " do");
          expect_same(*back.d_ht, *c.d_ht, what + " dht");
          EXPECT_EQ(back.cu_seqlens, c.cu_seqlens) << what;
          EXPECT_EQ(back.layout, layout);
          EXPECT_EQ(back.scale, 0.5);
          EXPECT_TRUE(back.l2_normalize_qk);

          KernelResult r;
          r.o = c.v;
          r.ht = c.h0;
          r.dq = c.q, r.dk = c.k, r.dv = c.v, r.dbeta = c.beta, r.dg = c.g, r.dh0 = c.h0;
          const std::string outputs = temp_path("outputs_" + name_of(layout) + ext), grads = temp_path("grads_" + name_of(layout) + ext);
          write_kernel_outputs(outputs, r);
          write_kernel_gradients(grads, r);
          const KernelResult rb = read_kernel_result(back, outputs, grads);
          expect_same(*rb.o, *r.o, outputs + " o");
          expect_same(*rb.ht, *r.ht, outputs + " ht");
          expect_same(*rb.dq, *r.dq, grads + " dq");
          expect_same(*rb.dbeta, *r.dbeta, grads + " dbeta");
          expect_same(*rb.dg, *r.dg, grads + " dg");
          expect_same(*rb.dh0, *r.dh0, grads + " dh0");
        }
}

TEST(TensorFileRoundTrip, Int32CuSeqlensAreRead) {
  KernelCase c = full_case(Layout::blhd, DType::bf16, true);
  write_kernel_case(temp_path("cu32.npz"), c);
  TensorFile f = read_tensor_file(temp_path("cu32.npz"));
  f.integer["cu_seqlens"].wide = false;
  write_tensor_file(temp_path("cu32.npz"), f);
  EXPECT_EQ(read_kernel_case(temp_path("cu32.npz"), {Op::gated_delta, Layout::blhd, true}).cu_seqlens, c.cu_seqlens);
}

// ---------------------------------------------------------------------------------------------
// Known bytes: what other writers put on disk decodes to what they meant.

TEST(TensorFileKnownBytes, SafetensorsAsTheSpecLaysThemOut) {
  const std::string header =
      R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]},)"
      R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"d":{"dtype":"I32","shape":[1],"data_offsets":[12,16]},)"
      R"("e":{"dtype":"F64","shape":[1],"data_offsets":[16,24]},"f":{"dtype":"I64","shape":[1],"data_offsets":[24,32]},)"
      R"("__metadata__":{"format":"pt"}})";
  const Bytes data = {0x80, 0x3F, 0x20, 0xC0,              // bf16 1.0, −2.5
                      0x00, 0x3C, 0x01, 0x00,              // fp16 1.0, 2⁻²⁴
                      0xCD, 0xCC, 0xCC, 0x3D,              // fp32 0.1f
                      0xFE, 0xFF, 0xFF, 0xFF,              // int32 −2
                      0, 0, 0, 0, 0, 0, 0xF0, 0x3F,        // fp64 1.0
                      0x05, 0x01, 0, 0, 0, 0, 0, 0};       // int64 261
  const std::string path = temp_path("known.safetensors");
  write_file(path, safetensors_bytes(header, data));
  const TensorFile f = read_tensor_file(path);
  EXPECT_EQ(f.floating.at("a").values, (std::vector<double>{1.0, -2.5}));
  EXPECT_EQ(f.floating.at("a").dtype, DType::bf16);
  EXPECT_EQ(f.floating.at("b").values, (std::vector<double>{1.0, 0x1p-24}));
  EXPECT_EQ(f.floating.at("b").dtype, DType::f16);
  EXPECT_EQ(f.floating.at("c").values, (std::vector<double>{double(0.1f)}));
  EXPECT_EQ(f.integer.at("d").values, (std::vector<std::int64_t>{-2}));
  EXPECT_FALSE(f.integer.at("d").wide);
  EXPECT_EQ(f.floating.at("e").values, (std::vector<double>{1.0}));
  EXPECT_EQ(f.integer.at("f").values, (std::vector<std::int64_t>{261}));
}

TEST(TensorFileKnownBytes, NpzAsNumpyAndMlDtypesWriteThem) {
  const std::string path = temp_path("known.npz");
  write_npz(path, {
      {"bf16_void.npy", npy_bytes("{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }", {0x80, 0x3F, 0x20, 0xC0})},
      {"bf16_bits.npy", npy_bytes("{'descr': '<u2', 'fortran_order': False, 'shape': (1, 1), }", {0x01, 0x00})},
      {"half.npy", npy_bytes("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", {0xFF, 0x7B, 0x00, 0xC1})},
      {"big.npy", npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (), }", {0x3F, 0x80, 0x00, 0x00})},
      {"v2.npy", npy_bytes("{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (1L,)}", {0, 0, 0, 0, 0, 0, 0x08, 0xC0}, 2)},
      {"cu.npy", npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                           concat(concat(le64(0), le64(1)), le64(300)))},
  });
  const TensorFile f = read_tensor_file(path);
  EXPECT_EQ(f.floating.at("bf16_void").values, (std::vector<double>{1.0, -2.5}));
  EXPECT_EQ(f.floating.at("bf16_void").dtype, DType::bf16);
  EXPECT_EQ(f.floating.at("bf16_bits").values, (std::vector<double>{0x1p-133}));
  EXPECT_EQ(f.floating.at("bf16_bits").shape, (std::vector<Index>{1, 1}));
  EXPECT_EQ(f.floating.at("half").values, (std::vector<double>{65504.0, -2.5}));
  EXPECT_EQ(f.floating.at("big").values, (std::vector<double>{1.0}));
  EXPECT_TRUE(f.floating.at("big").shape.empty());
  EXPECT_EQ(f.floating.at("v2").values, (std::vector<double>{-3.0}));
  EXPECT_EQ(f.integer.at("cu").values, (std::vector<std::int64_t>{0, 1, 300}));
}

TEST(TensorFileKnownBytes, WritersLayOutLittleEndianAsNumpyAndTheSpecExpect) {
  TensorFile f;
  HostTensor a;
  a.dtype = DType::bf16, a.shape = {2}, a.values = {1.0, -2.5};
  f.floating["a"] = a;
  HostTensor b;
  b.dtype = DType::f16, b.shape = {1}, b.values = {0x1p-24};
  f.floating["b"] = b;
  write_tensor_file(temp_path("writer.npz"), f);
  const Bytes entry = npz_entry(temp_path("writer.npz"), "a.npy");
  const std::string header(entry.begin() + 10, entry.end() - 4);
  EXPECT_NE(header.find("'descr': '<V2'"), std::string::npos) << header;
  EXPECT_NE(header.find("'shape': (2,)"), std::string::npos) << header;
  EXPECT_EQ(entry.size() % 64, 4u);  // data starts on a 64-byte boundary, as numpy writes it
  EXPECT_EQ(Bytes(entry.end() - 4, entry.end()), (Bytes{0x80, 0x3F, 0x20, 0xC0}));
  EXPECT_EQ(npz_entry(temp_path("writer.npz"), "b.npy").back(), 0x00);

  write_tensor_file(temp_path("writer.safetensors"), f);
  const Bytes st = read_file(temp_path("writer.safetensors"));
  EXPECT_EQ(Bytes(st.end() - 6, st.end()), (Bytes{0x80, 0x3F, 0x20, 0xC0, 0x01, 0x00}));
  EXPECT_EQ((st.size() - 6) % 8, 0u);
}

TEST(TensorFileRounding, RoundToIsACastToNearestEven) {
  EXPECT_EQ(round_to(DType::bf16, 1.0 + 0x1p-8), 1.0);                 // tie → even
  EXPECT_EQ(round_to(DType::bf16, 1.0 + 3 * 0x1p-8), 1.0 + 0x1p-6);    // tie → even (up)
  EXPECT_EQ(round_to(DType::f16, 65520.0), HUGE_VAL);                   // past the largest half-ulp → Inf
  EXPECT_EQ(round_to(DType::f16, 65519.0), 65504.0);
  EXPECT_EQ(round_to(DType::f16, 0x1p-25), 0.0);                        // tie at half the least subnormal → 0
  EXPECT_EQ(round_to(DType::f16, 0x1.8p-25), 0x1p-24);
  EXPECT_EQ(round_to(DType::f32, 0.1), double(0.1f));
  EXPECT_EQ(round_to(DType::f64, 0.1), 0.1);
}

TEST(TensorFileWriter, RefusesAValueItsDtypeCannotHoldAndWritesNothing) {
  TensorFile f;
  HostTensor t;
  t.dtype = DType::bf16, t.shape = {2}, t.values = {1.0, 0.1};
  f.floating["q"] = t;
  for (const char* ext : formats) {
    const std::string path = temp_path(std::string("inexact") + ext);
    std::filesystem::remove(path);
    expect_bad([&] { write_tensor_file(path, f); }, path, "q", "not exactly representable in bf16");
    EXPECT_FALSE(std::filesystem::exists(path));
  }
}

// ---------------------------------------------------------------------------------------------
// Bad containers

const std::string good_header = R"({"q":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
const Bytes good_data = {0, 0, 0x80, 0x3F, 0, 0, 0, 0x40};

void expect_bad_file(const std::string& name, const Bytes& bytes, const std::string& tensor, const std::string& what) {
  const std::string path = temp_path(name);
  write_file(path, bytes);
  expect_bad([&] { read_tensor_file(path); }, path, tensor, what);
}

TEST(TensorFileBadSafetensors, ShorterThanTheHeaderLength) {
  expect_bad_file("short.safetensors", {0x10, 0, 0}, "", "truncated");
}
TEST(TensorFileBadSafetensors, HeaderLongerThanTheFile) {
  Bytes b = safetensors_bytes(good_header, good_data);
  b.resize(8 + good_header.size() / 2);
  expect_bad_file("header_cut.safetensors", b, "", "truncated");
}
TEST(TensorFileBadSafetensors, TruncatedData) {
  Bytes b = safetensors_bytes(good_header, good_data);
  b.pop_back();
  expect_bad_file("data_cut.safetensors", b, "q", "out of range");
}
TEST(TensorFileBadSafetensors, HeaderOffsetsOutOfRange) {
  expect_bad_file("offsets_far.safetensors",
                  safetensors_bytes(R"({"q":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", good_data), "q", "out of range");
}
TEST(TensorFileBadSafetensors, HeaderOffsetsReversed) {
  expect_bad_file("offsets_reversed.safetensors",
                  safetensors_bytes(R"({"q":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", good_data), "q", "out of range");
}
TEST(TensorFileBadSafetensors, HeaderOffsetsDisagreeWithShape) {
  expect_bad_file("offsets_shape.safetensors",
                  safetensors_bytes(R"({"q":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", good_data), "q", "needs 12");
}
TEST(TensorFileBadSafetensors, NegativeOffset) {
  expect_bad_file("offsets_negative.safetensors",
                  safetensors_bytes(R"({"q":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", good_data), "q", "data_offsets");
}
TEST(TensorFileBadSafetensors, UnsupportedDtype) {
  expect_bad_file("dtype.safetensors",
                  safetensors_bytes(R"({"q":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", good_data), "q", "unsupported dtype I16");
}
TEST(TensorFileBadSafetensors, HeaderNotJson) {
  expect_bad_file("json.safetensors", safetensors_bytes(R"({"q":{"dtype":"F32",)", good_data), "", "not valid JSON");
}
TEST(TensorFileBadSafetensors, EntryWithoutShape) {
  expect_bad_file("noshape.safetensors", safetensors_bytes(R"({"q":{"dtype":"F32","data_offsets":[0,8]}})", good_data), "q",
                  "lacks dtype, shape or data_offsets");
}

const std::string good_npy_header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";

void expect_bad_npz(const std::string& name, const Bytes& entry, const std::string& what) {
  const std::string path = temp_path(name);
  write_npz(path, {{"q.npy", entry}});
  expect_bad([&] { read_tensor_file(path); }, path, "q", what);
}

TEST(TensorFileBadNpz, TruncatedArchive) {
  const std::string good = temp_path("good.npz");
  write_npz(good, {{"q.npy", npy_bytes(good_npy_header, good_data)}});
  Bytes b = read_file(good);
  b.resize(b.size() * 2 / 3);
  expect_bad_file("truncated.npz", b, "", "truncated or damaged");
}
TEST(TensorFileBadNpz, NotAZipArchive) { expect_bad_file("plain.npz", text_bytes("q = [1, 2]\n"), "", "not a readable .npz"); }
TEST(TensorFileBadNpz, MissingFile) {
  expect_bad([] { read_tensor_file(temp_path("absent.npz")); }, temp_path("absent.npz"), "", "cannot open");
}
TEST(TensorFileBadNpz, UnknownExtension) {
  expect_bad([] { read_tensor_file(temp_path("q.pt")); }, temp_path("q.pt"), "", "unknown file type");
}
TEST(TensorFileBadNpz, TruncatedArrayData) {
  expect_bad_npz("npy_short.npz", npy_bytes(good_npy_header, {0, 0, 0x80, 0x3F, 0}), "truncated");
}
TEST(TensorFileBadNpz, TrailingArrayData) {
  expect_bad_npz("npy_long.npz", npy_bytes(good_npy_header, concat(good_data, {0, 0, 0, 0})), "trailing bytes");
}
TEST(TensorFileBadNpz, TruncatedNpyHeader) {
  const Bytes whole = npy_bytes(good_npy_header, good_data);
  expect_bad_npz("npy_header_cut.npz", Bytes(whole.begin(), whole.begin() + 40), "truncated .npy header");
}
TEST(TensorFileBadNpz, BadMagic) { expect_bad_npz("npy_magic.npz", text_bytes("NUMPY but not really"), "bad magic"); }
TEST(TensorFileBadNpz, FortranOrder) {
  expect_bad_npz("npy_fortran.npz", npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2), }", good_data),
                 "fortran_order True");
}
TEST(TensorFileBadNpz, UnsupportedDtype) {
  for (const char* descr : {"<i2", "<c8", "|b1", "<f16", "|u1", "<V4"})
    expect_bad_npz("npy_dtype.npz", npy_bytes(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }", good_data),
                   "unsupported dtype '" + std::string(descr) + "'");
}
TEST(TensorFileBadNpz, StructuredDtype) {
  expect_bad_npz("npy_struct.npz",
                 npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", good_data), "structured");
}
TEST(TensorFileBadNpz, MalformedHeader) {
  expect_bad_npz("npy_garbage.npz", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,", good_data), "not a Python dict");
  expect_bad_npz("npy_extra_key.npz", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", good_data),
                 "unexpected key 'x'");
  expect_bad_npz("npy_no_shape.npz", npy_bytes("{'descr': '<f4', 'fortran_order': False}", good_data), "exactly the keys");
  expect_bad_npz("npy_float_shape.npz", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}", good_data),
                 "not a Python dict");
}
TEST(TensorFileBadNpz, EntryThatIsNotNpy) {
  const std::string path = temp_path("readme.npz");
  write_npz(path, {{"README.txt", text_bytes("hello")}});
  expect_bad([&] { read_tensor_file(path); }, path, "README.txt", "not a .npy");
}

// ---------------------------------------------------------------------------------------------
// Bad cases: the loaders of `deltaproof check`

struct BadCase : ::testing::Test {
  KernelCase c = full_case(Layout::blhd, DType::f32, true);
  CaseFlags flags{Op::gated_delta, Layout::blhd, true};
  const std::string inputs = temp_path("bad_inputs.safetensors");

  // Writes the case's inputs with `edit` applied to the file's tensors.
  void write_inputs(const std::function<void(TensorFile&)>& edit) {
    write_kernel_case(inputs, c);
    TensorFile f = read_tensor_file(inputs);
    edit(f);
    write_tensor_file(inputs, f);
  }
  void expect_bad_inputs(const std::string& tensor, const std::string& what) {
    expect_bad([&] { read_kernel_case(inputs, flags); }, inputs, tensor, what);
  }
};

TEST_F(BadCase, MissingTensor) {
  write_inputs([](TensorFile& f) { f.floating.erase("v"); });
  expect_bad_inputs("v", "missing");
}
TEST_F(BadCase, MissingGateForTheOp) {
  write_inputs([](TensorFile& f) { f.floating.erase("g"); });
  expect_bad_inputs("g", "required for --op gated-delta");
}
TEST_F(BadCase, UnexpectedTensor) {
  write_inputs([](TensorFile& f) { f.floating["h_0"] = f.floating["h0"]; });
  expect_bad_inputs("h_0", "not an input");
}
TEST_F(BadCase, ShapeMismatch) {
  write_inputs([](TensorFile& f) { f.floating["k"].shape[3] = 2, f.floating["k"].values.resize(f.floating["k"].values.size() / 2); });
  expect_bad_inputs("k", "shape [1, 6, 3, 2], expected [1, 6, 3, 4]");
}
TEST_F(BadCase, StateShapeInTheOtherLayout) {
  write_inputs([](TensorFile& f) { std::swap(f.floating["h0"].shape[2], f.floating["h0"].shape[3]); });
  expect_bad_inputs("h0", "expected [3, 3, 4, 2]");
}
TEST_F(BadCase, IntegerWhereFloatingExpected) {
  write_inputs([](TensorFile& f) {
    f.floating.erase("beta");
    f.integer["beta"] = IntegerTensor{{1, 6, 3}, std::vector<std::int64_t>(18, 1), true};
  });
  expect_bad_inputs("beta", "stored as int64, expected bf16, fp16, fp32 or fp64");
}
TEST_F(BadCase, FloatingCuSeqlens) {
  write_inputs([](TensorFile& f) {
    f.integer.erase("cu_seqlens");
    HostTensor t;
    t.shape = {4}, t.values = {0, 0, 1, 6};
    f.floating["cu_seqlens"] = t;
  });
  expect_bad_inputs("cu_seqlens", "stored as fp32, expected int32 or int64");
}
TEST_F(BadCase, CuSeqlensDecreasing) {
  write_inputs([](TensorFile& f) { f.integer["cu_seqlens"].values = {0, 2, 1, 6}; });
  expect_bad_inputs("cu_seqlens", "not non-decreasing");
}
TEST_F(BadCase, CuSeqlensNotEndingAtT) {
  write_inputs([](TensorFile& f) { f.integer["cu_seqlens"].values = {0, 0, 1, 5}; });
  expect_bad_inputs("cu_seqlens", "must end at the packed length T = 6");
}
TEST_F(BadCase, CuSeqlensNotStartingAtZero) {
  write_inputs([](TensorFile& f) { f.integer["cu_seqlens"].values = {1, 1, 2, 6}; });
  expect_bad_inputs("cu_seqlens", "must start at 0");
}
TEST_F(BadCase, CuSeqlensMissingForVarlen) {
  write_inputs([](TensorFile& f) { f.integer.erase("cu_seqlens"); });
  expect_bad_inputs("cu_seqlens", "missing");
}
TEST_F(BadCase, CuSeqlensGivenButNotVarlen) {
  write_inputs([](TensorFile&) {});
  flags.varlen = false;
  expect_bad_inputs("cu_seqlens", "not varlen");
}
TEST_F(BadCase, NaNInInput) {
  write_inputs([](TensorFile& f) { f.floating["q"].values[5] = std::nan(""); });
  expect_bad_inputs("q", "entry (0, 0, 1, 1) is NaN");
}
TEST_F(BadCase, InfInInput) {
  write_inputs([](TensorFile& f) { f.floating["dht"].values.back() = -HUGE_VAL; });
  expect_bad_inputs("dht", "entry (2, 2, 3, 1) is Inf");
}

struct BadResult : BadCase {
  const std::string outputs = temp_path("bad_outputs.npz"), grads = temp_path("bad_grads.npz");
  KernelResult r;
  void SetUp() override {
    write_inputs([](TensorFile&) {});
    r.o = c.v, r.ht = c.h0, r.dq = c.q, r.dg = c.g, r.dh0 = c.h0;
  }
  void write_and_expect_bad(const std::string& path, const std::string& tensor, const std::string& what) {
    write_kernel_outputs(outputs, r);
    write_kernel_gradients(grads, r);
    const KernelCase loaded = read_kernel_case(inputs, flags);
    expect_bad([&] { read_kernel_result(loaded, outputs, grads); }, path, tensor, what);
  }
};

TEST_F(BadResult, NaNInOutput) {
  r.o->values[3] = std::nan("");
  write_and_expect_bad(outputs, "o", "entry (0, 0, 1, 1) is NaN");
}
TEST_F(BadResult, InfInFinalState) {
  r.ht->values[0] = HUGE_VAL;
  write_and_expect_bad(outputs, "ht", "entry (0, 0, 0, 0) is Inf");
}
TEST_F(BadResult, NaNInGradient) {
  r.dg->values[17] = std::nan("");
  write_and_expect_bad(grads, "dg", "entry (0, 5, 2) is NaN");
}
TEST_F(BadResult, OutputShapeMismatch) {
  r.o = c.q;
  write_and_expect_bad(outputs, "o", "shape [1, 6, 3, 4], expected [1, 6, 3, 2]");
}
TEST_F(BadResult, MissingOutput) {
  r.o.reset();
  write_and_expect_bad(outputs, "o", "missing");
}
TEST_F(BadResult, GradientShapeMismatch) {
  r.dh0 = c.d_o;
  write_and_expect_bad(grads, "dh0", "expected [3, 3, 4, 2]");
}
TEST_F(BadResult, GradientsWithoutCotangent) {
  c.d_o.reset(), c.d_ht.reset();
  write_inputs([](TensorFile&) {});
  write_and_expect_bad(grads, "gradients", "no cotangent do");
}
TEST_F(BadResult, UnexpectedOutput) {
  write_kernel_outputs(outputs, r);
  TensorFile f = read_tensor_file(outputs);
  f.floating["final_state"] = f.floating["ht"];
  write_tensor_file(outputs, f);
  const KernelCase loaded = read_kernel_case(inputs, flags);
  expect_bad([&] { read_kernel_result(loaded, outputs); }, outputs, "final_state", "not an output");
}

}  // namespace
