// .npz (numpy's tensor file): a zip archive, through libzip, of .npy members whose headers are
// Python dict literals, read by a small parser of that literal subset here. Values go through the
// shared codecs of tensor_file_internal.hpp.
#include "verify/tensor_file_internal.hpp"

#include <zip.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <utility>

namespace deltaproof::verify::tensor_files {

namespace {

// ---------------------------------------------------------------------------------------------
// .npy header: magic "\x93NUMPY", version, header length, then a Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// parsed here by a small recursive-descent reader of that literal subset (strings, True/False,
// integers, tuples and lists, dicts).

struct Literal {
  enum Kind { string, boolean, integer, sequence, dict } kind = string;
  std::string text;
  bool truth = false;
  Index number = 0;
  std::vector<Literal> items;      // a sequence's items, or a dict's values
  std::vector<std::string> keys;   // a dict's keys, one per item (std::pair would need Literal complete)
};

class LiteralParser {
 public:
  explicit LiteralParser(const std::string& s) : s_(s) {}

  // The whole header: one dict, then only whitespace.
  std::optional<Literal> parse_header() {
    auto value = parse_value(0);
    skip_space();
    if (!value || value->kind != Literal::dict || at_ != s_.size()) return std::nullopt;
    return value;
  }

 private:
  void skip_space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < s_.size() && s_[at_] == c) return ++at_, true;
    return false;
  }
  bool take_word(const char* word) {
    skip_space();
    const size_t n = std::strlen(word);
    if (s_.compare(at_, n, word) != 0) return false;
    at_ += n;
    return true;
  }

  std::optional<Literal> parse_value(int depth) {
    if (depth > 8) return std::nullopt;
    skip_space();
    if (at_ >= s_.size()) return std::nullopt;
    const char c = s_[at_];
    Literal v;
    if (c == '\'' || c == '"') {
      auto text = parse_string();
      if (!text) return std::nullopt;
      v.kind = Literal::string, v.text = *text;
    } else if (take_word("True")) {
      v.kind = Literal::boolean, v.truth = true;
    } else if (take_word("False")) {
      v.kind = Literal::boolean, v.truth = false;
    } else if (c >= '0' && c <= '9') {
      v.kind = Literal::integer;
      while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') {
        if (v.number > (std::numeric_limits<Index>::max() - 9) / 10) return std::nullopt;
        v.number = v.number * 10 + (s_[at_++] - '0');
      }
      if (at_ < s_.size() && s_[at_] == 'L') ++at_;  // Python 2 long literal in old files
    } else if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      ++at_;
      v.kind = Literal::sequence;
      while (!take(close)) {
        auto item = parse_value(depth + 1);
        if (!item) return std::nullopt;
        v.items.push_back(std::move(*item));
        if (!take(',')) {
          if (!take(close)) return std::nullopt;
          break;
        }
      }
    } else if (c == '{') {
      ++at_;
      v.kind = Literal::dict;
      while (!take('}')) {
        skip_space();
        auto key = parse_string();
        if (!key || !take(':')) return std::nullopt;
        auto value = parse_value(depth + 1);
        if (!value) return std::nullopt;
        v.keys.push_back(*key);
        v.items.push_back(std::move(*value));
        if (!take(',')) {
          if (!take('}')) return std::nullopt;
          break;
        }
      }
    } else {
      return std::nullopt;
    }
    return v;
  }

  std::optional<std::string> parse_string() {
    if (at_ >= s_.size() || (s_[at_] != '\'' && s_[at_] != '"')) return std::nullopt;
    const char quote = s_[at_++];
    std::string out;
    while (at_ < s_.size() && s_[at_] != quote) {
      if (s_[at_] == '\\') {
        if (++at_ >= s_.size()) return std::nullopt;
      }
      out += s_[at_++];
    }
    if (at_ >= s_.size()) return std::nullopt;
    ++at_;
    return out;
  }

  const std::string& s_;
  size_t at_ = 0;
};

// descr → stored type and byte order. '<V2' and '<u2' are bf16 bit patterns (see the header).
std::optional<std::pair<Stored, bool>> npy_type(const std::string& descr) {
  if (descr.size() < 3) return std::nullopt;
  const char order = descr[0];
  const std::string code = descr.substr(1);
  if (code == "V2" && (order == '<' || order == '|')) return std::pair{Stored::bf16, true};
  if (order != '<' && order != '>') return std::nullopt;
  const bool little = order == '<';
  if (code == "f2") return std::pair{Stored::f16, little};
  if (code == "f4") return std::pair{Stored::f32, little};
  if (code == "f8") return std::pair{Stored::f64, little};
  if (code == "i4") return std::pair{Stored::i32, little};
  if (code == "i8") return std::pair{Stored::i64, little};
  if (code == "u2") return std::pair{Stored::bf16, little};
  return std::nullopt;
}

