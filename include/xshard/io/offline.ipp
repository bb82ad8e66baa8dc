#pragma once
/// \file
/// The definitions of what io/offline.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/offline.hpp>

namespace xshard {

XSHARD_DECL checkpoint_report verify_checkpoint(const std::string& path) {
    const checkpoint_reader r(path);
    checkpoint_report report;
    report.files = r.file_count();
    for (const auto& e : r.strategy().parameters) {
        try {
            r.check_blocks(e);
        } catch (const std::exception& ex) {
            std::string what = ex.what();
            if (what.rfind("xshard: ", 0) == 0)
                what = what.substr(8);
            report.damage.push_back(what);
        }
    }
    if (r.format() == checkpoint_format::integrated) {
        // Each stored block against its checksum (version 2: a checksum per block the saving
        // ranks held; otherwise the tensor whole is the one block).
        std::vector<std::byte> buffer;
        for (const auto& e : r.strategy().parameters) {
            try {
                r.check_blocks(e);
            } catch (const std::exception&) {
                continue; // reported above
            }
            bool bad = false;
            for (const auto& b : r.blocks(e)) {
                const auto want = r.checksum(e, b);
                if (!want) {
                    ++report.unchecked;
                    continue;
                }
                ++report.checked;
                try {
                    bad = bad || detail::crc_hex(r.crc_of_block(e, b, buffer)) != *want;
                } catch (const std::exception& ex) {
                    std::string what = ex.what();
                    report.damage.push_back(what.rfind("xshard: ", 0) == 0 ? what.substr(8) : what);
                }
            }
            if (bad)
                report.damage.push_back("checksum mismatch: " + detail::printable(e.name) + " in " +
                                        r.path());
        }
        return report;
    }
    for (std::size_t file = 0; file < report.files; ++file) {
        try {
            const auto& h = r.header(int(file));
            std::vector<std::byte> buffer;
            for (const auto& t : h.tensors) {
                const auto want = r.checksum(int(file), t.name);
                if (!want) {
                    ++report.unchecked;
                    continue;
                }
                ++report.checked;
                const auto crc = r.crc_of_range(int(file), h.data_start + t.begin,
                                                t.end - t.begin, buffer);
                if (detail::crc_hex(crc) != *want)
                    report.damage.push_back("checksum mismatch: " + detail::printable(t.name) +
                                            " in " + r.file_path(int(file)));
            }
        } catch (const std::exception& ex) {
            std::string what = ex.what();
            if (what.rfind("xshard: ", 0) == 0)
                what = what.substr(8);
            report.damage.push_back(what);
        }
    }
    return report;
}

namespace detail {

XSHARD_DECL void verify_stored(const checkpoint_reader& r,
                               const std::vector<strategy_entry>& tensors) {
    std::vector<const strategy_entry*> list;
    for (const auto& e : tensors) {
        r.check_blocks(e);
        list.push_back(&e);
    }
    std::vector<crc_run> runs;
    std::vector<std::byte> buffer;
    for (const auto& p : r.pieces_to_verify(list, std::size_t(16) << 20))
        runs.push_back(r.checksum_of(p, buffer));
    if (const auto bad = r.damaged(list, std::move(runs)); !bad.empty())
        throw io_error("xshard: checksum mismatch in " + bad + ": the checkpoint is corrupted");
}

} // namespace detail

XSHARD_DECL std::size_t merge_checkpoint(const std::string& path, const std::string& out) {
    const checkpoint_reader r(path);
    const auto& tensors = r.strategy().parameters;
    std::vector<tensor_entry> entries;
    for (const auto& e : tensors) {
        stored_bytes(e);
        entries.push_back({e.name, e.dtype, e.shape, 0, 0});
    }
    std::vector<std::vector<std::uint32_t>> zeros;
    for (const auto& e : tensors)
        zeros.emplace_back(detail::primary_block_count(r.strategy().mesh_of(e), e.lay), 0);
    std::string header = detail::integrated_header(entries, r.strategy(), r.step(), {}, zeros);
    detail::verify_stored(r, tensors);
    detail::write_staged(out, detail::temporary_kind::file, [&](detail::file& f) {
        std::vector<std::optional<std::uint32_t>> crcs;
        std::vector<std::byte> slab;
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            const auto& e = tensors[i];
            const std::size_t bytes = stored_bytes(e);
            std::uint32_t crc = 0;
            if (bytes > 0) {
                // Slabs of whole rows (at most 64 MiB unless one row is larger): contiguous
                // in the output, read from wherever the source holds them. Bytes > 0, so
                // every dimension is at least 1 and the loop is bounded by the stored bytes.
                const std::size_t rows = e.shape.empty() ? 1 : e.shape[0];
                const std::size_t row = bytes / rows;
                const std::size_t step = std::max<std::size_t>(1, (std::size_t(64) << 20) / row);
                for (std::size_t r0 = 0; r0 < rows; r0 += step) {
                    auto offset = std::vector<std::size_t>(e.shape.size(), 0);
                    auto extent = e.shape;
                    if (!e.shape.empty()) {
                        offset[0] = r0;
                        extent[0] = std::min(step, rows - r0);
                    }
                    const auto n = (e.shape.empty() ? 1 : extent[0]) * row;
                    slab.resize(n);
                    r.read_box(e, offset, extent, slab.data());
                    f.write_at(slab.data(), n, header.size() + entries[i].begin + r0 * row);
                    crc = detail::crc32_of(slab.data(), n, crc);
                }
            }
            crcs.push_back(crc);
        }
        // The checksum of each block of the strategy, from what was just written.
        const detail::file written(f.path(), O_RDONLY | O_NOFOLLOW);
        std::vector<std::vector<std::uint32_t>> block_crcs(tensors.size());
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            const auto& e = tensors[i];
            for (const auto& [rank, offset, extent] :
                 detail::primary_blocks(r.strategy().mesh_of(e), e.lay, e.shape)) {
                std::uint32_t crc = 0;
                for (const auto& [at, n] :
                     detail::runs_of(e.shape, offset, extent, dtype_size(e.dtype)))
                    crc = detail::crc_of_range(written, header.size() + entries[i].begin + at, n,
                                               slab, crc);
                block_crcs[i].push_back(crc);
            }
        }
        header = detail::integrated_header(entries, r.strategy(), r.step(), crcs, block_crcs);
        f.write_at(header.data(), header.size(), 0);
        f.sync();
        f.close();
        detail::replace_checkpoint(f.path(), out);
    });
    return tensors.size();
}

