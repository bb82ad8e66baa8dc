// xshard-ckpt: inspects and converts xshard checkpoints offline (one process, no MPI run).
//
//   xshard-ckpt info PATH                       tensors, shapes, dtypes, layouts, sizes
//   xshard-ckpt verify PATH                     everything a load needs, every CRC-32
//   xshard-ckpt merge DIR OUT.safetensors       per-rank directory -> one integrated file
//   xshard-ckpt reshard PATH STRATEGY.json OUT  -> a per-rank checkpoint in another strategy,
//                                               for any world size (the strategy file's mesh)
//
// PATH is either form: an integrated safetensors file or a per-rank directory. The work is
// xshard's public API (io/checkpoint_reader.hpp, io/offline.hpp). Exit status: 0 done,
// 1 verify found damage, 2 bad input (one line on stderr).

#include <xshard/io/checkpoint_reader.hpp>
#include <xshard/io/offline.hpp>
#include <xshard/io/strategy_file.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using xshard::checkpoint_format;
using xshard::checkpoint_reader;

/// "960 B", "1.50 KiB", "512.00 MiB", "2.00 GiB".
std::string size_text(std::size_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
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

/// "(12, 10)", "(10,)", "()".
std::string shape_text(const std::vector<std::size_t>& shape) {
    std::string s = "(";
    for (std::size_t d = 0; d < shape.size(); ++d)
        s += (d ? ", " : "") + std::to_string(shape[d]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

std::string form_name(checkpoint_format f) {
    return f == checkpoint_format::integrated ? "integrated" : "per-rank";
}

int info(const std::string& path) {
    const checkpoint_reader r(path);
    const auto& s = r.strategy();
    std::printf("%s: %s checkpoint, step %lld, saved on mesh(%s), %d pipeline stage(s)\n",
                xshard::printable(r.path()).c_str(), form_name(r.format()).c_str(),
                static_cast<long long>(r.step()), s.mesh.to_string().c_str(), s.pipeline_stages);
    std::size_t total = 0;
    std::printf("%-32s %-5s %-18s %-22s %12s\n", "tensor", "dtype", "shape", "layout", "size");
    for (const auto& e : s.parameters) {
        const auto bytes = xshard::stored_bytes(e);
        std::printf("%-32s %-5s %-18s %-22s %12s%s\n", xshard::printable(e.name).c_str(),
                    e.dtype.c_str(), shape_text(e.shape).c_str(), e.lay.to_string().c_str(),
                    size_text(bytes).c_str(), e.trainable ? "" : "  (not trainable)");
        total = xshard::checked_add(total, bytes, "the checkpoint's size");
    }
    std::printf("%zu tensors, %s\n", s.parameters.size(), size_text(total).c_str());
    return 0;
}

int verify(const std::string& path) {
    const auto report = xshard::verify_checkpoint(path);
    for (const auto& d : report.damage)
        std::printf("%s\n", d.c_str());
    std::printf("%s: %zu tensor blocks in %zu file(s) checked, %zu damaged%s\n",
                xshard::printable(path).c_str(), report.checked, report.files,
                report.damage.size(),
                report.unchecked
                    ? (", " + std::to_string(report.unchecked) + " without a checksum").c_str()
                    : "");
    return report.damage.empty() ? 0 : 1;
}

int merge(const std::string& path, const std::string& out) {
    const checkpoint_reader source(path);
    const auto n = xshard::merge_checkpoint(path, out);
    std::printf("merged %zu tensors from %s (%s) into %s\n", n,
                xshard::printable(source.path()).c_str(), form_name(source.format()).c_str(),
                xshard::printable(out).c_str());
    return 0;
}

int reshard(const std::string& path, const std::string& strategy_path, const std::string& out) {
    const auto target = xshard::load_strategy_file(strategy_path);
    const checkpoint_reader source(path);
    const auto n = xshard::reshard_checkpoint(path, target, out, strategy_path);
    std::printf(
        "resharded %zu tensors from %s (%s, mesh(%s)) into %s: per-rank, mesh(%s), %d files\n", n,
        xshard::printable(source.path()).c_str(), form_name(source.format()).c_str(),
        source.strategy().mesh.to_string().c_str(), xshard::printable(out).c_str(),
        target.mesh.to_string().c_str(), target.mesh.size());
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
        "verify", "check everything a load needs, every CRC-32 (exit 1 if damaged)");
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
        std::fprintf(stderr, "xshard-ckpt: %s (see --help)\n", xshard::printable(e.what()).c_str());
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
        std::fprintf(stderr, "xshard-ckpt: %s\n", xshard::printable(what).c_str());
        return 2;
    }
}
