#pragma once
/// \file
/// The definitions of what io/checkpoint_save.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/checkpoint_save.hpp>

namespace xshard::detail {

XSHARD_DECL std::uint32_t write_block(mapped_writer& w, std::size_t at, const tensor_record& t,
                                      std::uint64_t key, std::vector<crc_run>& out) {
    const auto runs = runs_of(t.shape, t.offset, t.extent, t.element);
    if (runs.empty())
        return 0;
    if (runs.front().second < short_run) {
        const auto first = checked_add(at, runs.front().first);
        w.reserve(first, checked_add(at, runs.back().first + runs.back().second) - first);
    }
    const std::byte* data = t.cdata;
    std::uint32_t block = 0;
    for (const auto& [offset, length] : runs) {
        const auto crc = w.write_checksummed(data, length, at + offset);
        out.push_back({key, offset, length, crc});
        block = std::uint32_t(::crc32_combine(uLong(block), uLong(crc), z_off_t(length)));
        data += length;
    }
    return block;
}

XSHARD_DECL std::uint32_t
write_together(node_file_io& node, const file& f, std::size_t at, std::size_t length,
               const std::vector<std::pair<std::size_t, std::size_t>>& runs, const std::byte* data,
               std::uint64_t key, std::vector<crc_run>& out) {
    std::vector<node_file_io::source_run> mine;
    for (const auto& [offset, n] : runs) {
        mine.push_back({at + offset, data, n});
        data += n;
    }
    std::vector<std::uint32_t> crc(runs.size(), 0);
    node.write(f, at, length, mine, [&](std::size_t i, const std::byte* p, std::size_t n) {
        crc[i] = crc32_of(p, n, crc[i]);
    });
    std::uint32_t block = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
        out.push_back({key, runs[i].first, runs[i].second, crc[i]});
        block =
            std::uint32_t(::crc32_combine(uLong(block), uLong(crc[i]), z_off_t(runs[i].second)));
    }
    return block;
}

XSHARD_DECL integrated_writes plan_integrated_writes(const communicator& c, const ckpt_model& m) {
    const std::size_t nt = m.tensors.size();
    integrated_writes w;
    w.sizes.resize(nt);
    w.mine.resize(nt);
    w.together.assign(nt, false);
    std::vector<std::uint64_t> view(2 * nt, 0); // short runs written, bytes written, by tensor
    everywhere(c, [&] {
        for (std::size_t i = 0; i < nt; ++i) {
            const auto& t = m.tensors[i];
            w.sizes[i] = t.global_bytes();
            if (m.holds(i) && t.primary()) {
                w.mine[i] = runs_of(t.shape, t.offset, t.extent, t.element);
                view[i] = !w.mine[i].empty() && w.mine[i].front().second < short_run;
                view[nt + i] = t.bytes();
            }
        }
    });
    if (c.size() > 1) {
        allreduce(c, std::span(view), reduction::sum);
        for (std::size_t i = 0; i < nt; ++i)
            w.together[i] = view[i] > 0 && view[nt + i] == w.sizes[i];
        if (std::find(w.together.begin(), w.together.end(), true) != w.together.end()) {
            w.node = &node_file_io::of(c); // empty when the ranks do not share one node
            if (!*w.node)
                std::fill(w.together.begin(), w.together.end(), false);
        }
    }
    return w;
}

