#pragma once
/// \file
/// What checkpoints need from the file system: durable writes that replace a file only when
/// the new one is complete (write to a temporary name, flush, fsync, rename, fsync the
/// directory), reads of byte ranges and of boxes of a tensor stored row-major, and CRC-32
/// checksums (zlib's, so that Python's `zlib.crc32` checks them too; libdeflate computes
/// them, zlib combines them) that combine over pieces read by different ranks.

#include <xshard/compiled.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/safetensors.hpp>

#include <libdeflate.h>
#include <zlib.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

namespace xshard {

namespace detail {

[[noreturn]] XSHARD_DECL void io_fail(const std::string& what, const std::string& path);

/// An open file descriptor, closed with the object.
class file {
public:
    file() = default;
    file(const std::string& path, int flags, mode_t mode = 0644);
    /// Opens `name` in the open directory `dir` (openat): the file of that directory, even if
    /// another directory has been renamed to its path since it was opened; never a link.
    file(const file& dir, const std::string& name, int flags);
    file(file&& o) noexcept
        : fd_(std::exchange(o.fd_, -1))
        , path_(std::move(o.path_)) {}
    file& operator=(file&& o) noexcept {
        std::swap(fd_, o.fd_);
        std::swap(path_, o.path_);
        return *this;
    }
    ~file() {
        if (fd_ >= 0)
            ::close(fd_);
    }
    /// Takes ownership of the open descriptor `fd` of `path`.
    static file adopt(int fd, std::string path);
    int fd() const noexcept { return fd_; }
    /// Closes the descriptor, reporting a failure (a delayed write error shows here).
    void close();
    const std::string& path() const noexcept { return path_; }

    std::size_t size() const;
    /// Reads exactly `n` bytes at `offset` (a short file is an error).
    void read_at(void* out, std::size_t n, std::size_t offset) const {
        ::iovec one{out, n};
        read_scattered_at(std::span(&one, 1), offset);
    }
    /// Reads exactly the bytes `parts` describe (each a destination and a length, filled in
    /// turn) from `offset` on, a preadv of up to IOV_MAX parts at a time (a short file is an
    /// error). Consumes `parts`: their entries are advanced as the bytes arrive.
    void read_scattered_at(std::span<::iovec> parts, std::size_t offset) const;
    void write_at(const void* data, std::size_t n, std::size_t offset) const {
        ::iovec one{const_cast<void*>(data), n}; // (pwritev only reads it)
        write_gathered_at(std::span(&one, 1), offset);
    }
    /// Writes the bytes `parts` describe (each a source and a length, taken in turn) from
    /// `offset` on, a pwritev of up to IOV_MAX parts at a time. Consumes `parts`: their entries
    /// are advanced as the bytes are written.
    void write_gathered_at(std::span<::iovec> parts, std::size_t offset) const;
    /// Allocates the bytes [offset, offset + n) of the file (fallocate), extending it to cover
    /// them, so that stores into a mapping of them (mapped_writer.hpp) cannot fail for want of
    /// space: a full disk, a quota or a file-size limit shows here, as an io_error. Returns
    /// false, doing nothing, where the file system cannot allocate ahead (EOPNOTSUPP).
    /// A file-size limit (RLIMIT_FSIZE) is checked as a pwrite would: bytes past it raise
    /// EFBIG, also inside the file (where fallocate would not check it).
    bool reserve(std::size_t offset, std::size_t n) const;
    void sync() const {
        if (::fsync(fd_) != 0)
            io_fail("cannot fsync", path_);
    }
    /// Writes the dirty pages of bytes [offset, offset + n) to the device and waits for
    /// them (not the file's metadata, nor the device's cache: a sync() of the file still
    /// follows). Ranks flush their shares of one file so at once, where the fsyncs of one
    /// file would take turns. Elsewhere than Linux: sync().
    /// With `wait` false, only starts the writing (it goes on while the caller works).
    void write_back(std::size_t offset, std::size_t n, bool wait = true) const;

private:
    /// Drops the first `done` bytes of `parts` (the parts they fill wholly, and as much of the
    /// next one).
    static void advance(std::span<::iovec>& parts, std::size_t done) noexcept;