const char* npy_descr(Stored t) {
  switch (t) {
    case Stored::bf16: return "<V2";
    case Stored::f16: return "<f2";
    case Stored::f32: return "<f4";
    case Stored::f64: return "<f8";
    case Stored::i32: return "<i4";
    default: return "<i8";
  }
}

void read_npy(const std::string& path, const std::string& name, const std::vector<unsigned char>& bytes, TensorFile& file) {
  static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0) fail(path, name, "not a .npy entry (bad magic or truncated)");
  const int major = bytes[6];
  size_t header_at = 0, header_length = 0;
  if (major == 1) {
    header_length = size_t(load_unsigned(bytes.data() + 8, 2, true)), header_at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(path, name, "truncated .npy header");
    header_length = size_t(load_unsigned(bytes.data() + 8, 4, true)), header_at = 12;
  } else {
    fail(path, name, ".npy format version " + std::to_string(major) + " is not supported (1, 2 or 3)");
  }
  if (header_length > bytes.size() - header_at) fail(path, name, "truncated .npy header");
  const std::string text(reinterpret_cast<const char*>(bytes.data() + header_at), header_length);
  const auto header = LiteralParser(text).parse_header();
  if (!header) fail(path, name, ".npy header is not a Python dict literal");
  const Literal *descr = nullptr, *fortran = nullptr, *shape_literal = nullptr;
  for (size_t i = 0; i < header->keys.size(); ++i) {
    const std::string& key = header->keys[i];
    const Literal& value = header->items[i];
    if (key == "descr") descr = &value;
    else if (key == "fortran_order") fortran = &value;
    else if (key == "shape") shape_literal = &value;
    else fail(path, name, ".npy header has an unexpected key '" + key + "'");
  }
  if (!descr || !fortran || !shape_literal || header->keys.size() != 3)
    fail(path, name, ".npy header needs exactly the keys descr, fortran_order and shape");
  if (descr->kind != Literal::string)
    fail(path, name, "unsupported dtype: structured arrays are not tensors (expected a plain numeric descr)");
  const auto type = npy_type(descr->text);
  if (!type)
    fail(path, name, "unsupported dtype '" + descr->text + "' (expected <f2, <f4, <f8, <i4, <i8, or <V2/<u2 for bf16)");
  if (fortran->kind != Literal::boolean) fail(path, name, ".npy fortran_order is not True or False");
  if (fortran->truth) fail(path, name, "fortran_order True is not supported (save a C-contiguous array)");
  if (shape_literal->kind != Literal::sequence) fail(path, name, ".npy shape is not a tuple");
  std::vector<Index> shape;
  for (const auto& d : shape_literal->items) {
    if (d.kind != Literal::integer) fail(path, name, ".npy shape holds a value that is not a non-negative integer");
    shape.push_back(d.number);
  }
  const auto count = element_count(shape);
  if (!count) fail(path, name, "shape " + shape_text(shape) + " is too large");
  const size_t data_at = header_at + header_length;
  const std::uint64_t needed = std::uint64_t(*count) * bytes_of(type->first);
  const std::uint64_t held = bytes.size() - data_at;
  if (held != needed)
    fail(path, name, (held < needed ? "truncated: " : "trailing bytes: ") + std::to_string(held) + " data bytes, shape " +
                         shape_text(shape) + " of '" + descr->text + "' needs " + std::to_string(needed));
  add_tensor(file, name, RawTensor{type->first, shape, bytes.data() + data_at, type->second});
}

std::vector<unsigned char> write_npy(Stored type, const std::vector<Index>& shape, const std::vector<unsigned char>& data) {
  std::string shape_literal = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_literal += (i ? ", " : "") + std::to_string(shape[i]);
  shape_literal += shape.size() == 1 ? ",)" : ")";
  std::string header = std::string("{'descr': '") + npy_descr(type) + "', 'fortran_order': False, 'shape': " + shape_literal + ", }";
  // Pad with spaces so that the data starts on a 64-byte boundary, newline last (as numpy does).
  const size_t prefix = 10;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::vector<unsigned char> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  store_unsigned(header.size(), 2, out);
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// ---------------------------------------------------------------------------------------------
// .npz through libzip.

std::string zip_error_text(int code) {
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  std::string text = zip_error_strerror(&error);
  zip_error_fini(&error);
  return text;
}

struct ZipCloser {
  void operator()(zip_t* z) const {
    if (z) zip_discard(z);
  }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const {
    if (f) zip_fclose(f);
  }
};

}  // namespace

