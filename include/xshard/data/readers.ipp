#pragma once
/// \file
/// The definitions of what data/readers.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/data/readers.hpp>

namespace xshard::data {

namespace detail {

XSHARD_DECL std::vector<unsigned char> read_bytes(const std::filesystem::path& file,
                                                  const char* reader) {
    std::ifstream in(file, std::ios::binary);
    if (!in)
        throw error(std::string("xshard: ") + reader + ": cannot open " + file.string());
    std::vector<unsigned char> bytes{std::istreambuf_iterator<char>(in),
                                     std::istreambuf_iterator<char>()};
    if (in.bad())
        throw error(std::string("xshard: ") + reader + ": cannot read " + file.string());
    return bytes;
}

XSHARD_DECL idx_header read_idx_header(const std::vector<unsigned char>& bytes,
                                       const std::filesystem::path& file, std::uint32_t magic,
                                       const char* what) {
    const std::string name = "xshard: read_mnist: " + file.string();
    if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b)
        throw error(name + " is gzip-compressed; decompress it first");
    const std::size_t ndim = magic & 0xff;
    const std::size_t header = 4 + 4 * ndim;
    if (bytes.size() < header)
        throw error(name + " is truncated: " + std::to_string(bytes.size()) +
                    " bytes, shorter than the " + std::to_string(header) + "-byte header of " +
                    what);
    if (const auto found = big_endian_u32(bytes, 0); found != magic)
        throw error(name + " is not an IDX file of " + what + ": magic number " +
                    std::to_string(found) + ", expected " + std::to_string(magic));
    idx_header h{{}, header};
    std::size_t expected = 1;
    bool huge = false; // more bytes than a size_t counts: certainly truncated
    for (std::size_t d = 0; d < ndim; ++d) {
        h.dims.push_back(big_endian_u32(bytes, 4 + 4 * d));
        if (h.dims.back() != 0 && expected > SIZE_MAX / h.dims.back())
            huge = true;
        else
            expected *= h.dims.back();
    }
    const std::size_t held = bytes.size() - header;
    if (huge || held != expected)
        throw error(name + (huge || held < expected ? " is truncated" : " is too long") +
                    ": its header announces " + std::to_string(h.dims[0]) + " " + what + " (" +
                    (huge ? std::string("over 2^64") : std::to_string(expected)) +
                    " bytes of data) but it holds " + std::to_string(held));
    return h;
}

} // namespace detail

} // namespace xshard::data

