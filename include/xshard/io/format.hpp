#pragma once
/// \file
/// The two on-disk forms of a checkpoint: the headers and the finishing steps their writers
/// share (the collective saves of checkpoint.hpp and the offline `xshard-ckpt`), and
/// `checkpoint_reader`, which reads either form in one process with plain POSIX reads: what a
/// per-rank load reads its pieces from, and what `xshard-ckpt` works on.
///
/// Integrated form: one safetensors file, every tensor whole, with `__metadata__`
/// {"format": "xshard", "xshard.version": "2", "xshard.step": "<step>",
///  "xshard.strategy": <the strategy file's JSON>, "xshard.crc32": {name: "<8 hex digits>"},
///  "xshard.block_crc32": {name: "<8 hex digits per stored block>"}}.
/// `xshard.crc32` is each tensor's CRC-32 whole (what Python's `zlib.crc32` checks);
/// `xshard.block_crc32` (version 2) the CRC-32 of each block the saving ranks held (the blocks
/// of the strategy's layout, one per primary holder in mesh rank order, each block's bytes in
/// its own row-major order): what a load checks, so that a rank reading whole blocks verifies
/// them as it reads them, in one pass. Version 1 files (no block CRCs) and foreign files are
/// read too, each tensor then one stored block.
/// Per-rank form: a directory of `rank_<r>.safetensors` (rank r's blocks, with
/// {"format": "xshard-rank", "xshard.rank": "<r>", "xshard.crc32": {...}}), `strategy.json`
/// and `checkpoint.json` ({"format": "xshard-checkpoint", "version": 1, "step", "ranks"}).
///
/// A checkpoint is a set of *stored blocks*: for the integrated form, every tensor whole in
/// one file; for the per-rank form, the block of each tensor that each rank held, in that
/// rank's file (replicated blocks once each: the copy of the first holder). `read_box` reads
/// any box of a tensor, wherever its bytes are, reading only the bytes it needs; `read_block`
/// reads a whole stored block and checksums it as it reads; `pieces_to_verify`, `checksum_of`
/// and `damaged` check the stored bytes against their CRC-32s, in pieces any process may take
/// a share of.

#include <xshard/core/partition.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>

#include <nlohmann/json.hpp>

#include <sys/mman.h>

#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace xshard {

enum class checkpoint_format { integrated, per_rank };

namespace detail {

/// The name of rank `rank`'s file in a per-rank checkpoint directory.
inline std::string rank_file_name(int rank) {
    return "rank_" + std::to_string(rank) + ".safetensors";
}
/// Rank `rank`'s file in per-rank checkpoint directory `dir`.
inline std::string rank_file(const std::string& dir, int rank) {
    return dir + "/" + rank_file_name(rank);
}

/// The stored blocks of a tensor of `shape` with layout `lay` saved on `mesh`: the block of
/// each primary holder (coordinate 0 along the replicated axes), in mesh rank order, as
/// (rank, offset, extent). Work and memory in proportion to the number of blocks, whatever
/// the mesh's size.
inline std::vector<std::tuple<int, std::vector<std::size_t>, std::vector<std::size_t>>>
primary_blocks(const mesh_shape& mesh, const layout& lay, const std::vector<std::size_t>& shape) {
    const auto spread = lay.replicated_axes(mesh);
    const int count = mesh.size() / mesh.group_size(spread);
    std::vector<std::tuple<int, std::vector<std::size_t>, std::vector<std::size_t>>> out;
    out.reserve(std::size_t(count));
    auto c = mesh.coords(0);
    for (int g = 0; g < count; ++g) {
        // The g-th combination of the coordinates on the other axes (row-major).
        for (std::size_t a = mesh.ndim(), rest = std::size_t(g); a-- > 0;) {
            if (spread.contains(a))
                continue;
            c[a] = int(rest % std::size_t(mesh.sizes[a]));
            rest /= std::size_t(mesh.sizes[a]);
        }
        std::vector<std::size_t> offset, extent;
        for (std::size_t d = 0; d < shape.size(); ++d) {
            const auto k = std::size_t(lay.split_count(d, mesh)),
                       i = std::size_t(lay.block_index(d, mesh, c));
            offset.push_back(block_offset(shape[d], k, i));
            extent.push_back(block_extent(shape[d], k, i));
        }
        out.emplace_back(mesh.rank_of(c), std::move(offset), std::move(extent));
    }
    return out;
}

/// The number of stored blocks of a tensor with layout `lay` saved on `mesh`.
inline std::size_t primary_block_count(const mesh_shape& mesh, const layout& lay) {
    return std::size_t(mesh.size() / mesh.group_size(lay.replicated_axes(mesh)));
}

/// The header of an integrated checkpoint of `entries` (offsets set here), with the CRC-32 of
/// each (in entry order) and of each of its stored blocks (`block_crcs[i]`, in the order of
/// primary_blocks; a tensor with none gets no block checksums). Zeros where not known yet:
/// the header keeps its length whatever the checksums, so that it can be written first and
/// rewritten once they are known.
inline std::string
integrated_header(std::vector<tensor_entry>& entries, const strategy_file& strategy,
                  std::int64_t step, const std::vector<std::optional<std::uint32_t>>& crcs = {},
                  const std::vector<std::vector<std::uint32_t>>& block_crcs = {}) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object(),
                           blocks = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < entries.size(); ++i) {
        j[entries[i].name] = crc_hex(i < crcs.size() && crcs[i] ? *crcs[i] : 0);
        if (i < block_crcs.size() && !block_crcs[i].empty()) {
            std::string hex;
            for (const auto crc : block_crcs[i])
                hex += crc_hex(crc);
            blocks[entries[i].name] = hex;
        }
    }
    return make_header(entries, {{"format", "xshard"},
                                 {"xshard.version", "2"},
                                 {"xshard.step", std::to_string(step)},
                                 {"xshard.strategy", strategy.to_json()},
                                 {"xshard.crc32", j.dump()},
                                 {"xshard.block_crc32", blocks.dump()}});
}

