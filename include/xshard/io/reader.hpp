#pragma once
/// \file
/// A checkpoint on disk, read by one process with plain POSIX reads: what a per-rank load
/// reads its pieces from, and what the `xshard-ckpt` tool works on offline.
///
/// A checkpoint is a set of *stored blocks*: for the integrated form, every tensor whole in
/// one file; for the per-rank form, the block of each tensor that each rank held, in that
/// rank's file (replicated blocks once each: the copy of the first holder). `read_box` reads
/// any box of a tensor, wherever its bytes are, reading only the bytes it needs.

#include <xshard/core/partition.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

enum class checkpoint_format { integrated, per_rank };

/// A stored block: which file (a source rank for the per-rank form, 0 for the integrated
/// form) holds which box of a tensor.
struct stored_block {
    int file = 0;
    std::vector<std::size_t> offset, extent;

    std::size_t size() const {
        std::size_t n = 1;
        for (auto e : extent)
            n *= e;
        return n;
    }
};

class checkpoint_reader {
public:
    /// Opens the checkpoint at `path`: a safetensors file (integrated form; any safetensors
    /// file will do) or a per-rank directory. A per-rank save interrupted between its two
    /// renames leaves the previous checkpoint at `<path>.old`, which is then read instead.
    explicit checkpoint_reader(const std::string& path)
        : path_(path) {
        namespace fs = std::filesystem;
        if (!fs::exists(path_ + "/checkpoint.json") && fs::exists(path_ + ".old/checkpoint.json"))
            path_ += ".old";
        if (fs::is_directory(path_)) {
            format_ = checkpoint_format::per_rank;
            strategy_ = strategy_file::from_json(detail::read_file(path_ + "/strategy.json"));
            try {
                const auto j = nlohmann::json::parse(detail::read_file(path_ + "/checkpoint.json"));
                if (j.value("format", "") != "xshard-checkpoint" || j.value("version", 0) != 1)
                    throw io_error("not an xshard checkpoint of version 1");
                step_ = j.value("step", std::int64_t(0));
            } catch (const std::exception& e) {
                throw io_error("xshard: " + path_ + "/checkpoint.json: " + e.what());
            }
            return;
        }
        format_ = checkpoint_format::integrated;
        const auto& h = header(0);
        const auto& meta = h.metadata;
        try {
            if (const auto it = meta.find("xshard.strategy"); it != meta.end())
                strategy_ = strategy_file::from_json(it->second);
            if (const auto it = meta.find("xshard.step"); it != meta.end())
                step_ = std::stoll(it->second);
            if (const auto it = meta.find("xshard.crc32"); it != meta.end())
                checksums_[0] =
                    nlohmann::json::parse(it->second).get<std::map<std::string, std::string>>();
        } catch (const io_error&) {
            throw;
        } catch (const std::exception& e) {
            throw io_error("xshard: " + path_ + ": malformed xshard metadata: " + e.what());
        }
        // A file from elsewhere (Python): every tensor, replicated on a mesh of one rank.
        if (strategy_.parameters.empty())
            for (const auto& t : h.tensors)
                strategy_.parameters.push_back(
                    {t.name, t.shape, t.dtype, layout::replicated(t.shape.size()), true});
        for (const auto& p : strategy_.parameters) {
            const auto* t = h.find(p.name);
            if (!t || t->dtype != p.dtype || t->shape != p.shape)
                throw io_error("xshard: " + path_ + ": tensor '" + p.name +
                               "' is not stored as its strategy says");
        }
    }

    checkpoint_format format() const { return format_; }
    const std::string& path() const { return path_; }
    std::int64_t step() const { return step_; }
    /// The strategy the checkpoint was saved with (for a foreign safetensors file: its
    /// tensors, replicated on a mesh of one rank).
    const strategy_file& strategy() const { return strategy_; }

