// Fuzz target for everything xshard reads from a checkpoint: the safetensors header parser,
// strategy files, the per-rank checkpoint.json, the CRC map, the checkpoint reader of both
// forms (with `verify_checkpoint` and reads of every stored tensor), the offline merge and
// reshard, and the block arithmetic of a mesh that a strategy file describes. Any bytes must
// give a consistent result or an io_error, never a crash, a hang or a huge allocation. Run
// for a bounded time by ctest (tests/io/CMakeLists.txt): always through fuzz_driver.cpp
// (io.fuzz; under the sanitizers in their run), and through clang's libFuzzer with
// -fsanitize=fuzzer,address,undefined where clang is installed (io.libfuzzer).
//
// The first byte picks what the rest is: 0 a safetensors file (parsed, then read through
// checkpoint_reader, its stored blocks read whole and checksummed as a one-pass load does,
// and verified), 1 a strategy file (and its block arithmetic), 2 a CRC map (per tensor and
// per stored block), 3 a per-rank directory (checkpoint.json, strategy.json and
// rank_0.safetensors, separated by "\n--\n"), 4 checksum runs as ranks exchange them
// (combine_runs).
#include <xshard/core/partition.hpp>
#include <xshard/io/format.hpp>
#include <xshard/io/offline.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

/// A directory of this process's own in the working directory, for the files the reader opens
/// and the tools write; removed at exit (the tests also remove what a fuzzer that ends
/// without running destructors leaves).
const std::string& scratch() {
    static const struct directory {
        std::string path = [] {
            std::string d = "xshard_fuzz.XXXXXX";
            if (!::mkdtemp(d.data()))
                std::abort();
            return d;
        }();
        ~directory() {
            std::error_code ec;
            std::filesystem::remove_all(path, ec);
        }
    } dir;
    return dir.path;
}