XSHARD_DECL std::size_t reshard_checkpoint(const std::string& path, const strategy_file& target,
                                           const std::string& out,
                                           const std::string& target_name) {
    const checkpoint_reader r(path);
    std::vector<strategy_entry> tensors;
    std::string missing;
    for (const auto& e : r.strategy().parameters) {
        const auto* t = target.find(e.name);
        if (!t) {
            missing += (missing.empty() ? "" : ", ") + detail::printable(e.name);
            continue;
        }
        if (t->dtype != e.dtype || t->shape != e.shape)
            throw io_error("xshard: '" + detail::printable(e.name) + "' is " + e.dtype + " " +
                           detail::shape_string(e.shape) + " in the checkpoint but " + t->dtype +
                           " " + detail::shape_string(t->shape) + " in " + target_name);
        tensors.push_back(e);
    }
    if (!missing.empty())
        throw io_error("xshard: " + target_name + " has no layout for " + missing);
    strategy_file written = target;
    written.parameters.clear();
    for (const auto& e : tensors)
        written.parameters.push_back(*target.find(e.name));
    const auto& mesh = target.mesh;
    detail::verify_stored(r, tensors);
    detail::write_staged(out, detail::temporary_kind::directory, [&](const detail::file& held) {
        const std::string tmp = held.path();
        for (int rank = 0; rank < mesh.size(); ++rank) {
            std::vector<tensor_entry> entries;
            std::vector<std::vector<std::byte>> blocks;
            const auto c = mesh.coords(rank);
            for (const auto& e : tensors) {
                const auto& want = *target.find(e.name);
                std::vector<std::size_t> offset, extent;
                for (std::size_t d = 0; d < want.shape.size(); ++d) {
                    const auto k = std::size_t(want.lay.split_count(d, mesh));
                    const auto b = std::size_t(want.lay.block_index(d, mesh, c));
                    offset.push_back(block_offset(want.shape[d], k, b));
                    extent.push_back(block_extent(want.shape[d], k, b));
                }
                entries.push_back({want.name, want.dtype, extent, 0, 0});
                blocks.emplace_back(checked_mul(volume(extent), dtype_size(want.dtype)));
                r.read_box(e, offset, extent, blocks.back().data());
            }
            std::vector<const std::byte*> data;
            for (const auto& b : blocks)
                data.push_back(b.data());
            detail::write_rank_file(tmp, rank, std::move(entries), data);
        }
        detail::finish_per_rank(tmp, out, written, r.step());
    });
    return tensors.size();
}

} // namespace xshard