/// A block CRC map ({"name": "<8 lowercase hex digits per block>", ...}), else io_error.
inline std::map<std::string, std::string> parse_block_checksums(const std::string& text) {
    const auto j = parse_json(text);
    if (!j.is_object())
        throw io_error("xshard: the block checksums are not a JSON object");
    std::map<std::string, std::string> out;
    for (const auto& [name, crcs] : j.items()) {
        if (!crcs.is_string() || crcs.get<std::string>().size() % 8 != 0 ||
            crcs.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
            throw io_error("xshard: the block checksums of '" + printable(name) +
                           "' are not 8 hex digits per block");
        out[name] = crcs.get<std::string>();
    }
    return out;
}

/// Writes rank `rank`'s file of a per-rank checkpoint in directory `dir`: each tensor's block
/// (entries with the block's extent as shape, and its bytes), checksummed as it is written
/// (the header, whose length does not depend on the checksums, is written last), fsynced,
/// its size checked, read back and checksummed again, closed. The file is created exclusively
/// (never through a link, never an existing file).
inline void write_rank_file(const std::string& dir, int rank, std::vector<tensor_entry> entries,
                            const std::vector<const std::byte*>& data) {
    const auto header_of = [&](const std::vector<std::uint32_t>& crc) {
        nlohmann::ordered_json crcs = nlohmann::ordered_json::object();
        for (std::size_t i = 0; i < entries.size(); ++i)
            crcs[entries[i].name] = crc_hex(i < crc.size() ? crc[i] : 0);
        return make_header(entries, {{"format", "xshard-rank"},
                                     {"xshard.rank", std::to_string(rank)},
                                     {"xshard.crc32", crcs.dump()}});
    };
    const std::size_t start = header_of({}).size();
    const auto path = rank_file(dir, rank);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        io_fail("cannot create", path);
    auto f = file::adopt(fd, path);
    std::vector<std::uint32_t> crc;
    std::size_t end = start;
    for (const auto& e : entries)
        end = std::max(end, checked_add(start, e.end));
    // Contiguous blocks: pwrite (the writer maps nothing it was not asked to reserve).
    mapped_writer w(f);
    for (std::size_t i = 0; i < entries.size(); ++i)
        crc.push_back(w.write_checksummed(data[i], entries[i].end - entries[i].begin,
                                          start + entries[i].begin));
    const std::string header = header_of(crc);
    if (header.size() != start)
        throw io_error("xshard: " + path + ": the header changed length with its checksums");
    f.write_at(header.data(), header.size(), 0);
    f.sync();
    if (f.size() != end)
        throw io_error("xshard: " + path + " has " + std::to_string(f.size()) +
                       " bytes after writing " + std::to_string(end));
    // What the file holds, read back: a write the file system reported done and lost shows
    // here, before the save commits (issue 12).
    std::string back(header.size(), '\0');
    f.read_at(back.data(), back.size(), 0);
    if (back != header)
        throw io_error("xshard: writing " + path + " failed: the header read back differs");
    std::vector<std::byte> buffer;
    for (std::size_t i = 0; i < entries.size(); ++i)
        if (crc_of_range(f, start + entries[i].begin, entries[i].end - entries[i].begin, buffer) !=
            crc[i])
            throw io_error("xshard: writing " + path + " failed: read back, " +
                           printable(entries[i].name) + " differs from what was written");
    f.close();
}

/// What is at a path a save is about to replace.
enum class existing { nothing, file, checkpoint_directory };

/// True for the names of a per-rank checkpoint's files ("rank_3.safetensors", "strategy.json",
/// "checkpoint.json", and the temporaries of the last two).
inline bool checkpoint_file_name(const std::string& name) {
    if (name == "strategy.json" || name == "checkpoint.json")
        return true;
    for (const char* json : {"strategy.json.tmp-", "checkpoint.json.tmp-"})
        if (name.rfind(json, 0) == 0 && name.size() == std::strlen(json) + 16)
            return true;
    const std::string prefix = "rank_", suffix = ".safetensors";
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        !name.ends_with(suffix))
        return false;
    const auto digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    return digits.find_first_not_of("0123456789") == std::string::npos;
}

