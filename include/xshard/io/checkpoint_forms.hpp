#pragma once
/// \file
/// The two on-disk forms of a checkpoint (stored_blocks.hpp): what their headers hold, and
/// the writing of the files that the collective saves (checkpoint_save.hpp) and the offline
/// tools (offline.hpp) share.
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

#include <xshard/comm/error.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/atomic_replace.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/json_envelope.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/io/strategy_file.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xshard::detail {

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
    // here, before the save commits.
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

/// The text of a per-rank checkpoint's checkpoint.json: its envelope (checkpoint_json_kind),
/// the step, and the number of rank files.
inline std::string checkpoint_json(std::int64_t step, int ranks) {
    nlohmann::ordered_json j;
    write_envelope(j, checkpoint_json_kind);
    j["step"] = step;
    j["ranks"] = ranks;
    return j.dump(2) + "\n";
}

/// What a checkpoint.json says.
struct checkpoint_json_contents {
    std::int64_t step = 0;
    std::uint64_t ranks = 0;
};

/// Parses a checkpoint.json strictly (its envelope, a step in [0, INT64_MAX], ranks in
/// [1, INT_MAX]); io_error "xshard: <what is wrong>".
inline checkpoint_json_contents parse_checkpoint_json(std::string_view text) {
    const auto j = read_envelope(text, checkpoint_json_kind).json;
    return {std::int64_t(json_integer(j, "step", 0, INT64_MAX)),
            json_integer(j, "ranks", 1, INT_MAX)};
}

/// Completes a per-rank checkpoint written in `tmp` (its rank files complete and synced):
/// writes strategy.json and checkpoint.json, then puts it in place of `path`
/// (replace_checkpoint).
inline void finish_per_rank(const std::string& tmp, const std::string& path,
                            const strategy_file& strategy, std::int64_t step,
                            bool remove_old = true) {
    write_file_atomically(tmp + "/strategy.json", strategy.to_json());
    write_file_atomically(tmp + "/checkpoint.json", checkpoint_json(step, strategy.mesh.size()));
    replace_checkpoint(tmp, path, remove_old);
}

} // namespace xshard::detail
