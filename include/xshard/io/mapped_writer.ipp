#pragma once
/// \file
/// The definitions of what io/mapped_writer.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/mapped_writer.hpp>

namespace xshard::detail {

XSHARD_DECL std::uint32_t mapped_writer::write_checksummed(const std::byte* data, std::size_t n,
                                                          std::size_t at, std::uint32_t crc) {
    if (n < short_run && at >= reserved_.first && n <= reserved_.second - at &&
        at < reserved_.second && window_.map(at, n)) {
        crc = crc32_of(data, n, crc);
        window_.access([&] { std::memcpy(window_.at(at), data, n); }, "written");
        mapped_bytes_ += n;
        return crc;
    }
    for (std::size_t done = 0; done < n;) {
        const auto k = std::min(write_piece, n - done);
        crc = crc32_of(data + done, k, crc);
        file_->write_at(data + done, k, checked_add(at, done));
        done += k;
    }
    return crc;
}

} // namespace xshard::detail
