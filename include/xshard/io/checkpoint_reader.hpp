#pragma once
/// \file
/// `checkpoint_reader`: reads a checkpoint of either form (checkpoint_forms.hpp) in one
/// process with plain POSIX reads: what a per-rank load reads its pieces from, and what
/// `xshard-ckpt` works on. `read_box` reads any box of a tensor, wherever its bytes are,
/// reading only the bytes it needs; `read_block` reads a whole stored block and checksums it
/// as it reads (`read_whole` without the checksum); `pieces_to_verify`, `checksum_of`,
/// `checksum_share` and `damaged` check the stored bytes against their CRC-32s, in pieces or
/// shares any process may take.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/atomic_replace.hpp>
#include <xshard/io/checkpoint_forms.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/json_envelope.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/io/strategy_file.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace xshard {

/// Reads a checkpoint of either form (see the file comment). Not thread-safe (files are
/// opened, and their headers parsed, at their first use).
class checkpoint_reader {
public:
    /// Opens the checkpoint at `path`: a safetensors file (integrated form; any safetensors
    /// file will do) or a per-rank directory. A per-rank save interrupted between its two
    /// renames leaves the previous checkpoint at `<path>.old`, which is then read instead.
    /// The path is opened once: everything is read through that descriptor (a directory's
    /// files are opened in it), so a checkpoint that a save renames over the path meanwhile
    /// is never mixed with this one.
    explicit checkpoint_reader(const std::string& path);

    /// What identifies the file read (integrated form; for the per-rank form, checkpoint.json)
    /// as it was opened: inode, size and modification time. Ranks compare it to know they
    /// read one checkpoint.
    const std::array<std::uint64_t, 4>& identity() const noexcept { return identity_; }

    /// Checks that every stored block of every tensor is in its file with the shape and
    /// dtype the strategy gives (headers only, no data read): what a load of every tensor
    /// needs beyond the checksums. Throws io_error naming the first block that is not.
    void check_blocks() const;
    /// check_blocks for tensor `e` alone.
    void check_blocks(const strategy_entry& e) const;

    checkpoint_format format() const { return format_; }
    const std::string& path() const { return path_; }
    std::int64_t step() const { return step_; }
    /// The strategy the checkpoint was saved with (for a foreign safetensors file: its
    /// tensors, replicated on a mesh of one rank).
    const strategy_file& strategy() const { return strategy_; }

    /// The stored blocks of tensor `e`, in file order.
    std::vector<stored_block> blocks(const strategy_entry& e) const;

    /// The stored checksum (8 hex digits) of block `b` of tensor `e`, if any.
    std::optional<std::string> checksum(const strategy_entry& e, const stored_block& b) const;

    /// Where the bytes of stored block `b` of `e` are in its file, in the block's own
    /// row-major order: (position, length) runs.
    std::vector<std::pair<std::size_t, std::size_t>> segments(const strategy_entry& e,
                                                              const stored_block& b) const;

    /// Reads the part of stored block `b` of `e` inside the box (`offset`, `extent`) into
    /// `out` (that box, row-major, contiguous). Nothing is checked.
    void read_part(const strategy_entry& e, const stored_block& b,
                   const std::vector<std::size_t>& offset, const std::vector<std::size_t>& extent,
                   std::byte* out) const;

    /// Reads stored block `b` of `e` whole into `out` (the row-major box (`offset`,
    /// `extent`), which contains the block), checksumming it as it is read (each piece right
    /// after it is copied, while in the cache: see copy_block): returns the CRC-32 of its
    /// bytes in the block's order, which its stored checksum is.
    std::uint32_t read_block(const strategy_entry& e, const stored_block& b,
                             const std::vector<std::size_t>& offset,
                             const std::vector<std::size_t>& extent, std::byte* out) const;

    /// Reads stored block `b` of `e` whole into `out` (as read_block), checking nothing:
    /// what a load does with bytes verified before (checksum_share).
    void read_whole(const strategy_entry& e, const stored_block& b,
                    const std::vector<std::size_t>& offset, const std::vector<std::size_t>& extent,
                    std::byte* out) const {
        copy_block(e, b, offset, extent, out, [](const std::byte*, std::size_t) {});
    }

    /// The CRC-32 of stored block `b` of `e`, read through `buffer` in pieces of at most
    /// 16 MiB.
    std::uint32_t crc_of_block(const strategy_entry& e, const stored_block& b,
                               std::vector<std::byte>& buffer) const;

