// Checkpoint save and load, integrated (one safetensors file, written and read with POSIX I/O,
// by the node's ranks together for column-split tensors) and per-rank (a file per rank), of
// a model of 64 float weights of 8 MiB (half split by columns over mp, half by rows) and 8
// small replicated biases: 512 MiB in all. The baseline is each rank
// writing its shard with plain POSIX I/O to a file of its own (open, pwrite per parameter,
// fsync, close: the saves fsync too, and check what they wrote), or, for loads, reading it
// back (pread) and computing its CRC-32 (posix_io_crc: loads verify every byte they read), in
// the same directory.
// Loads read what was just written, so from the page cache. 2 ranks:
//
//   mpirun -n 2 build/benchmarks/bench_checkpoint [--dir D]
//
// The files go to a new directory under /tmp (or under D), removed at the end. After each
// case's JSON line comes a "<case>.memory" line with, per rank, the shard bytes, the resident
// set before one more call of the case and its peak during that call (VmRSS, VmHWM: the peak is
// reset first, and freed heap memory returned with malloc_trim, so the growth is that call's
// own), and the same growth for one call of the baseline.

#include "harness.hpp"

#include <xshard/core.hpp>
#include <xshard/io.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <fcntl.h>
#include <libdeflate.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

namespace bench = xshard::bench;
using mesh_t = xshard::mesh<"dp", "mp">;
using model_t =
    std::tuple<std::vector<xshard::parameter<xshard::dtensor<float, mesh_t, "[-, mp]">>>,
               std::vector<xshard::parameter<xshard::dtensor<float, mesh_t, "[mp, -]">>>,
               std::vector<xshard::parameter<xshard::dtensor<float, mesh_t, "[-]">>>>;

/// `weights` weights of rows x cols (alternately split by columns and by rows) and 8 biases of
/// cols.
model_t make_model(const mesh_t& m, std::size_t weights, std::size_t rows, std::size_t cols) {
    model_t model;
    for (std::size_t i = 0; i < weights; ++i) {
        const std::string name = "w" + std::to_string(i);
        if (i % 2 == 0)
            std::get<0>(model).push_back(
                {name, xshard::full<float, "[-, mp]">(m, {rows, cols}, float(i))});
        else
            std::get<1>(model).push_back(
                {name, xshard::full<float, "[mp, -]">(m, {rows, cols}, float(i))});
    }
    for (std::size_t i = 0; i < 8; ++i)
        std::get<2>(model).push_back(
            {"b" + std::to_string(i), xshard::full<float, "[-]">(m, {cols}, float(i))});
    return model;
}

void check(bool ok, const char* what, const std::string& path) {
    if (ok)
        return;
    std::perror((what + (" " + path)).c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/// Calls `f(pointer, bytes)` for the local shard of every parameter of `model`.
template <class F>
void for_each_shard(model_t& model, F&& f) {
    xshard::for_each_parameter(model, [&](const std::string&, auto& t) {
        f(t.local().data(), t.local().size() * sizeof(float));
    });
}

/// The baseline save: the shards one after the other in a file of this rank's own.
void posix_save(const std::string& path, model_t& model) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    check(fd >= 0, "open", path);
    off_t at = 0;
    for_each_shard(model, [&](const float* data, std::size_t n) {
        for (auto* p = reinterpret_cast<const char*>(data); n > 0;) {
            const auto put = ::pwrite(fd, p, n, at);
            check(put > 0, "pwrite", path);
            p += put;
            n -= std::size_t(put);
            at += put;
        }
    });
    check(::fsync(fd) == 0, "fsync", path);
    check(::close(fd) == 0, "close", path);
}

/// The baseline load: the shards back from the file of posix_save.
void posix_load(const std::string& path, model_t& model) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    check(fd >= 0, "open", path);
    off_t at = 0;
    for_each_shard(model, [&](float* data, std::size_t n) {
        for (auto* p = reinterpret_cast<char*>(data); n > 0;) {
            const auto got = ::pread(fd, p, n, at);
            check(got > 0, "pread", path);
            p += got;
            n -= std::size_t(got);
            at += got;
        }
    });
    check(::close(fd) == 0, "close", path);
}

/// The baseline of a verified load: the shards back from the file of posix_save, each
/// checksummed (CRC-32, libdeflate) as it is read, what a load that verifies what it reads
/// must do at least.
std::uint32_t posix_load_crc(const std::string& path, model_t& model) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    check(fd >= 0, "open", path);
    off_t at = 0;
    std::uint32_t crc = 0;
    for_each_shard(model, [&](float* data, std::size_t n) {
        std::uint32_t one = 0;
        for (auto* p = reinterpret_cast<char*>(data); n > 0;) {
            const auto got = ::pread(fd, p, n, at);
            check(got > 0, "pread", path);
            one = std::uint32_t(::libdeflate_crc32(one, p, std::size_t(got)));
            p += got;
            n -= std::size_t(got);
            at += got;
        }
        crc ^= one;
    });
    check(::close(fd) == 0, "close", path);
    return crc;
}

/// A field of /proc/self/status ("VmRSS", "VmHWM"), in bytes.
std::size_t status_bytes(const std::string& field) {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
        if (line.starts_with(field + ":"))
            return std::stoul(line.substr(field.size() + 1)) * 1024;
    return 0;
}

