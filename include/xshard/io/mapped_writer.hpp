#pragma once
/// \file
/// Writing many short runs of one file from several processes at once, at memory speed.
///
/// Why: a buffered pwrite holds the file's write lock while it copies (i_rwsem on Linux's
/// ext4, xfs, btrfs), so the pwrites of all ranks into one file take turns, one system call
/// per run. An integrated checkpoint of a column-split weight is nothing but short runs
/// interleaved between ranks (4 KiB each in bench_checkpoint): 49,000 pwrites per rank, taking
/// turns. Stores into a shared mapping of the file take no such lock and no system call per
/// run, but cost a page fault per page: they win for short runs and lose for long ones and
/// for a contiguous block per rank (a per-rank checkpoint), with the two about even at 16 KiB
/// (benchmarks/README.md, Short runs through a shared mapping). So runs shorter than
/// `short_run` go through the mapping, longer ones through pwrite. (Ranks that share a node
/// do better still: they write such a tensor together, node_io.hpp. The mapping is for ranks
/// that do not share a node's memory.)
///
/// A store into a mapping cannot report an error: where the file system has no space for
/// it, the process gets SIGBUS. So only bytes allocated first are stored so (reserve, which
/// reports a full disk, a quota or a file-size limit as an io_error); anything else, and
/// everything on a file system that cannot allocate ahead, is written with pwrite. A file
/// shrunk under the mapping by another process is an io_error too (file_mapping.hpp).
/// Write-back errors show, as for pwrite, when the file is flushed (file::write_back,
/// file::sync).

#include <xshard/compiled.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/files.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

namespace xshard::detail {

/// The bytes a writer checksums and then stores at a time (and a reader reads and then
/// checksums): small enough that the copy finds them in the cache the checksum read them into.
inline constexpr std::size_t write_piece = std::size_t(1) << 20;

/// Writes byte ranges of an open file, checksumming them as it goes: short runs inside the
/// range last reserved through a shared mapping of a window of the file (at least `window`
/// bytes: file_window), everything else with pwrite. Not copyable.
class mapped_writer {
public:
    explicit mapped_writer(const file& f, std::size_t window = std::size_t(64) << 20)
        : file_(&f)
        , window_(f, PROT_READ | PROT_WRITE, window) {}

    /// Allocates [offset, offset + n) (file::reserve), so that short runs written into it
    /// may go through the mapping. Throws io_error on a full disk, quota or size limit;
    /// where the file system cannot allocate ahead, everything goes through pwrite.
    void reserve(std::size_t offset, std::size_t n) {
        reserved_ = {0, 0};
        if (file_->reserve(offset, n))
            reserved_ = {offset, checked_add(offset, n)};
    }

    /// Writes the `n` bytes at `data` at `at`, checksumming them as they are copied (in
    /// pieces of write_piece bytes, each checksummed just before it is copied); returns their
    /// CRC-32, continuing `crc`.
    std::uint32_t write_checksummed(const std::byte* data, std::size_t n, std::size_t at,
                                    std::uint32_t crc = 0);

    /// The bytes stored through the mapping so far (the rest went through pwrite).
    std::size_t mapped_bytes() const noexcept { return mapped_bytes_; }

private:
    const file* file_;
    file_window window_;
    std::pair<std::size_t, std::size_t> reserved_{0, 0}; ///< [begin, end) reserved last
    std::size_t mapped_bytes_ = 0;
};

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/mapped_writer.ipp>
#endif
