#pragma once
/// \file
/// The definitions of what io/checkpoint_reader.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/checkpoint_reader.hpp>

namespace xshard {

XSHARD_DECL checkpoint_reader::checkpoint_reader(const std::string& path)
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

XSHARD_DECL void checkpoint_reader::check_blocks() const {
    for (const auto& p : strategy_.parameters)
        check_blocks(p);
}

XSHARD_DECL void checkpoint_reader::check_blocks(const strategy_entry& e) const {
    for (const auto& b : blocks(e))
        stored_begin(b, e);
}

XSHARD_DECL std::vector<stored_block> checkpoint_reader::blocks(const strategy_entry& e) const {
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

XSHARD_DECL std::optional<std::string> checkpoint_reader::checksum(const strategy_entry& e,
                                                                const stored_block& b) const {
    if (const auto it = block_checksums_.find(e.name); it != block_checksums_.end())
        return it->second.substr(8 * b.index, 8);
    return checksum(b.file, e.name);
}

XSHARD_DECL std::vector<std::pair<std::size_t, std::size_t>>
checkpoint_reader::segments(const strategy_entry& e, const stored_block& b) const {
    const auto begin = stored_begin(b, e);
    const auto [offset, extent] = container(e, b);
    auto runs =
        detail::runs_of(extent, relative(b.offset, offset), b.extent, dtype_size(e.dtype));
    for (auto& r : runs)
        r.first += begin;
    return runs;
}

XSHARD_DECL void checkpoint_reader::read_part(const strategy_entry& e, const stored_block& b,
                                              const std::vector<std::size_t>& offset,
                                              const std::vector<std::size_t>& extent,
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

XSHARD_DECL std::uint32_t checkpoint_reader::read_block(const strategy_entry& e,
                                                        const stored_block& b,
                                                        const std::vector<std::size_t>& offset,
                                                        const std::vector<std::size_t>& extent,
                                                        std::byte* out) const {
    std::uint32_t crc = 0;
    copy_block(e, b, offset, extent, out, [&](const std::byte* bytes, std::size_t n) {
        crc = detail::crc32_of(bytes, n, crc);
    });
    return crc;
}

XSHARD_DECL std::uint32_t checkpoint_reader::crc_of_block(const strategy_entry& e,
                                                          const stored_block& b,
                                                          std::vector<std::byte>& buffer) const {
    std::uint32_t crc = 0;
    for (const auto& [at, n] : segments(e, b))
        crc = crc_of_range(b.file, at, n, buffer, crc);
    return crc;
}

XSHARD_DECL void checkpoint_reader::read_box(const strategy_entry& e,
                                             const std::vector<std::size_t>& offset,
                                             const std::vector<std::size_t>& extent,
                                             std::byte* out) const {
    for (const auto& b : blocks(e))
        read_part(e, b, offset, extent, out);
}

XSHARD_DECL std::vector<checkpoint_reader::piece>
checkpoint_reader::pieces_to_verify(const std::vector<const strategy_entry*>& tensors,
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

XSHARD_DECL std::vector<detail::crc_run>
checkpoint_reader::checksum_share(const std::vector<const strategy_entry*>& tensors,
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

XSHARD_DECL std::string
checkpoint_reader::damaged(const std::vector<const strategy_entry*>& tensors,
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

XSHARD_DECL std::string checkpoint_reader::block_name(const strategy_entry& e,
                                                      const stored_block& b) const {
    return detail::printable(e.name) +
           (file_count() > 1 ? " (in " + file_path(b.file) + ")" : "");
}

XSHARD_DECL std::optional<std::string> checkpoint_reader::checksum(int file,
                                                                const std::string& name) const {
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

XSHARD_DECL checkpoint_reader::node_read
checkpoint_reader::plan_node_read(const strategy_entry& e, const std::vector<stored_block>& mine,
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

XSHARD_DECL void checkpoint_reader::open_per_rank(detail::file opened) {
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

XSHARD_DECL void checkpoint_reader::open_integrated(detail::file opened) {
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

XSHARD_DECL void checkpoint_reader::read_metadata(const std::map<std::string, std::string>& meta) {
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

XSHARD_DECL std::size_t checkpoint_reader::stored_begin(const stored_block& b,
                                                        const strategy_entry& e) const {
    const auto& [f, h] = open(b.file);
    const auto* stored = h.find(e.name);
    if (!stored || stored->shape != container(e, b).second || stored->dtype != e.dtype)
        throw io_error("xshard: " + f.path() + " does not hold '" + detail::printable(e.name) +
                       "' as its strategy says");
    return h.data_start + stored->begin;
}

XSHARD_DECL std::vector<std::size_t>
checkpoint_reader::relative(const std::vector<std::size_t>& at,
                            const std::vector<std::size_t>& origin) {
    std::vector<std::size_t> out(at.size());
    for (std::size_t d = 0; d < at.size(); ++d)
        out[d] = at[d] - origin[d];
    return out;
}

XSHARD_DECL std::array<std::uint64_t, 4> checkpoint_reader::identity_of(const detail::file& f) {
    struct stat st {};
    if (::fstat(f.fd(), &st) != 0)
        detail::io_fail("cannot stat", f.path());
    return {std::uint64_t(st.st_ino), std::uint64_t(st.st_size),
            std::uint64_t(st.st_mtim.tv_sec), std::uint64_t(st.st_mtim.tv_nsec)};
}

XSHARD_DECL const std::pair<detail::file, safetensors_header>&
checkpoint_reader::open(int file) const {
    auto it = files_.find(file);
    if (it == files_.end()) {
        detail::file f(dir_, detail::rank_file_name(file), O_RDONLY);
        auto h = detail::read_header(f);
        it = files_.emplace(file, std::pair(std::move(f), std::move(h))).first;
    }
    return it->second;
}

} // namespace xshard
