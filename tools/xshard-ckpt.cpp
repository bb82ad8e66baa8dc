// xshard-ckpt: inspects and converts xshard checkpoints offline (one process, no MPI run).
//
//   xshard-ckpt info PATH                       tensors, shapes, dtypes, layouts, sizes
//   xshard-ckpt verify PATH                     every stored tensor against its CRC-32
//   xshard-ckpt merge DIR OUT.safetensors       per-rank directory -> one integrated file
//   xshard-ckpt reshard PATH STRATEGY.json OUT  -> a per-rank checkpoint in another strategy,
//                                               for any world size (the strategy file's mesh)
//
// PATH is either form: an integrated safetensors file or a per-rank directory. Nothing is
// ever held whole: merge streams slabs of rows, reshard one destination block at a time, and
// both first check every stored byte they use against its checksum. Outputs appear complete or not
// at all (temporary name, fsync, rename). Exit status: 0 done, 1 verify found damage, 2 bad input.

#include <xshard/io/format.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using xshard::checkpoint_format;
using xshard::checkpoint_reader;
using xshard::strategy_entry;

/// Removes a temporary output (file or directory) unless it was renamed into place.
struct removed_on_failure {
    std::string path;
    ~removed_on_failure() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
    }
};

/// "960 B", "1.50 KiB", "512.00 MiB", "2.00 GiB".
std::string size_text(std::size_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = double(bytes);
    std::size_t u = 0;
    while (value >= 1024 && u + 1 < std::size(units)) {
        value /= 1024;
        ++u;
    }
    char buf[32];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%zu B", bytes);
    else
        std::snprintf(buf, sizeof buf, "%.2f %s", value, units[u]);
    return buf;
}

std::size_t bytes_of(const strategy_entry& e) {
    std::size_t n = xshard::dtype_size(e.dtype);
    for (auto d : e.shape)
        n *= d;
    return n;
}

std::string form_name(checkpoint_format f) {
    return f == checkpoint_format::integrated ? "integrated" : "per-rank";
}

int info(const std::string& path) {
    const checkpoint_reader r(path);
    const auto& s = r.strategy();
    std::printf("%s: %s checkpoint, step %lld, saved on mesh(%s), %d pipeline stage(s)\n",
                r.path().c_str(), form_name(r.format()).c_str(), static_cast<long long>(r.step()),
                s.mesh.to_string().c_str(), s.pipeline_stages);
    std::size_t total = 0;
    std::printf("%-32s %-5s %-18s %-22s %12s\n", "tensor", "dtype", "shape", "layout", "size");
    for (const auto& e : s.parameters) {
        std::printf("%-32s %-5s %-18s %-22s %12s%s\n", e.name.c_str(), e.dtype.c_str(),
                    xshard::detail::shape_string(e.shape).c_str(), e.lay.to_string().c_str(),
                    size_text(bytes_of(e)).c_str(), e.trainable ? "" : "  (not trainable)");
        total += bytes_of(e);
    }
    std::printf("%zu tensors, %s\n", s.parameters.size(), size_text(total).c_str());
    return 0;
}

/// The CRC-32 of `n` bytes at `at` in `f`, read in 16 MiB pieces.
std::uint32_t crc_of_range(const xshard::detail::file& f, std::size_t at, std::size_t n) {
    std::vector<std::byte> buffer(std::min<std::size_t>(n, std::size_t(16) << 20));
    std::uint32_t crc = 0;
    for (std::size_t done = 0; done < n;) {
        const auto k = std::min(buffer.size(), n - done);
        f.read_at(buffer.data(), k, at + done);
        crc = xshard::detail::crc32_of(buffer.data(), k, crc);
        done += k;
    }
    return crc;
}