/// What `path` holds, when a save may replace it: nothing, an integrated checkpoint of
/// xshard's (a safetensors file whose metadata says "format": "xshard"), or a per-rank
/// checkpoint directory of xshard's (only files of its names, and a checkpoint.json that says
/// so; or empty). Throws io_error for anything else (a link, a user's directory or file, an
/// empty file, another program's safetensors file): xshard never removes what is not a
/// checkpoint of its own.
inline existing replaceable(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto st = fs::symlink_status(path, ec);
    if (ec && st.type() != fs::file_type::not_found)
        throw io_error("xshard: cannot inspect " + path + ": " + ec.message());
    const auto refuse = [&](const std::string& why) {
        return io_error("xshard: " + path + " " + why +
                        "; xshard replaces only its own checkpoints");
    };
    switch (st.type()) {
    case fs::file_type::not_found:
        return existing::nothing;
    case fs::file_type::regular: {
        std::string format;
        try {
            const file f(path, O_RDONLY | O_NOFOLLOW);
            const auto h = read_header(f);
            if (const auto it = h.metadata.find("format"); it != h.metadata.end())
                format = it->second;
        } catch (const io_error&) {
            throw refuse("is not a safetensors file");
        }
        // (Another program's safetensors file is the user's data, not a checkpoint of ours.)
        if (format != "xshard")
            throw refuse("is a safetensors file that xshard did not write");
        return existing::file;
    }
    case fs::file_type::directory: {
        std::size_t entries = 0;
        for (const auto& e : fs::directory_iterator(path, ec)) {
            ++entries;
            if (!checkpoint_file_name(e.path().filename().string()) ||
                !e.is_regular_file() || e.is_symlink())
                throw refuse("holds " + e.path().filename().string() +
                       ", which is not part of an xshard checkpoint");
        }
        if (ec)
            throw io_error("xshard: cannot list " + path + ": " + ec.message());
        if (entries == 0)
            return existing::checkpoint_directory;
        try {
            const auto j = nlohmann::json::parse(read_file(path + "/checkpoint.json"));
            if (j.is_object() && j.value("format", "") == "xshard-checkpoint")
                return existing::checkpoint_directory;
        } catch (const std::exception&) {
        }
        throw refuse("is a directory without an xshard checkpoint.json");
    }
    case fs::file_type::symlink:
        throw refuse("is a symbolic link");
    default:
        throw refuse("is not a regular file or directory");
    }
}

/// Removes the checkpoint at `path` (after `replaceable` said what it is): a file, or the
/// files of xshard's names in a directory and then the directory. Nothing else is removed.
/// The files' blocks are freed in the background (hold_open).
inline void remove_checkpoint(const std::string& path) {
    namespace fs = std::filesystem;
    const auto kind = replaceable(path);
    if (kind == existing::nothing)
        return;
    std::vector<file> held; // freed in the background (hold_open)
    const auto remove = [&](const std::string& name) {
        if (auto f = hold_open(name))
            held.push_back(std::move(*f));
        if (::unlink(name.c_str()) != 0 && errno != ENOENT)
            io_fail("cannot remove", name);
    };
    if (kind == existing::checkpoint_directory) {
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(path))
            names.push_back(e.path().string());
        for (const auto& n : names)
            remove(n);
        if (::rmdir(path.c_str()) != 0 && errno != ENOENT)
            io_fail("cannot remove", path);
    } else {
        remove(path);
    }
    close_in_background(std::move(held));
}