void write(const std::string& path, std::string_view bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

/// Reads every stored tensor that is small, and verifies the checkpoint.
void read_all(const std::string& path) {
    try {
        const xshard::checkpoint_reader r(path);
        xshard::verify_checkpoint(path);
        // The verification a load shares among ranks, in one process: pieces, their
        // checksums, and the damaged blocks they give.
        std::vector<const xshard::strategy_entry*> all;
        for (const auto& e : r.strategy().parameters)
            all.push_back(&e);
        std::vector<xshard::detail::crc_run> runs;
        std::vector<std::byte> buffer;
        for (const auto& p : r.pieces_to_verify(all, 4096))
            if (p.length <= (std::size_t(1) << 20))
                runs.push_back(r.checksum_of(p, buffer));
        (void)r.damaged(all, runs);
        for (const auto& e : r.strategy().parameters) {
            const auto bytes = xshard::stored_bytes(e);
            if (bytes > (std::size_t(1) << 20))
                continue;
            const std::vector<std::size_t> origin(e.shape.size(), 0);
            std::vector<std::byte> out(bytes), whole(bytes);
            r.read_box(e, origin, e.shape, out.data());
            // Each stored block read whole and checksummed as a one-pass load does, into the
            // tensor whole: the same bytes as read_box, the same CRC as verification.
            for (const auto& b : r.blocks(e)) {
                const auto crc = r.read_block(e, b, origin, e.shape, whole.data());
                if (crc != r.crc_of_block(e, b, buffer))
                    __builtin_trap(); // one pass and two passes disagree
            }
            if (whole != out)
                __builtin_trap(); // the blocks do not tile the tensor as read_box reads it
        }
    } catch (const xshard::error&) {
    }
    // The offline tools on it: a merge into one file, a reshard into its own strategy (on
    // meshes of up to 8 ranks: a file per rank).
    const auto out = scratch() + "/out";
    try {
        std::filesystem::remove_all(out);
        xshard::merge_checkpoint(path, out);
    } catch (const xshard::error&) {
    }
    try {
        std::filesystem::remove_all(out);
        const xshard::checkpoint_reader r(path);
        if (r.strategy().mesh.size() <= 8)
            xshard::reshard_checkpoint(path, r.strategy(), out);
    } catch (const xshard::error&) {
    }
}

/// Every block of every parameter, on a sample of ranks: inside the tensor, and the blocks
/// along each dimension tile it.
void check_blocks(const xshard::strategy_file& f) {
    const auto& mesh = f.mesh;
    const int stride = mesh.size() <= 64 ? 1 : mesh.size() / 64;
    for (const auto& e : f.parameters) {
        for (std::size_t d = 0; d < e.shape.size(); ++d) {
            const auto k = std::size_t(e.lay.split_count(d, mesh));
            std::size_t sum = 0;
            for (std::size_t b = 0; b < k && b < 4096; ++b) {
                if (xshard::block_offset(e.shape[d], k, b) != sum)
                    __builtin_trap();
                sum += xshard::block_extent(e.shape[d], k, b);
            }
            if (k <= 4096 && sum != e.shape[d])
                __builtin_trap();
        }
        for (int r = 0; r < mesh.size(); r += stride) {
            const auto c = mesh.coords(r);
            for (std::size_t d = 0; d < e.shape.size(); ++d) {
                const auto k = std::size_t(e.lay.split_count(d, mesh));
                const auto b = std::size_t(e.lay.block_index(d, mesh, c));
                if (b >= k || xshard::block_offset(e.shape[d], k, b) +
                                      xshard::block_extent(e.shape[d], k, b) >
                                  e.shape[d])
                    __builtin_trap();
            }
        }
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0)
        return 0;
    const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
    switch (data[0] % 5) {
    case 0:
        try {
            const auto h = xshard::parse_header(bytes, bytes.size());
            for (const auto& t : h.tensors)
                if (t.begin > t.end || t.end > bytes.size() - h.data_start ||
                    t.end - t.begin != t.elements() * xshard::dtype_size(t.dtype))
                    __builtin_trap(); // a header that does not fit the file got through
        } catch (const xshard::error&) {
        }
        write(scratch() + "/file.safetensors", bytes);
        read_all(scratch() + "/file.safetensors");
        break;
    case 1:
        try {
            check_blocks(xshard::strategy_file::from_json(bytes));
        } catch (const xshard::error&) {
        }
        break;
    case 2:
        try {
            const auto crcs = xshard::detail::parse_checksums(std::string(bytes));
            for (const auto& [name, crc] : crcs)
                if (crc.size() != 8)
                    __builtin_trap();
        } catch (const xshard::error&) {
        }
        try {
            const auto crcs = xshard::detail::parse_block_checksums(std::string(bytes));
            for (const auto& [name, crc] : crcs)
                if (crc.size() % 8 != 0)
                    __builtin_trap();
        } catch (const xshard::error&) {
        }
        break;
    case 4: {
        // Checksum runs as ranks send them (any tensor, offset, length), combined: a tensor
        // gets a checksum only when its runs tile it exactly once.
        std::vector<xshard::detail::crc_run> runs;
        std::vector<std::uint64_t> sizes{bytes.empty() ? 0u : std::uint64_t(std::uint8_t(bytes[0])),
                                         bytes.size() > 1 ? std::uint64_t(std::uint8_t(bytes[1])) : 0u};
        for (std::size_t at = 2; at + 3 <= bytes.size(); at += 3)
            runs.push_back({std::uint64_t(std::uint8_t(bytes[at])) % 3,
                            std::uint64_t(std::uint8_t(bytes[at + 1])),
                            std::uint64_t(std::uint8_t(bytes[at + 2])), 0});
        const auto crcs = xshard::detail::combine_runs(runs, sizes);
        for (std::size_t t = 0; t < sizes.size(); ++t) {
            if (!crcs[t])
                continue;
            std::vector<std::uint64_t> covered(std::size_t(sizes[t]), 0);
            for (const auto& r : runs) {
                if (r.tensor != t)
                    continue;
                for (std::uint64_t i = r.offset; i < r.offset + r.length; ++i) {
                    if (i >= sizes[t])
                        __builtin_trap(); // a run beyond the tensor was accepted
                    ++covered[std::size_t(i)];
                }
            }
            for (auto n : covered)
                if (n != 1)
                    __builtin_trap(); // a gap or an overlap was accepted
        }
        break;
    }
    default: {
        const std::string dir = scratch() + "/per_rank";
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
        const char* names[] = {"checkpoint.json", "strategy.json", "rank_0.safetensors"};
        std::size_t at = 0;
        for (int i = 0; i < 3; ++i) {
            const auto end = i < 2 ? bytes.find("\n--\n", at) : std::string_view::npos;
            write(dir + "/" + names[i], bytes.substr(at, end == std::string_view::npos ? end : end - at));
            if (end == std::string_view::npos)
                break;
            at = end + 4;
        }
        // The other ranks' files: copies of rank 0's (a checkpoint of up to 8 ranks opens).
        std::error_code ec; // (no rank file when the input has fewer parts)
        for (int r = 1; r < 8; ++r)
            std::filesystem::copy_file(dir + "/rank_0.safetensors",
                                       dir + "/rank_" + std::to_string(r) + ".safetensors",
                                       std::filesystem::copy_options::overwrite_existing, ec);
        read_all(dir);
        break;
    }
    }
    return 0;
}