int verify(const std::string& path) {
    const checkpoint_reader r(path);
    const int files = r.format() == checkpoint_format::integrated ? 1 : r.strategy().mesh.size();
    std::size_t checked = 0, unchecked = 0;
    std::vector<std::string> bad;
    for (int file = 0; file < files; ++file) {
        const auto& h = r.header(file);
        const xshard::detail::file f(r.file_path(file), O_RDONLY);
        for (const auto& t : h.tensors) {
            const auto want = r.checksum(file, t.name);
            if (!want) {
                ++unchecked;
                continue;
            }
            ++checked;
            if (xshard::detail::crc_hex(crc_of_range(f, h.data_start + t.begin, t.end - t.begin)) !=
                *want)
                bad.push_back(t.name + " in " + r.file_path(file));
        }
    }
    for (const auto& b : bad)
        std::printf("checksum mismatch: %s\n", b.c_str());
    std::printf("%s: %zu tensor blocks in %d file(s) checked, %zu damaged%s\n", r.path().c_str(),
                checked, files, bad.size(),
                unchecked ? (", " + std::to_string(unchecked) + " without a checksum").c_str()
                          : "");
    return bad.empty() ? 0 : 1;
}

/// Checks every stored byte of `tensors` against its CRC-32 (in 16 MiB pieces); throws
/// naming the damaged tensors.
void verify_stored(const checkpoint_reader& r, const std::vector<strategy_entry>& tensors) {
    std::vector<const strategy_entry*> list;
    for (const auto& e : tensors)
        list.push_back(&e);
    std::vector<xshard::detail::crc_run> runs;
    std::vector<std::byte> buffer;
    for (const auto& p : r.pieces_to_verify(list, std::size_t(16) << 20))
        runs.push_back(r.checksum_of(p, buffer));
    if (const auto bad = r.damaged(list, std::move(runs)); !bad.empty())
        throw xshard::io_error("xshard: checksum mismatch in " + bad +
                               ": the checkpoint is corrupted");
}

int merge(const std::string& path, const std::string& out) {
    const checkpoint_reader r(path);
    const auto& tensors = r.strategy().parameters;
    std::vector<xshard::tensor_entry> entries;
    for (const auto& e : tensors)
        entries.push_back({e.name, e.dtype, e.shape, 0, 0});
    std::string header = xshard::detail::integrated_header(entries, r.strategy(), r.step());
    const std::string tmp = out + ".tmp";
    verify_stored(r, tensors);
    std::vector<std::optional<std::uint32_t>> crcs;
    const removed_on_failure guard{tmp};
    {
        const xshard::detail::file f(tmp, O_WRONLY | O_CREAT | O_TRUNC);
        std::vector<std::byte> slab;
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            const auto& e = tensors[i];
            // Slabs of whole rows (at most 64 MiB unless one row is larger): contiguous in the
            // output, read from wherever the source holds them.
            std::size_t row = xshard::dtype_size(e.dtype);
            for (std::size_t d = 1; d < e.shape.size(); ++d)
                row *= e.shape[d];
            const std::size_t rows = e.shape.empty() ? 1 : e.shape[0];
            const std::size_t step =
                std::max<std::size_t>(1, (std::size_t(64) << 20) / std::max<std::size_t>(row, 1));
            std::uint32_t crc = 0;
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
                crc = xshard::detail::crc32_of(slab.data(), n, crc);
            }
            crcs.push_back(crc);
        }
        header = xshard::detail::integrated_header(entries, r.strategy(), r.step(), crcs);
        f.write_at(header.data(), header.size(), 0);
        f.sync();
    }
    xshard::detail::commit_rename(tmp, out);
    std::printf("merged %zu tensors from %s (%s) into %s\n", tensors.size(), r.path().c_str(),
                form_name(r.format()).c_str(), out.c_str());
    return 0;
}