struct memory {
    std::size_t before, peak; ///< resident bytes before a call, and at most during it
};

/// This process's resident set before one call of `f` and its peak during the call.
template <class F>
memory measure(F&& f) {
    ::malloc_trim(0);
    std::ofstream("/proc/self/clear_refs") << "5"; // VmHWM := VmRSS (Linux 4.0 and later)
    const std::size_t before = status_bytes("VmRSS");
    f();
    return {before, status_bytes("VmHWM")};
}

/// A string of rank 0, on every rank of `c`.
std::string broadcast(const xshard::communicator& c, std::string s) {
    unsigned long long n = s.size();
    xshard::mpi::bcast(c, std::span(&n, 1), 0);
    s.resize(std::size_t(n));
    xshard::mpi::bcast(c, std::span(s.data(), s.size()), 0);
    return s;
}

/// A JSON array of `value` from every rank of `c` (on rank 0; empty elsewhere).
std::string per_rank(const xshard::communicator& c, std::size_t value) {
    std::vector<unsigned long long> all(std::size_t(c.size()));
    const unsigned long long mine = value;
    xshard::mpi::gather(c, std::span(&mine, 1), c.rank() == 0 ? std::span(all) : std::span(all).first(0),
                   0);
    std::string out = "[";
    for (std::size_t r = 0; r < all.size(); ++r)
        out += (r ? ", " : "") + std::to_string(all[r]);
    return out + "]";
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    std::string dir;
    std::vector<char*> args{argv[0]};
    for (int i = 1; i < argc; ++i) {
        if (std::string_view(argv[i]) == "--dir" && i + 1 < argc)
            dir = argv[++i];
        else
            args.push_back(argv[i]);
    }
    const auto o = bench::options::parse(int(args.size()), args.data());
    const mesh_t m({1, xshard::auto_size});
    const auto& c = m.comm();

    if (c.rank() == 0) {
        std::string base = (dir.empty() ? "/tmp" : dir) + "/bench_checkpoint.XXXXXX";
        check(::mkdtemp(base.data()) != nullptr, "mkdtemp", base);
        dir = base;
    }
    dir = broadcast(c, dir);
    if (c.rank() == 0)
        std::fprintf(stderr, "bench_checkpoint: files in %s\n", dir.c_str());

    // Weights of 1024 x 2048 floats (8 MiB), or of 128 x 256 (128 KiB) with --quick.
    const std::size_t rows = o.quick ? 128 : 1024, cols = o.quick ? 256 : 2048;
    auto model = make_model(m, 64, rows, cols);
    const std::string size = o.quick ? "8MiB" : "512MiB";
    std::size_t total = 0, shard = 0;
    xshard::for_each_parameter(model, [&](const std::string&, auto& t) {
        total += t.size() * sizeof(float);
        shard += t.local().size() * sizeof(float);
    });
    const std::string posix_file = dir + "/posix_rank_" + std::to_string(c.rank()) + ".bin";

    for (const auto format :
         {xshard::checkpoint_format::integrated, xshard::checkpoint_format::per_rank}) {
        const std::string form =
            format == xshard::checkpoint_format::integrated ? "integrated" : "per_rank";
        const std::string path =
            dir +
            (format == xshard::checkpoint_format::integrated ? "/model.safetensors" : "/model");
        const xshard::checkpoint_options options{.format = format};
        for (const bool saving : {true, false}) {
            const std::string name = (saving ? "save_" : "load_") + form + "_" + size;
            if (!o.wants(name))
                continue;
            auto ours = [&] {
                if (saving)
                    xshard::save_checkpoint(path, model, options);
                else
                    (void)xshard::load_checkpoint(path, model);
            };
            volatile std::uint32_t sink = 0;
            auto theirs = [&] {
                if (saving)
                    posix_save(posix_file, model);
                else
                    sink = sink + posix_load_crc(posix_file, model);
            };
            if (!saving) { // something to load
                xshard::save_checkpoint(path, model, options);
                posix_save(posix_file, model);
            }
            bench::report(c, name, total, saving ? "posix_io" : "posix_io_crc",
                          bench::compare(c, o, ours, theirs));

            const auto mine = measure(ours), base = measure(theirs);
            const auto shards = per_rank(c, shard), rss = per_rank(c, mine.before),
                       peaks = per_rank(c, mine.peak),
                       growths = per_rank(c, mine.peak - mine.before),
                       base_growths = per_rank(c, base.peak - base.before);
            if (c.rank() == 0) {
                std::printf("{\"name\": \"%s.memory\", \"ranks\": %d, \"shard_bytes\": %s, "
                            "\"rss_before_bytes\": %s, \"peak_rss_bytes\": %s, "
                            "\"peak_growth_bytes\": %s, \"baseline_peak_growth_bytes\": %s}\n",
                            name.c_str(), c.size(), shards.c_str(), rss.c_str(), peaks.c_str(),
                            growths.c_str(), base_growths.c_str());
                std::fflush(stdout);
            }
        }
    }

    xshard::mpi::barrier(c);
    if (c.rank() == 0)
        std::filesystem::remove_all(dir);
    return 0;
}
