#pragma once
/// \file
/// `checkpoint_reader`: reads a checkpoint of either form (checkpoint_forms.hpp) in one
/// process with plain POSIX reads: what a per-rank load reads its pieces from, and what
/// `xshard-ckpt` works on. `read_box` reads any box of a tensor, wherever its bytes are,
/// reading only the bytes it needs; `read_block` reads a whole stored block and checksums it
/// as it reads (`read_whole` without the checksum); `pieces_to_verify`, `checksum_of`,
/// `checksum_share` and `damaged` check the stored bytes against their CRC-32s, in pieces or
/// shares any process may take.

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
    explicit checkpoint_reader(const std::string& path)
        : path_(path) {
        namespace fs = std::filesystem;
        std::error_code ec;
        // Only when nothing is at `path`: a stale <path>.old never hides a checkpoint.
        if (fs::symlink_status(path_, ec).type() == fs::file_type::not_found &&
            fs::exists(detail::previous_name(path_), ec))
            path_ = detail::previous_name(path_);
        detail::file opened(path_, O_RDONLY);
        struct stat st {};
        if (::fstat(opened.fd(), &st) != 0)
            detail::io_fail("cannot stat", path_);
        if (S_ISDIR(st.st_mode))
            open_per_rank(std::move(opened));
        else
            open_integrated(std::move(opened));
    }

    /// What identifies the file read (integrated form; for the per-rank form, checkpoint.json)
    /// as it was opened: inode, size and modification time. Ranks compare it to know they
    /// read one checkpoint.
    const std::array<std::uint64_t, 4>& identity() const noexcept { return identity_; }

    /// Checks that every stored block of every tensor is in its file with the shape and
    /// dtype the strategy gives (headers only, no data read): what a load of every tensor
    /// needs beyond the checksums. Throws io_error naming the first block that is not.
    void check_blocks() const {
        for (const auto& p : strategy_.parameters)
            check_blocks(p);
    }
    /// check_blocks for tensor `e` alone.
    void check_blocks(const strategy_entry& e) const {
        for (const auto& b : blocks(e))
            stored_begin(b, e);
    }

    checkpoint_format format() const { return format_; }
    const std::string& path() const { return path_; }
    std::int64_t step() const { return step_; }
    /// The strategy the checkpoint was saved with (for a foreign safetensors file: its
    /// tensors, replicated on a mesh of one rank).
    const strategy_file& strategy() const { return strategy_; }

    /// The stored blocks of tensor `e`, in file order.
    std::vector<stored_block> blocks(const strategy_entry& e) const {
        if (format_ == checkpoint_format::integrated && !block_checksums_.count(e.name))
            return {stored_block{0, std::vector<std::size_t>(e.shape.size(), 0), e.shape, 0}};
        std::vector<stored_block> out;
        for (auto& [rank, offset, extent] :
             detail::primary_blocks(strategy_.mesh_of(e), e.lay, e.shape))
            out.push_back({format_ == checkpoint_format::integrated ? 0
                           : e.ranks.empty()                        ? rank
                                                                    : e.ranks.at(std::size_t(rank)),
                           std::move(offset), std::move(extent), out.size()});
        return out;
    }

    /// The stored checksum (8 hex digits) of block `b` of tensor `e`, if any.
    std::optional<std::string> checksum(const strategy_entry& e, const stored_block& b) const {
        if (const auto it = block_checksums_.find(e.name); it != block_checksums_.end())
            return it->second.substr(8 * b.index, 8);
        return checksum(b.file, e.name);
    }

    /// Where the bytes of stored block `b` of `e` are in its file, in the block's own
    /// row-major order: (position, length) runs.
    std::vector<std::pair<std::size_t, std::size_t>> segments(const strategy_entry& e,
                                                              const stored_block& b) const {
        const auto begin = stored_begin(b, e);
        const auto [offset, extent] = container(e, b);
        auto runs =
            detail::runs_of(extent, relative(b.offset, offset), b.extent, dtype_size(e.dtype));
        for (auto& r : runs)
            r.first += begin;
        return runs;
    }

    /// Reads the part of stored block `b` of `e` inside the box (`offset`, `extent`) into
    /// `out` (that box, row-major, contiguous). Nothing is checked.
    void read_part(const strategy_entry& e, const stored_block& b,
                   const std::vector<std::size_t>& offset, const std::vector<std::size_t>& extent,
                   std::byte* out) const {
        std::vector<std::size_t> ro(offset.size()), re(offset.size());
        for (std::size_t d = 0; d < offset.size(); ++d) {
            const auto lo = std::max(b.offset[d], offset[d]);
            const auto hi = std::min(b.offset[d] + b.extent[d], offset[d] + extent[d]);
            ro[d] = lo;
            re[d] = hi > lo ? hi - lo : 0;
            if (re[d] == 0)
                return;
        }
        const auto& f = open(b.file).first;
        const auto begin = stored_begin(b, e);
        const auto [so, se] = container(e, b);
        for (const auto& [from, to, n] :
             detail::copy_runs(ro, re, so, se, offset, extent, dtype_size(e.dtype)))
            f.read_at(out + to, n, begin + from);
    }

    /// Reads stored block `b` of `e` whole into `out` (the row-major box (`offset`,
    /// `extent`), which contains the block), checksumming it as it is read (each piece right
    /// after it is copied, while in the cache: see copy_block): returns the CRC-32 of its
    /// bytes in the block's order, which its stored checksum is.
    std::uint32_t read_block(const strategy_entry& e, const stored_block& b,
                             const std::vector<std::size_t>& offset,
                             const std::vector<std::size_t>& extent, std::byte* out) const {
        std::uint32_t crc = 0;
        copy_block(e, b, offset, extent, out, [&](const std::byte* bytes, std::size_t n) {
            crc = detail::crc32_of(bytes, n, crc);
        });
        return crc;
    }

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
                               std::vector<std::byte>& buffer) const {
        std::uint32_t crc = 0;
        for (const auto& [at, n] : segments(e, b))
            crc = crc_of_range(b.file, at, n, buffer, crc);
        return crc;
    }

    /// Reads the box (`offset`, `extent`) of tensor `e` into `out` (row-major, contiguous).
    void read_box(const strategy_entry& e, const std::vector<std::size_t>& offset,
                  const std::vector<std::size_t>& extent, std::byte* out) const {
        for (const auto& b : blocks(e))
            read_part(e, b, offset, extent, out);
    }

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
                                        std::size_t chunk) const {
        std::vector<piece> out;
        std::uint64_t key = 0;
        for (std::size_t i = 0; i < tensors.size(); ++i)
            for (const auto& b : blocks(*tensors[i])) {
                if (!checksum(*tensors[i], b))
                    continue;
                std::uint64_t offset = 0;
                for (const auto& [at, bytes] : segments(*tensors[i], b))
                    for (std::size_t o = 0; o < bytes; o += chunk) {
                        const auto n = std::min(chunk, bytes - o);
                        out.push_back({b.file, at + o, n, key, offset});
                        offset += n;
                    }
                ++key;
            }
        return out;
    }

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
                                                std::vector<std::byte>& buffer) const {
        using region = std::tuple<int, std::size_t, std::size_t>; // file, [begin, end)
        struct cursor {
            std::uint64_t key;                                     ///< the block's number
            std::vector<std::pair<std::size_t, std::size_t>> runs; ///< segments
            std::size_t next = 0;                                  ///< the first run not done
            std::uint64_t offset = 0;                              ///< the block's bytes before it
            std::size_t out = std::size_t(-1);                     ///< its last run in the result
            bool parked = false; ///< its run goes on past the current read
        };
        std::map<region, std::vector<std::pair<const strategy_entry*, stored_block>>> regions;
        std::map<std::pair<const strategy_entry*, std::size_t>, std::uint64_t> keys;
        std::uint64_t key = 0, total = 0;
        for (const auto* e : tensors)
            for (const auto& b : blocks(*e))
                if (checksum(*e, b)) {
                    keys[{e, b.index}] = key++;
                    const auto begin = stored_begin(b, *e);
                    regions[{b.file, begin,
                             begin + checked_mul(volume(container(*e, b).second),
                                                 dtype_size(e->dtype))}]
                        .emplace_back(e, b);
                }
        for (const auto& [r, bs] : regions)
            total += std::get<2>(r) - std::get<1>(r);
        const std::uint64_t first = total / parts * part,
                            last = part + 1 == parts ? total : total / parts * (part + 1);
        std::vector<detail::crc_run> out;
        std::uint64_t counted = 0;
        detail::read_chooser choice;
        std::optional<detail::file_window> window;
        int window_file = -1;
        for (const auto& [r, bs] : regions) {
            const auto& [file, begin, end] = r;
            const auto lo = std::max(first, counted), hi = std::min(last, counted + (end - begin));
            const auto a = begin + std::size_t(lo - counted), z = begin + std::size_t(hi - counted);
            counted += end - begin;
            if (lo >= hi)
                continue;
            std::vector<cursor> blocks_here;
            for (const auto& [e, b] : bs) {
                cursor c{keys.at({e, b.index}), segments(*e, b)};
                while (c.next < c.runs.size() && c.runs[c.next].first + c.runs[c.next].second <= a)
                    c.offset += c.runs[c.next++].second;
                blocks_here.push_back(std::move(c));
            }
            const auto& f = open(file).first;
            if (file != window_file) { // (the regions are in the order of the files)
                window.reset();
                window.emplace(f, PROT_READ);
                window_file = file;
            }
            for (auto at = a; at < z; at += buffer.size()) {
                const auto n = std::min(buffer.size(), z - at);
                const auto start = std::chrono::steady_clock::now();
                const bool mapped = choice.map_next() && window->map(at, n);
                if (!mapped)
                    f.read_at(buffer.data(), n, at);
                const std::byte* data = mapped ? window->at(at) : buffer.data();
                // The CRC-32 of the file's bytes [s, t), continuing `crc`.
                const auto crc_of = [&](std::size_t s, std::size_t t, std::uint32_t crc = 0) {
                    if (mapped)
                        window->access(
                            [&] { crc = detail::crc32_of(data + (s - at), t - s, crc); }, "read");
                    else
                        crc = detail::crc32_of(data + (s - at), t - s, crc);
                    return crc;
                };
                // The runs in file order (a column split's blocks take turns row by row),
                // so that the reads of a mapping go forward; a run that goes on in the next
                // read parks its block for the rest of this one.
                for (auto& c : blocks_here)
                    c.parked = false;
                for (;;) {
                    cursor* c = nullptr; // the block whose next run here comes first
                    for (auto& b : blocks_here)
                        if (!b.parked && b.next < b.runs.size() && b.runs[b.next].first < at + n &&
                            (!c || b.runs[b.next].first < c->runs[c->next].first))
                            c = &b;
                    if (!c)
                        break;
                    const auto [run_at, run_bytes] = c->runs[c->next];
                    const auto s = std::max(run_at, at), t = std::min(run_at + run_bytes, at + n);
                    const auto where = c->offset + (s - run_at); // in the block
                    if (c->out < out.size() && out[c->out].offset + out[c->out].length == where) {
                        out[c->out].crc = crc_of(s, t, std::uint32_t(out[c->out].crc));
                        out[c->out].length += t - s;
                    } else {
                        c->out = out.size();
                        out.push_back({c->key, where, t - s, crc_of(s, t)});
                    }
                    if (run_at + run_bytes > at + n) {
                        c->parked = true;
                        continue;
                    }
                    c->offset += run_bytes;
                    ++c->next;
                }
                choice.took(mapped, n,
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                                .count());
            }
        }
        return out;
    }

    /// The stored blocks of `tensors` whose checksum `runs` (of all
    /// their pieces to verify) do not give, e.g. "w1 (in dir/rank_3.safetensors), b"; empty if
    /// none.
    std::string damaged(const std::vector<const strategy_entry*>& tensors,
                        std::vector<detail::crc_run> runs) const {
        struct checked {
            std::size_t tensor;
            stored_block block;
            std::string want;
        };
        std::vector<checked> list;
        std::vector<std::uint64_t> sizes;
        for (std::size_t i = 0; i < tensors.size(); ++i)
            for (auto& b : blocks(*tensors[i])) {
                if (auto want = checksum(*tensors[i], b)) {
                    sizes.push_back(b.size() * dtype_size(tensors[i]->dtype));
                    list.push_back({i, std::move(b), std::move(*want)});
                }
            }
        const auto got = detail::combine_runs(std::move(runs), sizes);
        std::string bad;
        std::set<std::string> seen;
        for (std::size_t k = 0; k < list.size(); ++k)
            if (!got[k] || detail::crc_hex(*got[k]) != list[k].want) {
                auto name = block_name(*tensors[list[k].tensor], list[k].block);
                if (seen.insert(name).second)
                    bad += (bad.empty() ? "" : ", ") + name;
            }
        return bad;
    }

    /// How damage to stored block `b` of `e` is named: "w1 (in dir/rank_3.safetensors)" for
    /// the per-rank form, "w1" for the integrated form.
    std::string block_name(const strategy_entry& e, const stored_block& b) const {
        return detail::printable(e.name) +
               (file_count() > 1 ? " (in " + file_path(b.file) + ")" : "");
    }

    /// How many files hold stored blocks.
    std::size_t file_count() const {
        return format_ == checkpoint_format::integrated ? 1 : std::size_t(strategy_.mesh.size());
    }

    /// The stored checksum (8 hex digits) of tensor `name` in file `file`, if any.
    std::optional<std::string> checksum(int file, const std::string& name) const {
        if (format_ == checkpoint_format::per_rank && !checksums_.count(file)) {
            const auto& meta = open(file).second.metadata;
            const auto it = meta.find("xshard.crc32");
            try {
                checksums_[file] = it == meta.end() ? std::map<std::string, std::string>{}
                                                    : detail::parse_checksums(it->second);
            } catch (const std::exception& e) {
                throw io_error("xshard: " + file_path(file) + ": malformed checksums: " + e.what());
            }
        }
        const auto it = checksums_.find(file);
        if (it == checksums_.end())
            return std::nullopt;
        const auto c = it->second.find(name);
        return c == it->second.end() ? std::nullopt : std::optional(c->second);
    }

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
                             const std::vector<std::size_t>& extent) const {
        if (format_ != checkpoint_format::integrated)
            throw error("xshard: a node read is for the integrated form");
        const auto& [f, h] = open(0);
        const auto whole = blocks(e).front();
        node_read out{&f, stored_begin(whole, e), 0, {}};
        const auto* stored = h.find(e.name);
        out.length = stored->end - stored->begin;
        const auto [so, se] = container(e, whole);
        for (const auto& b : mine) {
            auto runs =
                detail::copy_runs(b.offset, b.extent, so, se, offset, extent, dtype_size(e.dtype));
            for (auto& r : runs)
                r[0] += out.begin;
            out.runs.push_back(std::move(runs));
        }
        return out;
    }