    int fd_ = -1;
    std::string path_;
};

/// fsyncs the directory holding `path`, so that a rename there is durable.
XSHARD_DECL void sync_directory_of(const std::string& path);

/// Makes `from` (complete and synced) replace `to` atomically, durably. rename(2) replaces a
/// symbolic link at `to` itself, never what it points to.
XSHARD_DECL void commit_rename(const std::string& from, const std::string& to);

/// Unlinking or renaming over the last name of a file frees its blocks then, in time
/// proportional to its size (benchmarks/README.md, Checkpoints), unless the file is still
/// open: then its last close frees them. A save that replaces or removes a previous checkpoint
/// first opens its files (hold_open), and after the renames and unlinks closes them on a
/// thread of its own (close_in_background), so the save does not wait for the freeing.
///
/// `path` opened for reading if it is a regular file (never following a link, never
/// blocking on a FIFO); nothing otherwise.
XSHARD_DECL std::optional<file> hold_open(const std::string& path) noexcept;

/// Closes `files` on a thread of its own while the caller goes on (see hold_open), or at once
/// if no thread can be started. Never throws.
XSHARD_DECL void close_in_background(std::vector<file> files) noexcept;

/// Sixteen random hexadecimal digits, for names nobody can predict.
XSHARD_DECL std::string random_suffix();

/// Creates the directories above `path` that do not exist yet.
XSHARD_DECL void create_parent_directories(const std::string& path);

/// Marks the temporary open in `f` as being written, for as long as it stays open: an
/// exclusive flock, which the kernel drops when the process ends however it ends, so that a
/// later save tells what a killed save left (remove_stale_temporaries) from a save in
/// progress. (Where the file system has no locks, nothing is ever taken for stale.)
inline void hold(const file& f) noexcept { ::flock(f.fd(), LOCK_EX | LOCK_NB); }

/// A new file beside `path`, `<path>.tmp-<16 hexadecimal digits>`, created exclusively
/// (O_EXCL: never an existing file, O_NOFOLLOW: never through a link) for writing, and held
/// (see hold) while the returned object keeps it open.
XSHARD_DECL file create_temporary_file(const std::string& path);

/// A new directory beside `path`, `<path>.tmp-<6 characters>` (mkdtemp: created
/// exclusively), open (its path() is its name) and held (see hold) while the returned object
/// keeps it open.
XSHARD_DECL file create_temporary_directory(const std::string& path);

/// Writes `bytes` to `path` durably and atomically (exclusive temporary, fsync, rename),
/// creating the directories above it that do not exist yet.
XSHARD_DECL void write_file_atomically(const std::string& path, std::string_view bytes);

/// How many entries of the open directory `dir` have names that begin with `prefix`.
XSHARD_DECL std::size_t count_entries(const file& dir, std::string_view prefix);

/// The largest JSON file xshard reads whole (strategy files, checkpoint.json).
inline constexpr std::size_t max_json_file_bytes = std::size_t(100) << 20;

/// The whole of the small file `f` (at most `limit` bytes, else io_error).
XSHARD_DECL std::string read_file(const file& f, std::size_t limit = max_json_file_bytes);
/// The whole of the small file at `path` (read_file of it).
inline std::string read_file(const std::string& path, std::size_t limit = max_json_file_bytes) {
    return read_file(file(path, O_RDONLY), limit);
}

/// The header of the safetensors file `f`.
XSHARD_DECL safetensors_header read_header(const file& f);

/// The CRC-32 of `n` bytes (zlib's; computed by libdeflate, twice as fast), continuing `crc`.
inline std::uint32_t crc32_of(const void* data, std::size_t n, std::uint32_t crc = 0) {
    return std::uint32_t(::libdeflate_crc32(crc, data, n));
}

/// The CRC-32 of `n` bytes at `at` in `f` (continuing `crc`), read through `buffer` in
/// pieces of at most 16 MiB.
XSHARD_DECL std::uint32_t crc_of_range(const file& f, std::size_t at, std::size_t n,
                                       std::vector<std::byte>& buffer, std::uint32_t crc = 0);

/// "0a1b2c3d".
XSHARD_DECL std::string crc_hex(std::uint32_t crc);

/// A piece of a stored tensor whose checksum a rank computed: which tensor (an index agreed
/// on by every rank), where in its bytes, how long, and the CRC of those bytes.
struct crc_run {
    std::uint64_t tensor;
    std::uint64_t offset;
    std::uint64_t length;
    std::uint64_t crc;
};

/// The checksum of each tensor from runs that tile it exactly once (sorted here): the runs
/// of a tensor must cover [0, size) without gap or overlap, else the tensor's checksum is
/// reported missing (nullopt).
XSHARD_DECL std::vector<std::optional<std::uint32_t>>
combine_runs(std::vector<crc_run> runs, const std::vector<std::uint64_t>& sizes);

/// The byte runs (offset in a row-major array of `shape` with `element`-byte elements, length)
/// of `region`, in increasing order, whole trailing dimensions merged.
XSHARD_DECL std::vector<std::pair<std::size_t, std::size_t>>
runs_of(const std::vector<std::size_t>& shape, const std::vector<std::size_t>& offset,
        const std::vector<std::size_t>& extent, std::size_t element);

/// Box-to-box copy runs: for `region` (global coordinates), pairs of byte offsets in the source
/// block (offset `so`, extent `se`) and destination block (`dof`, `de`) with the run length.
XSHARD_DECL std::vector<std::array<std::size_t, 3>>
copy_runs(const std::vector<std::size_t>& ro, const std::vector<std::size_t>& re,
          const std::vector<std::size_t>& so, const std::vector<std::size_t>& se,
          const std::vector<std::size_t>& dof, const std::vector<std::size_t>& de,
          std::size_t element);

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/files.ipp>
#endif