/// Removes a temporary directory a failed save created (mkdtemp: nobody else's): the files of
/// xshard's names in it, then it, if empty. Never throws (it runs during unwinding).
inline void remove_temporary_directory(const std::string& dir) noexcept {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (checkpoint_file_name(e.path().filename().string()))
            ::unlink(e.path().c_str());
    ::rmdir(dir.c_str());
}

/// How long a temporary must have stayed unmodified before a save takes it for stale.
inline constexpr std::time_t stale_after_seconds = 3600;

/// True when `suffix` is what create_temporary_file (16 hexadecimal digits, `directory`
/// false) or create_temporary_directory (mkdtemp's 6 letters and digits) puts after ".tmp-".
inline bool temporary_suffix(std::string_view suffix, bool directory) {
    const std::string_view allowed =
        directory ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                  : "0123456789abcdef";
    return suffix.size() == (directory ? 6u : 16u) &&
           suffix.find_first_not_of(allowed) == std::string_view::npos;
}

/// Removes the temporaries of saves to `path` that were killed: the entries beside it named
/// as create_temporary_file or create_temporary_directory names them, that are a regular
/// file or a directory (never a link, never followed), owned by this user, unmodified for
/// stale_after_seconds and not held by any process (see hold; the lock is taken before the
/// removal, so a save in progress never loses its temporary). Of a directory, only the files
/// of a checkpoint's names are removed, then the directory if that empties it. Never throws:
/// what cannot be removed stays.
inline void remove_stale_temporaries(const std::string& path) noexcept {
    namespace fs = std::filesystem;
    try {
        const fs::path p(path);
        const auto dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
        const std::string prefix = p.filename().string() + ".tmp-";
        std::vector<std::string> names;
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(dir, ec)) {
            auto name = e.path().filename().string();
            if (name.size() > prefix.size() && name.starts_with(prefix))
                names.push_back(std::move(name));
        }
        for (const auto& name : names) {
            const auto full = (dir / name).string();
            const auto suffix = std::string_view(name).substr(prefix.size());
            struct stat st {};
            if (::lstat(full.c_str(), &st) != 0 || st.st_uid != ::geteuid() ||
                std::time(nullptr) - st.st_mtime < stale_after_seconds)
                continue;
            const bool is_file = S_ISREG(st.st_mode) && temporary_suffix(suffix, false);
            const bool is_dir = S_ISDIR(st.st_mode) && temporary_suffix(suffix, true);
            if (!is_file && !is_dir)
                continue;
            const int fd =
                ::open(full.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
            if (fd < 0)
                continue;
            const auto held = file::adopt(fd, full);
            struct stat now {};
            if (::fstat(fd, &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev ||
                ::flock(fd, LOCK_EX | LOCK_NB) != 0)
                continue; // replaced meanwhile, or a save holds it
            if (is_file)
                ::unlink(full.c_str());
            else
                remove_temporary_directory(full);
        }
    } catch (...) {
    }
}

/// Where a save puts the checkpoint it replaces for the moment of the swap.
inline std::string previous_name(const std::string& path) { return path + ".old"; }

/// Puts the complete, synced checkpoint `tmp` (a file or a per-rank directory) in place of
/// `path` without ever leaving no complete checkpoint: a file over a file is one rename; a
/// directory is swapped through <path>.old (a process killed between the two renames leaves
/// <path>.old, which readers fall back to and the next save puts back first). The previous
/// checkpoint is removed unless `remove_old` is false (the caller then removes
/// previous_name(path)); its blocks are freed in the background (hold_open). Throws
/// io_error, replacing nothing, when `path` (or <path>.old) holds something that is not an
/// xshard checkpoint.
inline void replace_checkpoint(const std::string& tmp, const std::string& path,
                               bool remove_old = true) {
    const std::string old = previous_name(path);
    auto now = replaceable(path);
    if (now == existing::nothing && replaceable(old) != existing::nothing) {
        commit_rename(old, path); // finish the swap a killed save left half done
        now = replaceable(path);
    }
    remove_checkpoint(old);
    const bool is_file = std::filesystem::is_regular_file(tmp);
    if (now == existing::nothing || (is_file && now == existing::file)) {
        std::vector<file> previous; // freed in the background (hold_open)
        if (auto f = now == existing::file ? hold_open(path) : std::nullopt)
            previous.push_back(std::move(*f));
        commit_rename(tmp, path);
        close_in_background(std::move(previous));
        return;
    }
    commit_rename(path, old);
    commit_rename(tmp, path);
    if (remove_old)
        remove_checkpoint(old);
}

/// Completes a per-rank checkpoint written in `tmp` (its rank files complete and synced):
/// writes strategy.json and checkpoint.json, then puts it in place of `path`
/// (replace_checkpoint).
inline void finish_per_rank(const std::string& tmp, const std::string& path,
                            const strategy_file& strategy, std::int64_t step,
                            bool remove_old = true) {
    write_file_atomically(tmp + "/strategy.json", strategy.to_json());
    const nlohmann::ordered_json j{{"format", "xshard-checkpoint"},
                                   {"version", 1},
                                   {"step", step},
                                   {"ranks", strategy.mesh.size()}};
    write_file_atomically(tmp + "/checkpoint.json", j.dump(2) + "\n");
    replace_checkpoint(tmp, path, remove_old);
}

} // namespace detail