    /// The stored blocks of tensor `e`, in file order.
    std::vector<stored_block> blocks(const strategy_entry& e) const {
        if (format_ == checkpoint_format::integrated)
            return {stored_block{0, std::vector<std::size_t>(e.shape.size(), 0), e.shape}};
        std::vector<stored_block> out;
        const auto& mesh = strategy_.mesh;
        const auto spread = e.lay.replicated_axes(mesh);
        for (int s = 0; s < mesh.size(); ++s) {
            if (mesh.group_rank(s, spread) != 0)
                continue;
            stored_block b{s, {}, {}};
            const auto c = mesh.coords(s);
            for (std::size_t d = 0; d < e.shape.size(); ++d) {
                const auto k = std::size_t(e.lay.split_count(d, mesh)),
                           i = std::size_t(e.lay.block_index(d, mesh, c));
                b.offset.push_back(block_offset(e.shape[d], k, i));
                b.extent.push_back(block_extent(e.shape[d], k, i));
            }
            out.push_back(std::move(b));
        }
        return out;
    }

    /// Reads the box (`offset`, `extent`) of tensor `e` into `out` (row-major, contiguous).
    /// With `runs`, also appends the checksum of every piece read, as runs of the stored
    /// block it came from keyed `file * count + index` (see detail::combine_runs).
    void read_box(const strategy_entry& e, const std::vector<std::size_t>& offset,
                  const std::vector<std::size_t>& extent, std::byte* out,
                  std::vector<detail::crc_run>* runs = nullptr, std::size_t index = 0,
                  std::size_t count = 1) const {
        const std::size_t element = dtype_size(e.dtype);
        for (const auto& b : blocks(e)) {
            std::vector<std::size_t> ro(offset.size()), re(offset.size());
            bool empty = false;
            for (std::size_t d = 0; d < offset.size(); ++d) {
                const auto lo = std::max(b.offset[d], offset[d]);
                const auto hi = std::min(b.offset[d] + b.extent[d], offset[d] + extent[d]);
                ro[d] = lo;
                re[d] = hi > lo ? hi - lo : 0;
                empty = empty || re[d] == 0;
            }
            if (empty)
                continue;
            const auto& [f, h] = open(b.file);
            const auto* stored = h.find(e.name);
            if (!stored || stored->shape != b.extent || stored->dtype != e.dtype)
                throw io_error("xshard: " + f.path() + " does not hold '" + e.name +
                               "' as its strategy says");
            for (const auto& [from, to, n] :
                 detail::copy_runs(ro, re, b.offset, b.extent, offset, extent, element)) {
                f.read_at(out + to, n, h.data_start + stored->begin + from);
                if (runs)
                    runs->push_back({std::uint64_t(b.file) * count + index, from, n,
                                     detail::crc32_of(out + to, n)});
            }
        }
    }

    /// The stored checksum (8 hex digits) of tensor `name` in file `file`, if any.
    std::optional<std::string> checksum(int file, const std::string& name) const {
        if (format_ == checkpoint_format::per_rank && !checksums_.count(file)) {
            const auto& meta = open(file).second.metadata;
            const auto it = meta.find("xshard.crc32");
            try {
                checksums_[file] = it == meta.end()
                                       ? std::map<std::string, std::string>{}
                                       : nlohmann::json::parse(it->second)
                                             .get<std::map<std::string, std::string>>();
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
        return format_ == checkpoint_format::integrated ? path_ : rank_file(path_, file);
    }
    /// The parsed header of file `file`.
    const safetensors_header& header(int file) const { return open(file).second; }

    static std::string rank_file(const std::string& dir, int rank) {
        return dir + "/rank_" + std::to_string(rank) + ".safetensors";
    }

private:
    const std::pair<detail::file, safetensors_header>& open(int file) const {
        auto it = files_.find(file);
        if (it == files_.end()) {
            detail::file f(file_path(file), O_RDONLY);
            auto h = detail::read_header(f);
            it = files_.emplace(file, std::pair(std::move(f), std::move(h))).first;
        }
        return it->second;
    }

    std::string path_;
    checkpoint_format format_ = checkpoint_format::integrated;
    std::int64_t step_ = 0;
    strategy_file strategy_;
    mutable std::map<int, std::pair<detail::file, safetensors_header>> files_;
    mutable std::map<int, std::map<std::string, std::string>> checksums_;
};

} // namespace xshard
