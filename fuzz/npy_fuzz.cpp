// Fuzz target: one .npy member inside an otherwise valid .npz kernel case. Byte mutations of a whole
// .npz (npz target) mostly break the zip's CRC-32 and never reach the .npy header parser; here the
// target builds the archive itself, so every input reaches it. Input: one byte choosing the
// member's name, then the member's bytes. The other members are a Gated DeltaNet case with
// B = 1, H = L = 3, DK = DV = 2 (valid in both layouts) and cu_seqlens [0, 1, 3]; a chosen name
// that is already there replaces that member. Checks: tensor_file_checks.hpp.
#include "fuzz/tensor_file_checks.hpp"

#include <zip.h>

#include <cstring>
#include <iterator>
#include <map>
#include <vector>

namespace {

using Bytes = std::vector<unsigned char>;

// A version-1 .npy: the header for descr and shape, then the data bytes as given.
Bytes npy(const std::string& descr, const std::string& shape, const Bytes& data) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(header.size() & 0xFF), (unsigned char)(header.size() >> 8)};
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes float32s(int count, int seed) {
  Bytes out;
  for (int i = 0; i < count; ++i) {
    const float x = float(((i * 7 + seed) % 17) - 8) / 8;
    unsigned char b[4];
    std::memcpy(b, &x, 4);  // x86: little-endian, as '<f4'
    out.insert(out.end(), b, b + 4);
  }
  return out;
}

const std::map<std::string, Bytes>& template_members() {
  static const std::map<std::string, Bytes> members = [] {
    std::map<std::string, Bytes> m;
    m["q"] = npy("<f4", "(1, 3, 3, 2)", float32s(18, 1));
    m["k"] = npy("<f4", "(1, 3, 3, 2)", float32s(18, 2));
    m["v"] = npy("<f4", "(1, 3, 3, 2)", float32s(18, 3));
    Bytes beta = float32s(9, 4);
    for (size_t i = 3; i < beta.size(); i += 4) beta[i] &= 0x7F;  // sign bit clear: beta >= 0
    m["beta"] = npy("<f4", "(1, 3, 3)", beta);
    Bytes g = float32s(9, 5);
    for (size_t i = 3; i < g.size(); i += 4) g[i] |= 0x80;  // g <= 0
    m["g"] = npy("<f4", "(1, 3, 3)", g);
    m["cu_seqlens"] = npy("<i8", "(3,)", Bytes{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0});
    return m;
  }();
  return members;
}

const char* const member_names[] = {"q", "k", "v", "beta", "g", "cu_seqlens", "h0", "do", "dht", "o"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using deltaproof::fuzz::finding;
  if (size == 0) return 0;
  std::map<std::string, Bytes> members = template_members();
  members[member_names[data[0] % std::size(member_names)]] = Bytes(data + 1, data + size);
  const std::string path = deltaproof::fuzz::scratch_path("", ".npz");
  int code = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
  if (!archive) finding("cannot create the scratch archive " + path);
  for (const auto& [name, bytes] : members) {
    zip_source_t* source = zip_source_buffer(archive, bytes.data(), bytes.size(), 0);  // `members` outlives zip_close
    const zip_int64_t at = source ? zip_file_add(archive, (name + ".npy").c_str(), source, ZIP_FL_OVERWRITE) : -1;
    if (at < 0) finding("cannot add " + name + " to the scratch archive");
    zip_set_file_compression(archive, zip_uint64_t(at), ZIP_CM_STORE, 0);
  }
  if (zip_close(archive) != 0) finding("cannot write the scratch archive " + path);
  deltaproof::fuzz::check_tensor_file(path);
  return 0;
}