XSHARD_DECL void write_integrated_blocks(const communicator& c, const ckpt_model& m,
                                         const std::string& tmp, std::size_t data_start,
                                         const std::vector<tensor_entry>& entries,
                                         const integrated_writes& w, std::vector<crc_run>& runs,
                                         std::vector<crc_run>& blocks) {
    const std::size_t nt = m.tensors.size();
    const auto block_written = [&](std::size_t i, std::uint32_t crc) {
        const auto& t = m.tensors[i];
        blocks.push_back(
            {i, std::uint64_t(t.mesh.group_color(t.mesh_rank, t.replicated)), t.bytes(), crc});
    };
    std::optional<file> f; // (read and write: a shared mapping of a file must be readable)
    everywhere(c, [&] { f.emplace(tmp, O_RDWR | O_NOFOLLOW); });
    // The node's writes first, all of them on every rank: a node write fails on every rank
    // together, and so before any rank could fail alone in a write of its own.
    for (std::size_t i = 0; i < nt; ++i) {
        const auto& t = m.tensors[i];
        if (!w.together[i])
            continue;
        const auto crc = write_together(*w.node, *f, data_start + entries[i].begin, w.sizes[i],
                                        w.mine[i], t.cdata, i, runs);
        if (m.holds(i) && t.primary())
            block_written(i, crc);
    }
    // The rest each rank writes with pwrite, or short runs through a mapping (write_block).
    everywhere(c, [&] {
        {
            mapped_writer writer(*f);
            for (std::size_t i = 0; i < nt; ++i) {
                const auto& t = m.tensors[i];
                if (!w.together[i] && m.holds(i) && t.primary())
                    block_written(i, write_block(writer, checked_add(data_start, entries[i].begin),
                                                 t, i, runs));
            }
        }
        f->close();
    });
}

XSHARD_DECL void save_integrated(ckpt_model& m, const std::string& path, std::int64_t step) {
    const auto& c = *m.comm;
    std::vector<tensor_entry> entries;
    std::vector<std::vector<std::uint32_t>> block_crcs;
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const auto& t = m.tensors[i];
        entries.push_back({t.name, m.dtypes[i], t.shape, 0, 0});
        block_crcs.emplace_back(primary_block_count(t.mesh, t.lay), 0);
    }
    // (Every rank's header has the final one's length, whatever the checksums.)
    std::string header = integrated_header(entries, m.strategy, step, {}, block_crcs);
    std::size_t size = header.size();
    for (const auto& e : entries)
        size = std::max(size, checked_add(header.size(), e.end));
    const auto write = [&](const std::string& tmp) {
        const auto plan = plan_integrated_writes(c, m);
        std::vector<crc_run> runs, blocks;
        write_integrated_blocks(c, m, tmp, header.size(), entries, plan, runs, blocks);
        // Then rank 0 writes the header with the checksums; the file is read back.
        const auto crcs = combine_runs(gather_runs(c, runs), plan.sizes);
        const auto all_blocks = gather_runs(c, blocks);
        on_rank0(c, [&] {
            for (const auto& b : all_blocks)
                block_crcs.at(b.tensor).at(b.offset) = std::uint32_t(b.crc);
            header = integrated_header(entries, m.strategy, step, crcs, block_crcs);
            file f(tmp, O_WRONLY | O_NOFOLLOW);
            f.write_at(header.data(), header.size(), 0);
            f.close();
        });
        check_written(c, tmp, path, header, entries, crcs, size);
    };
    staged_save(
        c, path, temporary_kind::file, write,
        [&](const std::string& tmp) { replace_checkpoint(tmp, path); }, [](const std::string&) {});
}

XSHARD_DECL void save_per_rank(ckpt_model& m, const std::string& path, std::int64_t step) {
    const auto& c = *m.comm;
    const auto write = [&](const std::string& tmp) {
        everywhere(c, [&] {
            std::vector<tensor_entry> entries;
            std::vector<const std::byte*> data;
            for (std::size_t i = 0; i < m.tensors.size(); ++i) {
                entries.push_back({m.tensors[i].name, m.dtypes[i], m.tensors[i].extent, 0, 0});
                data.push_back(m.tensors[i].cdata);
            }
            write_rank_file(tmp, m.rank, std::move(entries), data);
        });
    };
    // Every rank's file is there before rank 0 commits (everywhere agreed on it).
    staged_save(
        c, path, temporary_kind::directory, write,
        [&](const std::string& tmp) { finish_per_rank(tmp, path, m.strategy, step, false); },
        [&](const std::string& tmp) { ::unlink(rank_file(tmp, c.rank()).c_str()); });
    // The previous checkpoint's files, removed by their ranks at once (freeing a large file's
    // blocks takes a while); then the rest of it by rank 0.
    const std::string old = previous_name(path);
    everywhere(c, [&] {
        if (std::filesystem::is_directory(old) && !std::filesystem::is_symlink(old))
            ::unlink(rank_file(old, m.rank).c_str());
    });
    on_rank0(c, [&] { remove_checkpoint(old); });
}

} // namespace xshard::detail

