#pragma once
/// \file
/// The definitions of what io/collective_verify.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/collective_verify.hpp>

namespace xshard::detail {

XSHARD_DECL std::vector<crc_run> gather_runs(const communicator& c,
                                             const std::vector<crc_run>& mine) {
    if (mine.size() > std::size_t(INT_MAX / 4))
        throw io_error("xshard: too many checksum runs on one rank");
    const int n = int(mine.size() * 4);
    std::vector<int> counts(std::size_t(c.size())), displs(std::size_t(c.size()));
    gather(c, std::span(&n, 1), c.rank() == 0 ? std::span(counts) : std::span<int>(), 0);
    std::vector<std::uint64_t> all;
    if (c.rank() == 0) {
        std::size_t total = 0;
        for (std::size_t r = 0; r < counts.size(); ++r) {
            if (total > std::size_t(INT_MAX) - std::size_t(counts[r]))
                throw io_error("xshard: too many checksum runs");
            displs[r] = int(total);
            total += std::size_t(counts[r]);
        }
        all.resize(total);
    }
    gatherv(c, std::span(reinterpret_cast<const std::uint64_t*>(mine.data()), mine.size() * 4), all,
            counts, displs, 0);
    if (c.rank() != 0)
        return {};
    std::vector<crc_run> runs(all.size() / 4);
    std::memcpy(runs.data(), all.data(), all.size() * sizeof(std::uint64_t));
    return runs;
}

XSHARD_DECL void verify_shared(const communicator& c, const checkpoint_reader& r,
                               const std::vector<const strategy_entry*>& stored,
                               const std::string& where) {
    std::vector<crc_run> runs;
    everywhere(c, [&] {
        std::vector<std::byte> buffer(verify_chunk);
        runs = r.checksum_share(stored, std::uint64_t(c.rank()), std::uint64_t(c.size()), buffer);
    });
    const auto all = gather_runs(c, runs);
    on_rank0(c, [&] {
        if (const auto bad = r.damaged(stored, all); !bad.empty())
            throw io_error("xshard: " + where + ": checksum mismatch in " + bad +
                           ": the checkpoint is corrupted");
    });
}

XSHARD_DECL void check_same_file(const communicator& c, std::array<std::uint64_t, 4> id,
                                 const std::string& path) {
    auto first = id;
    bcast(c, std::span(first), 0);
    everywhere(c, [&] {
        if (first != id)
            throw io_error("xshard: " + path +
                           " changed while it was being loaded (replaced by another save?)");
    });
}

XSHARD_DECL void check_written(const communicator& c, const std::string& tmp,
                               const std::string& path, const std::string& header,
                               const std::vector<tensor_entry>& entries,
                               const std::vector<std::optional<std::uint32_t>>& crcs,
                               std::size_t expected_size) {
    const auto failed = [&](const std::string& why) {
        return io_error("xshard: writing " + path + " failed: " + why);
    };
    const std::uint64_t p = std::uint64_t(c.size()), me = std::uint64_t(c.rank());
    std::vector<crc_run> runs;
    everywhere(c, [&] {
        file f(tmp, O_WRONLY | O_NOFOLLOW);
        // This rank's share: the pieces that begin in [lo, hi) of the file.
        const std::uint64_t lo = expected_size / p * me,
                            hi = me + 1 == p ? expected_size : expected_size / p * (me + 1);
        f.write_back(lo, hi - lo, false);
        const file in(tmp, O_RDONLY | O_NOFOLLOW);
        std::vector<std::byte> buffer;
        for (std::size_t i = 0; i < entries.size(); ++i) {
            const std::uint64_t start = header.size() + entries[i].begin,
                                bytes = entries[i].end - entries[i].begin;
            for (std::uint64_t o = 0; o < bytes; o += verify_chunk) {
                if (start + o < lo || start + o >= hi)
                    continue;
                const auto n = std::min<std::uint64_t>(verify_chunk, bytes - o);
                buffer.resize(std::size_t(n));
                in.read_at(buffer.data(), buffer.size(), start + o);
                runs.push_back({i, o, n, crc32_of(buffer.data(), buffer.size())});
            }
        }
        f.write_back(lo, hi - lo);
        f.close();
    });
    const auto all = gather_runs(c, runs);
    on_rank0(c, [&] {
        file f(tmp, O_WRONLY | O_NOFOLLOW);
        f.sync();
        if (f.size() != expected_size)
            throw failed("the file has " + std::to_string(f.size()) + " bytes, not " +
                         std::to_string(expected_size));
        const file in(tmp, O_RDONLY | O_NOFOLLOW);
        std::string back(header.size(), '\0');
        in.read_at(back.data(), back.size(), 0);
        if (back != header)
            throw failed("the header read back differs from the one written");
        std::vector<std::uint64_t> sizes;
        for (const auto& e : entries)
            sizes.push_back(e.end - e.begin);
        const auto got = combine_runs(all, sizes);
        std::string bad;
        for (std::size_t i = 0; i < entries.size(); ++i)
            if (!got[i] || !crcs[i] || *got[i] != *crcs[i])
                bad += (bad.empty() ? "" : ", ") + printable(entries[i].name);
        if (!bad.empty())
            throw failed("read back, " + bad + " differ from what was written");
        f.close();
    });
}

} // namespace xshard::detail