    /// Reads the box (`offset`, `extent`) of tensor `e` into `out` (row-major, contiguous).
    void read_box(const strategy_entry& e, const std::vector<std::size_t>& offset,
                  const std::vector<std::size_t>& extent, std::byte* out) const;

    /// A piece of the stored bytes that verification reads: `length` bytes at `at` in file
    /// `file`, bytes [offset, offset + length) of checksummed stored block `key` (the blocks
    /// verified, numbered in the order of the tensors and of their blocks).
    struct piece {
        int file;
        std::size_t at, length;
        std::uint64_t key, offset;
    };

    /// The stored bytes of `tensors` that carry a checksum, in pieces of at most `chunk`
    /// bytes: reading each once, wherever and by whomever, verifies them all.
    std::vector<piece> pieces_to_verify(const std::vector<const strategy_entry*>& tensors,
                                        std::size_t chunk) const;

    /// The CRC-32 of `n` bytes at `at` in file `file` (continuing `crc`), read through
    /// `buffer` in 16 MiB pieces.
    std::uint32_t crc_of_range(int file, std::size_t at, std::size_t n,
                               std::vector<std::byte>& buffer, std::uint32_t crc = 0) const {
        return detail::crc_of_range(open(file).first, at, n, buffer, crc);
    }

    /// Reads piece `p` (into `buffer`) and returns its checksum run.
    detail::crc_run checksum_of(const piece& p, std::vector<std::byte>& buffer) const {
        buffer.resize(std::max(buffer.size(), p.length));
        open(p.file).first.read_at(buffer.data(), p.length, p.at);
        return {p.key, p.offset, p.length, detail::crc32_of(buffer.data(), p.length)};
    }

    /// The checksum runs of share `part` of `parts` of the stored bytes of `tensors` that
    /// carry a checksum, the blocks numbered as pieces_to_verify numbers them: the stored
    /// regions of those tensors (in the order of the files and of their places in them) cut
    /// into `parts` stretches of equal bytes, each read in order in pieces of `buffer`'s
    /// size, each piece checksummed where a mapping of the file shows it or read into
    /// `buffer`, whichever is faster here (read_chooser); the runs of a piece (a column
    /// split's rows, the blocks taking turns) are checksummed in file order, each continuing
    /// its block's run of the piece before.
    std::vector<detail::crc_run> checksum_share(const std::vector<const strategy_entry*>& tensors,
                                                std::uint64_t part, std::uint64_t parts,
                                                std::vector<std::byte>& buffer) const;

    /// The stored blocks of `tensors` whose checksum `runs` (of all
    /// their pieces to verify) do not give, e.g. "w1 (in dir/rank_3.safetensors), b"; empty if
    /// none.
    std::string damaged(const std::vector<const strategy_entry*>& tensors,
                        std::vector<detail::crc_run> runs) const;

    /// How damage to stored block `b` of `e` is named: "w1 (in dir/rank_3.safetensors)" for
    /// the per-rank form, "w1" for the integrated form.
    std::string block_name(const strategy_entry& e, const stored_block& b) const;

    /// How many files hold stored blocks.
    std::size_t file_count() const {
        return format_ == checkpoint_format::integrated ? 1 : std::size_t(strategy_.mesh.size());
    }

    /// The stored checksum (8 hex digits) of tensor `name` in file `file`, if any.
    std::optional<std::string> checksum(int file, const std::string& name) const;

    /// The file of stored blocks `file`.
    std::string file_path(int file) const {
        return format_ == checkpoint_format::integrated ? path_ : detail::rank_file(path_, file);
    }
    /// The parsed header of file `file`.
    const safetensors_header& header(int file) const { return open(file).second; }

    /// A read of the stored blocks of tensor `e` that this rank needs, together with the
    /// other ranks of its node (checkpoint.hpp, node_io.hpp): the file, where the tensor's
    /// bytes are in it, and for each block the rank reads, its runs as (position in the file,
    /// offset in the rank's box, bytes), in the block's order.
    struct node_read {
        const detail::file* file = nullptr;
        std::size_t begin = 0, length = 0;
        std::vector<std::vector<std::array<std::size_t, 3>>> runs;
        /// No other rank of the node needs these runs (set by the load, from every rank's
        /// plan): they are read straight in where this rank's slice holds them.
        bool direct = false;
    };

