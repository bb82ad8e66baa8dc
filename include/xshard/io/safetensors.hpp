#pragma once
/// \file
/// The safetensors format: an 8-byte little-endian header length, a JSON header mapping each
/// tensor's name to its dtype, shape and data offsets (plus an optional "__metadata__" map of
/// strings), then the raw little-endian data of every tensor, contiguous.
///
/// `parse_header` reads a header defensively: every length, shape and offset is checked
/// against the file before anything is allocated for it, so a truncated, corrupted or hostile
/// file gives an `xshard::io_error` naming what is wrong, never a crash or a huge
/// allocation. (tests/io/fuzz_safetensors.cpp fuzzes it.)

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/float16.hpp>
#include <xshard/core/volume.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace xshard {

/// The safetensors name of an element type ("F64", "BF16", ...), and its size.
struct dtype_info {
    std::string_view name;
    std::size_t size;
};

template <class T>
constexpr dtype_info dtype_of() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, double>)
        return {"F64", 8};
    else if constexpr (std::is_same_v<U, float>)
        return {"F32", 4};
    else if constexpr (std::is_same_v<U, float16>)
        return {"F16", 2};
    else if constexpr (std::is_same_v<U, bfloat16>)
        return {"BF16", 2};
    else if constexpr (std::is_same_v<U, std::int64_t>)
        return {"I64", 8};
    else if constexpr (std::is_same_v<U, std::int32_t>)
        return {"I32", 4};
    else if constexpr (std::is_same_v<U, std::int16_t>)
        return {"I16", 2};
    else if constexpr (std::is_same_v<U, std::int8_t>)
        return {"I8", 1};
    else if constexpr (std::is_same_v<U, std::uint64_t>)
        return {"U64", 8};
    else if constexpr (std::is_same_v<U, std::uint32_t>)
        return {"U32", 4};
    else if constexpr (std::is_same_v<U, std::uint16_t>)
        return {"U16", 2};
    else if constexpr (std::is_same_v<U, std::uint8_t>)
        return {"U8", 1};
    else if constexpr (std::is_same_v<U, bool>)
        return {"BOOL", 1};
    else if constexpr (std::is_same_v<U, std::complex<float>>)
        return {"C64", 8};
    else
        static_assert(std::is_void_v<U>, "xshard: this element type has no safetensors dtype");
}

/// The size of a safetensors dtype, 0 if it is not one.
XSHARD_DECL std::size_t dtype_size(std::string_view name);

/// One tensor of a safetensors file.
struct tensor_entry {
    std::string name;
    std::string dtype;
    std::vector<std::size_t> shape;
    std::size_t begin = 0; ///< offset of the first byte in the data section
    std::size_t end = 0;   ///< one past the last byte

    std::size_t elements() const { return volume(shape); }
};

/// A parsed header: the tensors (in data order), the metadata, and where the data begins.
struct safetensors_header {
    std::vector<tensor_entry> tensors;
    std::map<std::string, std::string> metadata;
    std::size_t data_start = 0; ///< 8 + header length

    const tensor_entry* find(std::string_view name) const;
};

/// The largest header xshard reads (the format's own reference reader uses 100 MB).
inline constexpr std::size_t max_header_bytes = std::size_t(100) << 20;
/// The most dimensions a stored tensor may have (xshard's own tensors have at most 8).
inline constexpr std::size_t max_stored_rank = 64;
/// The most tensors a header may list.
inline constexpr std::size_t max_tensors = std::size_t(1) << 20;

namespace detail {

/// The deepest nesting of JSON xshard reads: its files nest four levels; the bound keeps a
/// hostile file (megabytes of "[[[[") from costing memory out of proportion to its size.
inline constexpr std::size_t max_json_depth = 32;

/// Parses JSON text, refusing nesting deeper than max_json_depth; any problem is an io_error.
XSHARD_DECL nlohmann::json parse_json(std::string_view text);

/// `value` as a count in [lo, hi]: a JSON integer (not 2.7, not "3", not 4294967297 when
/// hi is smaller), else io_error naming `what`.
XSHARD_DECL std::uint64_t json_count(const nlohmann::json& value, const std::string& what,
                                     std::uint64_t lo = 0,
                                     std::uint64_t hi = std::numeric_limits<std::uint64_t>::max());

/// Member `key` of object `j` as a count in [lo, hi] (json_count).
XSHARD_DECL std::uint64_t json_integer(const nlohmann::json& j, const char* key, std::uint64_t lo,
                                       std::uint64_t hi);

/// A step written as decimal digits ("12"), else io_error.
XSHARD_DECL std::int64_t parse_step(const std::string& text);

/// A CRC map ({"name": "0a1b2c3d", ...}), each value 8 lowercase hex digits, else io_error.
XSHARD_DECL std::map<std::string, std::string> parse_checksums(const std::string& text);

/// `name` with control characters and backslashes escaped (\n, \x1b), for messages and
/// terminal output: a name from a file never reaches a terminal raw.
XSHARD_DECL std::string printable(std::string_view name);

} // namespace detail

/// `name` with control characters and backslashes escaped ("\\x1b", "\\n"): how xshard prints
/// a name read from a file, so that it never reaches a terminal raw.
using detail::printable;

/// Parses the header of a safetensors file of `file_size` bytes whose first bytes are
/// `head` (at least the 8 length bytes; the whole header when the length fits). Throws
/// io_error for anything malformed or inconsistent with the file's size.
XSHARD_DECL safetensors_header parse_header(std::string_view head, std::size_t file_size);

/// Where the data of the files xshard writes starts: at a multiple of a page (the header is
/// padded with spaces to it, as the format allows), so that the tensors' bytes have in the
/// file the alignment they have in memory. A copy from the page cache to memory aligned
/// otherwise runs at a fraction of its speed (benchmarks/README.md, Aligned data).
inline constexpr std::size_t data_alignment = 4096;

/// The header bytes (length + JSON, padded with spaces so that the data starts at a multiple
/// of data_alignment) of tensors laid out one after the other in the order given, with
/// `metadata`. Returns the header and sets each entry's offsets.
XSHARD_DECL std::string make_header(std::vector<tensor_entry>& tensors,
                                    const std::map<std::string, std::string>& metadata);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/safetensors.ipp>
#endif