int reshard(const std::string& path, const std::string& strategy_path, const std::string& out) {
    const checkpoint_reader r(path);
    auto target = xshard::load_strategy_file(strategy_path);
    // Every tensor of the checkpoint, in the target's layout (which must name them all).
    std::vector<strategy_entry> tensors;
    std::string missing;
    for (const auto& e : r.strategy().parameters) {
        const auto* t = target.find(e.name);
        if (!t) {
            missing += (missing.empty() ? "" : ", ") + e.name;
            continue;
        }
        if (t->dtype != e.dtype || t->shape != e.shape)
            throw xshard::io_error("xshard: '" + e.name + "' is " + e.dtype + " " +
                                   xshard::detail::shape_string(e.shape) +
                                   " in the checkpoint but " + t->dtype + " " +
                                   xshard::detail::shape_string(t->shape) + " in " + strategy_path);
        tensors.push_back(e);
    }
    if (!missing.empty())
        throw xshard::io_error("xshard: " + strategy_path + " has no layout for " + missing);
    xshard::strategy_file written = target;
    written.parameters.clear();
    for (const auto& e : tensors)
        written.parameters.push_back(*target.find(e.name));
    const auto& mesh = target.mesh;
    const std::string tmp = out + ".tmp";
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    const removed_on_failure guard{tmp};
    verify_stored(r, tensors);
    for (int rank = 0; rank < mesh.size(); ++rank) {
        std::vector<xshard::tensor_entry> entries;
        std::vector<std::vector<std::byte>> blocks;
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            const auto& want = *target.find(tensors[i].name);
            std::vector<std::size_t> offset, extent;
            const auto c = mesh.coords(rank);
            for (std::size_t d = 0; d < want.shape.size(); ++d) {
                const auto k = std::size_t(want.lay.split_count(d, mesh));
                const auto b = std::size_t(want.lay.block_index(d, mesh, c));
                offset.push_back(xshard::block_offset(want.shape[d], k, b));
                extent.push_back(xshard::block_extent(want.shape[d], k, b));
            }
            entries.push_back({want.name, want.dtype, extent, 0, 0});
            blocks.emplace_back(entries.back().elements() * xshard::dtype_size(want.dtype));
            r.read_box(tensors[i], offset, extent, blocks.back().data());
        }
        std::vector<const std::byte*> data;
        for (const auto& b : blocks)
            data.push_back(b.data());
        xshard::detail::write_rank_file(tmp, rank, std::move(entries), data);
    }
    xshard::detail::finish_per_rank(tmp, out, written, r.step());
    std::printf(
        "resharded %zu tensors from %s (%s, mesh(%s)) into %s: per-rank, mesh(%s), %d files\n",
        tensors.size(), r.path().c_str(), form_name(r.format()).c_str(),
        r.strategy().mesh.to_string().c_str(), out.c_str(), mesh.to_string().c_str(), mesh.size());
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"xshard-ckpt: inspect, verify, merge and reshard xshard checkpoints"};
    app.require_subcommand(1);
    std::string path, out, strategy;
    auto* info_cmd = app.add_subcommand("info", "tensors, shapes, dtypes, layouts and sizes");
    info_cmd->add_option("path", path, "checkpoint (integrated file or per-rank directory)")
        ->required();
    auto* verify_cmd = app.add_subcommand(
        "verify", "check every stored tensor against its CRC-32 (exit 1 if damaged)");
    verify_cmd->add_option("path", path, "checkpoint")->required();
    auto* merge_cmd =
        app.add_subcommand("merge", "per-rank checkpoint -> one integrated safetensors file");
    merge_cmd->add_option("path", path, "checkpoint (per-rank directory)")->required();
    merge_cmd->add_option("out", out, "output .safetensors file")->required();
    auto* reshard_cmd =
        app.add_subcommand("reshard", "checkpoint -> per-rank checkpoint in another strategy");
    reshard_cmd->add_option("path", path, "checkpoint")->required();
    reshard_cmd
        ->add_option("strategy", strategy, "target strategy file (xshard::save_strategy_file)")
        ->required();
    reshard_cmd->add_option("out", out, "output directory")->required();
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "xshard-ckpt: %s (see --help)\n", e.what());
        return 2;
    }
    try {
        if (*info_cmd)
            return info(path);
        if (*verify_cmd)
            return verify(path);
        if (*merge_cmd)
            return merge(path, out);
        return reshard(path, strategy, out);
    } catch (const std::exception& e) {
        std::string what = e.what();
        if (what.rfind("xshard: ", 0) == 0)
            what = what.substr(8);
        std::fprintf(stderr, "xshard-ckpt: %s\n", what.c_str());
        return 2;
    }
}