    /// Plans the node read of `e`'s stored blocks `mine` into the box (`offset`, `extent`)
    /// (each inside it): everything that can fail before the read fails here. The integrated
    /// form only (its file stores the tensor whole).
    node_read plan_node_read(const strategy_entry& e, const std::vector<stored_block>& mine,
                             const std::vector<std::size_t>& offset,
                             const std::vector<std::size_t>& extent) const;

private:
    /// The per-rank form, from its directory `opened`: strategy.json (every rank it names a
    /// rank of the mesh), checkpoint.json (its ranks the mesh's), and as many rank files as
    /// the mesh has ranks, checked before any work per rank: the work a load does is bounded
    /// by what is on disk, whatever the files say.
    void open_per_rank(detail::file opened);

    /// The integrated form, from its file `opened`: its header, its metadata (read_metadata),
    /// and every tensor of the strategy stored as it says.
    void open_integrated(detail::file opened);

    /// The integrated form's xshard metadata (none in a foreign file): strategy, step,
    /// checksums, and block checksums (version 2, with a strategy: they follow its blocks).
    void read_metadata(const std::map<std::string, std::string>& meta);

    /// Where stored block `b` of `e` begins in its file (checking that it is stored there as
    /// the strategy says).
    std::size_t stored_begin(const stored_block& b, const strategy_entry& e) const;

    /// The box stored contiguously (row-major) that holds block `b` of `e`: the tensor
    /// whole in the integrated form, the block itself in the per-rank form.
    std::pair<std::vector<std::size_t>, std::vector<std::size_t>>
    container(const strategy_entry& e, const stored_block& b) const {
        if (format_ == checkpoint_format::integrated)
            return {std::vector<std::size_t>(e.shape.size(), 0), e.shape};
        return {b.offset, b.extent};
    }

    static std::vector<std::size_t> relative(const std::vector<std::size_t>& at,
                                             const std::vector<std::size_t>& origin);

    static std::array<std::uint64_t, 4> identity_of(const detail::file& f);

    /// Copies stored block `b` of `e` whole into `out` (the row-major box (`offset`,
    /// `extent`), which contains the block), calling `copied(bytes, n)` on each piece of at
    /// most 1 MiB right after it lands in `out`, in the block's order. Short runs (a column
    /// split's rows) are copied from a read-only mapping of the file, a window's runs at a
    /// time: a system call per run, or reading the other ranks' runs between them, costs more.
    /// What cannot be mapped, and long runs, are read (pread).
    template <class F>
    void copy_block(const strategy_entry& e, const stored_block& b,
                    const std::vector<std::size_t>& offset, const std::vector<std::size_t>& extent,
                    std::byte* out, F&& copied) const {
        if (b.size() == 0)
            return;
        const auto& f = open(b.file).first;
        const auto begin = stored_begin(b, e);
        const auto [so, se] = container(e, b);
        const auto runs =
            detail::copy_runs(b.offset, b.extent, so, se, offset, extent, dtype_size(e.dtype));
        std::size_t i = 0;
        if (!runs.empty() && runs.front()[2] < detail::short_run) {
            detail::file_window window(f, PROT_READ);
            while (i < runs.size() && window.map(begin + runs[i][0], runs[i][2])) {
                const auto [lo, hi] = window.range();
                std::size_t j = i;
                while (j < runs.size() && begin + runs[j][0] >= lo &&
                       begin + runs[j][0] + runs[j][2] <= hi)
                    ++j;
                window.access(
                    [&] {
                        for (std::size_t k = i; k < j; ++k) {
                            std::memcpy(out + runs[k][1], window.at(begin + runs[k][0]),
                                        runs[k][2]);
                            copied(out + runs[k][1], runs[k][2]);
                        }
                    },
                    "read");
                i = j;
            }
        }
        for (; i < runs.size(); ++i) {
            const auto& [from, to, n] = runs[i];
            for (std::size_t done = 0; done < n;) {
                const auto k = std::min(detail::write_piece, n - done);
                f.read_at(out + to + done, k, begin + from + done);
                copied(out + to + done, k);
                done += k;
            }
        }
    }

    /// File `file` of the checkpoint, opened (a rank file in the directory opened first) and
    /// its header read at the first call.
    const std::pair<detail::file, safetensors_header>& open(int file) const;

    std::string path_;
    checkpoint_format format_ = checkpoint_format::integrated;
    detail::file dir_; ///< the per-rank form's directory, as opened
    std::array<std::uint64_t, 4> identity_{};
    std::int64_t step_ = 0;
    strategy_file strategy_;
    mutable std::map<int, std::pair<detail::file, safetensors_header>> files_;
    mutable std::map<int, std::map<std::string, std::string>> checksums_;
    std::map<std::string, std::string> block_checksums_; ///< integrated, version 2
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/checkpoint_reader.ipp>
#endif