/// A stored block: which file (a source rank for the per-rank form, 0 for the integrated
/// form) holds which box of a tensor.
struct stored_block {
    int file = 0;
    std::vector<std::size_t> offset, extent;
    std::size_t index = 0; ///< its place among the tensor's stored blocks (blocks())

    std::size_t size() const { return volume(extent); }
};

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
        if (S_ISDIR(st.st_mode)) {
            format_ = checkpoint_format::per_rank;
            dir_ = std::move(opened);
            strategy_ = strategy_file::from_json(
                detail::read_file(detail::file(dir_, "strategy.json", O_RDONLY)));
            for (const auto& p : strategy_.parameters)
                if (p.mesh && p.ranks.empty())
                    throw io_error("xshard: " + path_ + "/strategy.json: '" +
                                   detail::printable(p.name) +
                                   "' has a mesh of its own without the ranks that held it");
            // (A pipeline's strategy names ranks of every stage; a per-rank checkpoint has
            // the rank files of one mesh.)
            for (const auto& p : strategy_.parameters)
                for (const int k : p.ranks)
                    if (k >= strategy_.mesh.size())
                        throw io_error("xshard: " + path_ + "/strategy.json: '" +
                                       detail::printable(p.name) + "' names rank " +
                                       std::to_string(k) + " of a mesh of " +
                                       std::to_string(strategy_.mesh.size()) + " ranks");
            try {
                const detail::file json(dir_, "checkpoint.json", O_RDONLY);
                identity_ = identity_of(json);
                const auto j = detail::parse_json(detail::read_file(json));
                if (!j.is_object() || j.value("format", "") != "xshard-checkpoint" ||
                    detail::json_integer(j, "version", 0, 1) != 1)
                    throw io_error("not an xshard checkpoint of version 1");
                step_ = std::int64_t(detail::json_integer(j, "step", 0, INT64_MAX));
                const auto ranks = detail::json_integer(j, "ranks", 1, INT_MAX);
                if (ranks != std::uint64_t(strategy_.mesh.size()))
                    throw io_error("'ranks' is " + std::to_string(ranks) +
                                   " but strategy.json's mesh has " +
                                   std::to_string(strategy_.mesh.size()) + " ranks");
            } catch (const std::exception& e) {
                throw io_error("xshard: " + path_ + "/checkpoint.json: " + e.what());
            }
            // As many rank files as the mesh has ranks, before any work per rank: the work a
            // load does is bounded by what is on disk, whatever the files say.
            const auto files = detail::count_entries(dir_, "rank_");
            if (files < std::size_t(strategy_.mesh.size()))
                throw io_error("xshard: " + path_ + " holds " + std::to_string(files) +
                               " rank file(s) for a mesh of " +
                               std::to_string(strategy_.mesh.size()) + " ranks");
            return;
        }
        format_ = checkpoint_format::integrated;
        auto h0 = detail::read_header(opened);
        identity_ = identity_of(opened);
        files_.emplace(0, std::pair(std::move(opened), std::move(h0)));
        const auto& h = header(0);
        const auto& meta = h.metadata;
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
            // (Block checksums follow the file's strategy: without one, there are none.)
            if (const auto it = meta.find("xshard.block_crc32");
                it != meta.end() && version != meta.end() && version->second == "2" &&
                meta.count("xshard.strategy"))
                block_checksums_ = detail::parse_block_checksums(it->second);
        } catch (const std::exception& e) {
            throw io_error("xshard: " + path_ + ": malformed xshard metadata: " + e.what());
        }
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
            if (const auto it = block_checksums_.find(p.name);
                it != block_checksums_.end() &&
                it->second.size() / 8 != detail::primary_block_count(strategy_.mesh_of(p), p.lay))
                throw io_error("xshard: " + path_ + ": malformed xshard metadata: '" +
                               detail::printable(p.name) + "' has " +
                               std::to_string(it->second.size() / 8) + " block checksums for " +
                               std::to_string(
                                   detail::primary_block_count(strategy_.mesh_of(p), p.lay)) +
                               " stored blocks");
        }
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
                           : e.ranks.empty()                           ? rank
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
    /// `extent`), which contains the block), checksumming it as it is read (in pieces of at
    /// most 1 MiB, checksummed while in the cache): returns the CRC-32 of its bytes in the
    /// block's order, which its stored checksum is.
    std::uint32_t read_block(const strategy_entry& e, const stored_block& b,
                             const std::vector<std::size_t>& offset,
                             const std::vector<std::size_t>& extent, std::byte* out) const {
        if (b.size() == 0)
            return 0;
        const auto& f = open(b.file).first;
        const auto begin = stored_begin(b, e);
        const auto [so, se] = container(e, b);
        const auto runs =
            detail::copy_runs(b.offset, b.extent, so, se, offset, extent, dtype_size(e.dtype));
        std::uint32_t crc = 0;
        std::size_t i = 0;
        // Short runs (a column split's rows) are copied from a read-only mapping of the file,
        // a window's runs at a time, each checksummed right after it is copied, while in the
        // cache: a system call per run, or reading the other ranks' runs between them, costs
        // more. What cannot be mapped, and long runs, are read (pread).
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
                            crc = detail::crc32_of(out + runs[k][1], runs[k][2], crc);
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
                crc = detail::crc32_of(out + to + done, k, crc);
                done += k;
            }
        }
        return crc;
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

    /// Opens now the files that read_box(e, offset, extent) reads (so that later reads come
    /// from the files open at this moment, whatever is renamed meanwhile).
    void open_box(const strategy_entry& e, const std::vector<std::size_t>& offset,
                  const std::vector<std::size_t>& extent) const {
        for (const auto& b : blocks(e)) {
            bool empty = false;
            for (std::size_t d = 0; d < offset.size(); ++d)
                empty = empty || b.offset[d] >= offset[d] + extent[d] ||
                        offset[d] >= b.offset[d] + b.extent[d];
            if (!empty)
                open(b.file);
        }
    }

    /// A piece of the stored bytes that verification reads: `length` bytes at `at` in file
    /// `file`, bytes [offset, offset + length) of checksummed stored block `key` (the blocks
    /// verified, numbered in the order of the tensors and of their blocks).
    struct piece {
        int file;
        std::size_t at, length;
        std::uint64_t key, offset;
    };

    /// Which stored blocks verification covers: `(i, b)` for block `b` of tensor `i` of the
    /// list verified; every block when empty.
    using block_filter = std::function<bool(std::size_t, const stored_block&)>;

    /// The stored bytes of `tensors` (of their blocks that `only` selects) that carry a
    /// checksum, in pieces of at most `chunk` bytes: reading each once, wherever and by
    /// whomever, verifies them all.
    std::vector<piece> pieces_to_verify(const std::vector<const strategy_entry*>& tensors,
                                        std::size_t chunk, const block_filter& only = {}) const {
        std::vector<piece> out;
        std::uint64_t key = 0;
        for (std::size_t i = 0; i < tensors.size(); ++i)
            for (const auto& b : blocks(*tensors[i])) {
                if ((only && !only(i, b)) || !checksum(*tensors[i], b))
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

    /// The stored blocks of `tensors` (those `only` selects) whose checksum `runs` (of all
    /// their pieces to verify) do not give, e.g. "w1 (in dir/rank_3.safetensors), b"; empty if
    /// none.
    std::string damaged(const std::vector<const strategy_entry*>& tensors,
                        std::vector<detail::crc_run> runs, const block_filter& only = {}) const {
        struct checked {
            std::size_t tensor;
            stored_block block;
            std::string want;
        };
        std::vector<checked> list;
        std::vector<std::uint64_t> sizes;
        for (std::size_t i = 0; i < tensors.size(); ++i)
            for (auto& b : blocks(*tensors[i])) {
                if (only && !only(i, b))
                    continue;
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
