#pragma once
/// \file
/// The definitions of what io/checkpoint_forms.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/checkpoint_forms.hpp>

namespace xshard::detail {

XSHARD_DECL std::string
integrated_header(std::vector<tensor_entry>& entries, const strategy_file& strategy,
                  std::int64_t step, const std::vector<std::optional<std::uint32_t>>& crcs,
                  const std::vector<std::vector<std::uint32_t>>& block_crcs) {
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

XSHARD_DECL std::map<std::string, std::string> parse_block_checksums(const std::string& text) {
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

XSHARD_DECL void write_rank_file(const std::string& dir, int rank,
                                 std::vector<tensor_entry> entries,
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

XSHARD_DECL std::string checkpoint_json(std::int64_t step, int ranks) {
    nlohmann::ordered_json j;
    write_envelope(j, checkpoint_json_kind);
    j["step"] = step;
    j["ranks"] = ranks;
    return j.dump(2) + "\n";
}

XSHARD_DECL checkpoint_json_contents parse_checkpoint_json(std::string_view text) {
    const auto j = read_envelope(text, checkpoint_json_kind).json;
    return {std::int64_t(json_integer(j, "step", 0, INT64_MAX)),
            json_integer(j, "ranks", 1, INT_MAX)};
}

XSHARD_DECL void finish_per_rank(const std::string& tmp, const std::string& path,
                                 const strategy_file& strategy, std::int64_t step,
                                 bool remove_old) {
    write_file_atomically(tmp + "/strategy.json", strategy.to_json());
    write_file_atomically(tmp + "/checkpoint.json", checkpoint_json(step, strategy.mesh.size()));
    replace_checkpoint(tmp, path, remove_old);
}

} // namespace xshard::detail