TensorFile read_npz(const std::string& path) {
  {
    std::ifstream probe(path, std::ios::binary);
    if (!probe) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  }
  int code = 0;
  std::unique_ptr<zip_t, ZipCloser> archive(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code));
  if (!archive) fail(path, "not a readable .npz (zip) archive, truncated or damaged: " + zip_error_text(code));
  TensorFile file;
  const zip_int64_t entries = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < entries; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(archive.get(), zip_uint64_t(i), 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_SIZE))
      fail(path, "entry " + std::to_string(i) + " unreadable: " + zip_strerror(archive.get()));
    const std::string entry = st.name;
    if (!ends_with(entry, ".npy")) fail(path, entry, "entry is not a .npy file");
    const std::string name = entry.substr(0, entry.size() - 4);
    if (file.floating.count(name) || file.integer.count(name)) fail(path, name, "stored twice");
    std::unique_ptr<zip_file_t, ZipFileCloser> member(zip_fopen_index(archive.get(), zip_uint64_t(i), 0));
    if (!member) fail(path, name, std::string("cannot open the entry: ") + zip_strerror(archive.get()));
    if (st.size > (zip_uint64_t(1) << 40)) fail(path, name, "entry too large");
    std::vector<unsigned char> bytes(size_t(st.size));
    zip_int64_t got = 0;
    while (got < zip_int64_t(st.size)) {
      const zip_int64_t n = zip_fread(member.get(), bytes.data() + got, st.size - zip_uint64_t(got));
      if (n < 0) fail(path, name, std::string("entry truncated or damaged: ") + zip_file_strerror(member.get()));
      if (n == 0) break;
      got += n;
    }
    if (got != zip_int64_t(st.size))
      fail(path, name, "entry truncated: " + std::to_string(got) + " of " + std::to_string(st.size) + " bytes");
    read_npy(path, name, bytes, file);
  }
  return file;
}

void write_npz(const std::string& path, const TensorFile& contents) {
  // Encode everything first: a value that does not fit its dtype throws before the file is touched.
  std::vector<std::pair<std::string, std::vector<unsigned char>>> members;
  for (const auto& [name, t] : contents.floating)
    members.emplace_back(name, write_npy(stored_of(t.dtype), t.shape, encode_tensor(path, name, t)));
  for (const auto& [name, t] : contents.integer) {
    if (contents.floating.count(name)) fail(path, name, "named twice (floating and integer)");
    members.emplace_back(name, write_npy(t.wide ? Stored::i64 : Stored::i32, t.shape, encode_integers(path, name, t)));
  }
  // libzip deletes an archive left empty at zip_close; numpy writes the 22-byte end record alone.
  if (members.empty()) {
    std::vector<unsigned char> end_of_central_directory = {'P', 'K', 5, 6};
    end_of_central_directory.resize(22, 0);
    return write_bytes(path, end_of_central_directory);
  }
  int code = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
  if (!archive) fail(path, "cannot create the archive: " + zip_error_text(code));
  for (const auto& [name, bytes] : members) {
    zip_source_t* source = zip_source_buffer(archive, bytes.data(), bytes.size(), 0);  // `members` outlives zip_close
    const zip_int64_t at = source ? zip_file_add(archive, (name + ".npy").c_str(), source, ZIP_FL_OVERWRITE | ZIP_FL_ENC_UTF_8) : -1;
    if (at < 0) {
      const std::string why = zip_strerror(archive);
      if (source) zip_source_free(source);
      zip_discard(archive);
      fail(path, name, "cannot add to the archive: " + why);
    }
    zip_set_file_compression(archive, zip_uint64_t(at), ZIP_CM_STORE, 0);  // as np.savez
  }
  if (zip_close(archive) != 0) {
    const std::string why = zip_strerror(archive);
    zip_discard(archive);
    fail(path, "cannot write the archive: " + why);
  }
}

}  // namespace deltaproof::verify::tensor_files