private:
    /// The per-rank form, from its directory `opened`: strategy.json (every rank it names a
    /// rank of the mesh), checkpoint.json (its ranks the mesh's), and as many rank files as
    /// the mesh has ranks, checked before any work per rank: the work a load does is bounded
    /// by what is on disk, whatever the files say.
    void open_per_rank(detail::file opened) {
        format_ = checkpoint_format::per_rank;
        dir_ = std::move(opened);
        strategy_ = strategy_file::from_json(
            detail::read_file(detail::file(dir_, "strategy.json", O_RDONLY)),
            path_ + "/strategy.json");
        for (const auto& p : strategy_.parameters)
            if (p.mesh && p.ranks.empty())
                throw io_error("xshard: " + path_ + "/strategy.json: '" +
                               detail::printable(p.name) +
                               "' has a mesh of its own without the ranks that held it");
        // (A pipeline's strategy names ranks of every stage; a per-rank checkpoint has the
        // rank files of one mesh.)
        for (const auto& p : strategy_.parameters)
            for (const int k : p.ranks)
                if (k >= strategy_.mesh.size())
                    throw io_error("xshard: " + path_ + "/strategy.json: '" +
                                   detail::printable(p.name) + "' names rank " + std::to_string(k) +
                                   " of a mesh of " + std::to_string(strategy_.mesh.size()) +
                                   " ranks");
        try {
            const detail::file json(dir_, "checkpoint.json", O_RDONLY);
            identity_ = identity_of(json);
            const auto contents = detail::parse_checkpoint_json(detail::read_file(json));
            step_ = contents.step;
            if (contents.ranks != std::uint64_t(strategy_.mesh.size()))
                throw io_error("'ranks' is " + std::to_string(contents.ranks) +
                               " but strategy.json's mesh has " +
                               std::to_string(strategy_.mesh.size()) + " ranks");
        } catch (const std::exception& e) {
            throw io_error("xshard: " + path_ +
                           "/checkpoint.json: " + std::string(detail::without_prefix(e.what())));
        }
        const auto files = detail::count_entries(dir_, "rank_");
        if (files < std::size_t(strategy_.mesh.size()))
            throw io_error("xshard: " + path_ + " holds " + std::to_string(files) +
                           " rank file(s) for a mesh of " + std::to_string(strategy_.mesh.size()) +
                           " ranks");
    }

    /// The integrated form, from its file `opened`: its header, its metadata (read_metadata),
    /// and every tensor of the strategy stored as it says.
    void open_integrated(detail::file opened) {
        format_ = checkpoint_format::integrated;
        auto h0 = detail::read_header(opened);
        identity_ = identity_of(opened);
        files_.emplace(0, std::pair(std::move(opened), std::move(h0)));
        const auto& h = header(0);
        read_metadata(h.metadata);
        // A file from elsewhere (Python): every tensor, replicated on a mesh of one rank.
        if (strategy_.parameters.empty())
            for (const auto& t : h.tensors) {
                if (t.shape.size() > max_tensor_rank)
                    throw io_error("xshard: " + path_ + ": tensor '" + detail::printable(t.name) +
                                   "' has " + std::to_string(t.shape.size()) +
                                   " dimensions; xshard reads at most " +
                                   std::to_string(max_tensor_rank));
                strategy_.parameters.push_back(
                    {t.name, t.shape, t.dtype, layout::replicated(t.shape.size()), true});
            }
        for (const auto& p : strategy_.parameters) {
            const auto* t = h.find(p.name);
            if (!t || t->dtype != p.dtype || t->shape != p.shape)
                throw io_error("xshard: " + path_ + ": tensor '" + detail::printable(p.name) +
                               "' is not stored as its strategy says");
            // One checksum per stored block (checked before anything is enumerated: the work
            // per tensor is bounded by the header's length, whatever the mesh).
            const auto it = block_checksums_.find(p.name);
            if (it == block_checksums_.end())
                continue;
            const auto blocks = detail::primary_block_count(strategy_.mesh_of(p), p.lay);
            if (it->second.size() / 8 != blocks)
                throw io_error("xshard: " + path_ + ": malformed xshard metadata: '" +
                               detail::printable(p.name) + "' has " +
                               std::to_string(it->second.size() / 8) + " block checksums for " +
                               std::to_string(blocks) + " stored blocks");
        }
    }

    /// The integrated form's xshard metadata (none in a foreign file): strategy, step,
    /// checksums, and block checksums (version 2, with a strategy: they follow its blocks).
    void read_metadata(const std::map<std::string, std::string>& meta) {
        try {
            if (const auto it = meta.find("xshard.strategy"); it != meta.end())
                strategy_ = strategy_file::from_json(it->second);
            if (const auto it = meta.find("xshard.step"); it != meta.end())
                step_ = detail::parse_step(it->second);
            if (const auto it = meta.find("xshard.crc32"); it != meta.end())
                checksums_[0] = detail::parse_checksums(it->second);
            const auto version = meta.find("xshard.version");
            if (version != meta.end() && version->second != "1" && version->second != "2")
                throw io_error("version " + detail::printable(version->second) +
                               " is not one xshard reads (1 or 2)");
            if (const auto it = meta.find("xshard.block_crc32");
                it != meta.end() && version != meta.end() && version->second == "2" &&
                meta.count("xshard.strategy"))
                block_checksums_ = detail::parse_block_checksums(it->second);
        } catch (const std::exception& e) {
            throw io_error("xshard: " + path_ + ": malformed xshard metadata: " + e.what());
        }
    }

    /// Where stored block `b` of `e` begins in its file (checking that it is stored there as
    /// the strategy says).
    std::size_t stored_begin(const stored_block& b, const strategy_entry& e) const {
        const auto& [f, h] = open(b.file);
        const auto* stored = h.find(e.name);
        if (!stored || stored->shape != container(e, b).second || stored->dtype != e.dtype)
            throw io_error("xshard: " + f.path() + " does not hold '" + detail::printable(e.name) +
                           "' as its strategy says");
        return h.data_start + stored->begin;
    }

    /// The box stored contiguously (row-major) that holds block `b` of `e`: the tensor
    /// whole in the integrated form, the block itself in the per-rank form.
    std::pair<std::vector<std::size_t>, std::vector<std::size_t>>
    container(const strategy_entry& e, const stored_block& b) const {
        if (format_ == checkpoint_format::integrated)
            return {std::vector<std::size_t>(e.shape.size(), 0), e.shape};
        return {b.offset, b.extent};
    }

    static std::vector<std::size_t> relative(const std::vector<std::size_t>& at,
                                             const std::vector<std::size_t>& origin) {
        std::vector<std::size_t> out(at.size());
        for (std::size_t d = 0; d < at.size(); ++d)
            out[d] = at[d] - origin[d];
        return out;
    }

    static std::array<std::uint64_t, 4> identity_of(const detail::file& f) {
        struct stat st {};
        if (::fstat(f.fd(), &st) != 0)
            detail::io_fail("cannot stat", f.path());
        return {std::uint64_t(st.st_ino), std::uint64_t(st.st_size),
                std::uint64_t(st.st_mtim.tv_sec), std::uint64_t(st.st_mtim.tv_nsec)};
    }

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
    const std::pair<detail::file, safetensors_header>& open(int file) const {
        auto it = files_.find(file);
        if (it == files_.end()) {
            detail::file f(dir_, detail::rank_file_name(file), O_RDONLY);
            auto h = detail::read_header(f);
            it = files_.emplace(file, std::pair(std::move(f), std::move(h))).first;
        }
        return it->second;
    }

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
